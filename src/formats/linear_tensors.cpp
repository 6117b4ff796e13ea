#include "formats/linear_tensors.h"

#include <cmath>
#include <string>

#include "formats/nvfp4.h"
#include "formats/safetensors.h"

namespace tetra {
namespace {

std::string where(const Checkpoint& ckpt, const std::string& name) {
  return str_cat(ckpt.file_of(name).string(), ": tensor ", name);
}

// The tensor `name`, required to have this dtype and shape.
TensorView get_checked(const Checkpoint& ckpt, const std::string& name, DType dtype,
                       const Shape& shape) {
  const TensorInfo* info = ckpt.find(name);
  TETRA_CHECK(info, ckpt.dir().string(), ": tensor ", name, " is missing");
  TETRA_CHECK(info->dtype == dtype, where(ckpt, name), " is ", dtype_name(info->dtype),
              ", expected ", dtype_name(dtype));
  TETRA_CHECK(info->shape == shape, where(ckpt, name), " has shape ", info->shape.str(),
              ", expected ", shape.str());
  return ckpt.get(name);
}

// An F32 scale stored as a 0-rank scalar (ModelOpt squeezes them) or as shape [1].
float get_scalar(const Checkpoint& ckpt, const std::string& name, bool positive) {
  const TensorInfo* info = ckpt.find(name);
  TETRA_CHECK(info, ckpt.dir().string(), ": tensor ", name, " is missing");
  TETRA_CHECK(info->dtype == DType::F32, where(ckpt, name), " is ", dtype_name(info->dtype),
              ", expected F32");
  TETRA_CHECK(info->shape.numel() == 1 && info->shape.rank <= 1, where(ckpt, name),
              " has shape ", info->shape.str(), ", expected a scalar");
  const float v = *ckpt.get(name).as<const float>();
  TETRA_CHECK(std::isfinite(v) && (positive ? v > 0.0f : v >= 0.0f), where(ckpt, name),
              " is ", v, ", not a ", positive ? "positive" : "non-negative", " finite scale");
  return v;
}

}  // namespace

LinearTensors load_linear(const Checkpoint& ckpt, const QuantConfig* quant,
                          std::string_view module, int64_t n_out, int64_t n_in) {
  const std::string m(module);
  const ModuleQuant mq = quant ? quant->module_quant(module) : ModuleQuant{};
  LinearTensors w;
  w.algo = mq.algo;
  w.n_out = n_out;
  w.n_in = n_in;
  const std::string wname = m + ".weight";
  switch (mq.algo) {
    case QuantAlgo::None: {
      const TensorInfo* info = ckpt.find(wname);
      TETRA_CHECK(info, ckpt.dir().string(), ": tensor ", wname, " is missing");
      TETRA_CHECK(info->dtype == DType::BF16 || info->dtype == DType::F16 ||
                      info->dtype == DType::F32,
                  where(ckpt, wname), " is ", dtype_name(info->dtype),
                  ", but the quantization config leaves ", m,
                  " unquantized, so BF16, F16 or F32 was expected");
      w.weight = get_checked(ckpt, wname, info->dtype, Shape{n_out, n_in});
      break;
    }
    case QuantAlgo::Nvfp4:
    case QuantAlgo::W4a16Nvfp4: {
      TETRA_CHECK(n_in % nvfp4::kBlockSize == 0, where(ckpt, wname), ": NVFP4 needs n_in (",
                  n_in, ") to be a multiple of ", nvfp4::kBlockSize);
      w.weight = get_checked(ckpt, wname, DType::U8, Shape{n_out, n_in / 2});
      w.block_scale = get_checked(ckpt, m + ".weight_scale", DType::F8_E4M3,
                                  Shape{n_out, n_in / nvfp4::kBlockSize});
      // 0 only for an all-zero weight (tetra quantize writes it so instead of ModelOpt's NaN).
      w.global_scale = get_scalar(ckpt, m + ".weight_scale_2", /*positive=*/false);
      if (mq.algo == QuantAlgo::Nvfp4)
        w.input_scale = get_scalar(ckpt, m + ".input_scale", /*positive=*/true);
      break;
    }
    case QuantAlgo::Fp8: {
      w.weight = get_checked(ckpt, wname, DType::F8_E4M3, Shape{n_out, n_in});
      w.global_scale = get_scalar(ckpt, m + ".weight_scale", /*positive=*/true);
      if (ckpt.has(m + ".input_scale"))
        w.input_scale = get_scalar(ckpt, m + ".input_scale", /*positive=*/true);
      break;
    }
  }
  const std::string bname = m + ".bias";
  if (const TensorInfo* b = ckpt.find(bname)) {
    TETRA_CHECK(b->dtype == DType::BF16 || b->dtype == DType::F16 || b->dtype == DType::F32,
                where(ckpt, bname), " is ", dtype_name(b->dtype), ", expected BF16, F16 or F32");
    w.bias = get_checked(ckpt, bname, b->dtype, Shape{n_out});
  }
  return w;
}

void linear_row_to_f32(const LinearTensors& w, int64_t row, float* out) {
  TETRA_CHECK(0 <= row && row < w.n_out, "row ", row, " is outside a linear of ", w.n_out,
              " outputs");
  switch (w.algo) {
    case QuantAlgo::None:
      nvfp4::row_to_f32(w.weight, row, out);
      return;
    case QuantAlgo::Nvfp4:
    case QuantAlgo::W4a16Nvfp4:
      nvfp4::dequantize_row(w.weight.as<const uint8_t>() + row * w.n_in / 2,
                            w.block_scale.as<const uint8_t>() + row * w.n_in / nvfp4::kBlockSize,
                            w.global_scale, w.n_in, out);
      return;
    case QuantAlgo::Fp8: {
      const uint8_t* p = w.weight.as<const uint8_t>() + row * w.n_in;
      for (int64_t i = 0; i < w.n_in; ++i) out[i] = e4m3_to_f32(p[i]) * w.global_scale;
      return;
    }
  }
}

}  // namespace tetra

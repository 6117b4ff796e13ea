// Packing routed experts into the device layout of the MoE kernels (moe_internal.h).
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/nvfp4_tile.h"
#include "ops/cuda/nvfp4_word.h"

namespace tetra::ops::cuda {

CudaMoeExperts::CudaMoeExperts(const MoeShape& s, WeightFormat f, MoeTuner* t,
                               std::optional<WeightFormat> down)
    : shape(s), format(f), down_format(down.value_or(f)), tuner(t) {
  for (WeightFormat x : {format, down_format})
    TETRA_CHECK(x == WeightFormat::Nvfp4 || x == WeightFormat::Dense, "moe: experts must be NVFP4 or BF16");
  TETRA_CHECK(s.hidden > 0 && s.intermediate > 0 && s.n_experts > 0, "moe: empty expert shape");
  // NVFP4 rows are read in 32-bit words of 8 values with a scale per 16: widths of 16s.
  TETRA_CHECK(f != WeightFormat::Nvfp4 || s.hidden % 16 == 0, "moe: NVFP4 gate/up weights need a hidden size ",
              "that is a multiple of 16, not ", s.hidden);
  TETRA_CHECK(down_format != WeightFormat::Nvfp4 || s.intermediate % 16 == 0, "moe: NVFP4 down weights need an ",
              "intermediate size that is a multiple of 16, not ", s.intermediate);
  // The GEMM kernels walk K in chunks of 128 and N in blocks of 64 (gate/up) and 128 (down).
  fast = s.hidden % 128 == 0 && s.intermediate % 128 == 0 && format == down_format;
  const int64_t n = n_stored();
  w13 = device_alloc(n * w13_expert_bytes(), "the experts' gate/up weights");
  w2 = device_alloc(n * w2_expert_bytes(), "the experts' down weights");
  if (format == WeightFormat::Nvfp4)
    w13_scale = static_cast<uint8_t*>(device_alloc(n * w13_scale_expert_bytes(), "the experts' scales"));
  if (down_format == WeightFormat::Nvfp4)
    w2_scale = static_cast<uint8_t*>(device_alloc(n * w2_scale_expert_bytes(), "the experts' scales"));
  global_scale = static_cast<float*>(device_alloc(n * 3 * int64_t(sizeof(float)), "the experts' scales"));
  if (fast && format == WeightFormat::Nvfp4) {
    const int64_t ints = 2 + 2 * int64_t(kMoeDecodeMaxItems) + kMoeDecodeMaxTokens * (s.hidden / 32);
    auto* ctl = static_cast<int*>(device_alloc(ints * int64_t(sizeof(int)), "the fused decode kernel's counters"));
    // cudaMemset runs on the legacy stream, unordered with the backend's non-blocking one:
    // wait for it here, once, so no launch can see the counters before they are zero.
    TETRA_CUDA_CHECK(cudaMemset(ctl, 0, size_t(ints) * sizeof(int)));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    decode_ctl = MoeDecodeControl{ctl, ctl + 1, ctl + 2, ctl + 2 + kMoeDecodeMaxItems, ctl + 2 + 2 * kMoeDecodeMaxItems};
  }
}

CudaMoeExperts::~CudaMoeExperts() {
  // Errors are ignored here: a destructor must not throw, and the memory is gone either way.
  cudaFree(w13);
  cudaFree(w2);
  cudaFree(w13_scale);
  cudaFree(w2_scale);
  cudaFree(global_scale);
  cudaFree(decode_ctl.next_unit);
}

int64_t CudaMoeExperts::w13_expert_bytes() const {
  const int64_t n = 2 * shape.intermediate * shape.hidden;
  return format == WeightFormat::Nvfp4 ? n / 2 : n * 2;
}
int64_t CudaMoeExperts::w2_expert_bytes() const {
  const int64_t n = shape.hidden * shape.intermediate;
  return down_format == WeightFormat::Nvfp4 ? n / 2 : n * 2;
}
int64_t CudaMoeExperts::w13_scale_expert_bytes() const {
  return format == WeightFormat::Nvfp4 ? 2 * shape.intermediate * shape.hidden / 16 : 0;
}
int64_t CudaMoeExperts::w2_scale_expert_bytes() const {
  return down_format == WeightFormat::Nvfp4 ? shape.hidden * shape.intermediate / 16 : 0;
}

const MoeShape& experts_shape(const MoeExperts& experts) {
  return dynamic_cast<const CudaMoeExperts&>(experts).shape;
}

WeightFormat experts_format(const MoeExperts& experts) {
  return dynamic_cast<const CudaMoeExperts&>(experts).format;
}

int64_t experts_bytes_per_expert(const MoeExperts& experts) {
  const auto& ex = dynamic_cast<const CudaMoeExperts&>(experts);
  return ex.w13_expert_bytes() + ex.w2_expert_bytes() + ex.w13_scale_expert_bytes() +
         ex.w2_scale_expert_bytes();
}

namespace {

void check_linear(const LinearWeight& w, WeightFormat format, int64_t n_out, int64_t n_in,
                  const char* what) {
  TETRA_CHECK(w.format == format, "moe: every expert matrix must have the same format (", what, ")");
  TETRA_CHECK(w.n_out == n_out && w.n_in == n_in, "moe: expert ", what, " is [", w.n_out, ", ",
              w.n_in, "], expected [", n_out, ", ", n_in, "]");
  TETRA_CHECK(w.bias.empty(), "moe: expert biases are not supported on CUDA");
  TETRA_CHECK(w.weight.device == Device::Cpu && (w.block_scale.empty() || w.block_scale.device == Device::Cpu),
              "moe: experts are prepared from host memory (the checkpoint's mapping)");
  if (format == WeightFormat::Nvfp4) {
    TETRA_CHECK(w.weight.dtype == DType::U8 && w.weight.numel() == n_out * n_in / 2,
                "moe: NVFP4 ", what, " weight must be U8 [n_out, n_in/2]");
    TETRA_CHECK(w.block_scale.dtype == DType::F8_E4M3 && w.block_scale.numel() == n_out * n_in / 16,
                "moe: NVFP4 ", what, " block scales must be F8_E4M3 [n_out, n_in/16]");
  } else {
    TETRA_CHECK((w.weight.dtype == DType::BF16 || w.weight.dtype == DType::F32) &&
                    w.weight.numel() == n_out * n_in,
                "moe: dense ", what, " weight must be BF16 or F32 [n_out, n_in]");
  }
}

// Writes an NVFP4 matrix into its region of a packed array: its words in device order, row r
// as row row_at(r) of a matrix n_in wide, tiled (nvfp4_tile.h) or row-major.
template <typename RowAt>
void put_nvfp4(std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, int64_t codes_at, int64_t scales_at,
               const LinearWeight& w, bool tiled, RowAt row_at) {
  const auto* src = w.weight.as<const uint8_t>();
  const auto* src_scale = w.block_scale.as<const uint8_t>();
  const int64_t row_bytes = w.n_in / 2, groups = w.n_in / 16;
  for (int64_t r = 0; r < w.n_out; ++r) {
    const int64_t row = row_at(r);
    for (int64_t b = 0; b < row_bytes; b += 4) {
      uint32_t word;
      std::memcpy(&word, src + r * row_bytes + b, 4);
      word = nvfp4_device_word(word);
      const int64_t to = tiled ? nvfp4_tiled_code_offset(row, b, w.n_in) : row * row_bytes + b;
      std::memcpy(codes.data() + codes_at + to, &word, 4);
    }
    for (int64_t j = 0; j < groups; ++j)
      scales[size_t(scales_at + (tiled ? nvfp4_tiled_scale_offset(row, j, w.n_in) : row * groups + j))] =
          src_scale[r * groups + j];
  }
}

// Appends a dense matrix as BF16.
void append_dense(std::vector<uint8_t>& dst, const LinearWeight& w) {
  const auto* src = w.weight.as<const uint8_t>();
  const size_t n_bytes = size_t(w.weight.nbytes());
  if (w.weight.dtype == DType::BF16) {
    dst.insert(dst.end(), src, src + n_bytes);
  } else {
    const size_t at = dst.size(), n = n_bytes / 4;
    dst.resize(at + 2 * n);
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, src + 4 * i, 4);
      const uint16_t b = f32_to_bf16(f);
      std::memcpy(dst.data() + at + 2 * i, &b, 2);
    }
  }
}

// Host bytes to the device: through the uploader's pinned ring, or a plain stream-ordered copy.
void put(cudaStream_t stream, Uploader* uploader, void* dst, const std::vector<uint8_t>& src) {
  if (uploader)
    uploader->copy(dst, src.data(), int64_t(src.size()));
  else
    copy_and_wait(stream, dst, src.data(), src.size(), cudaMemcpyHostToDevice);
}

}  // namespace

std::unique_ptr<MoeExperts> prepare_experts(const Context& ctx, const std::vector<MlpWeights>& experts,
                                            const MlpWeights* shared, MoeTuner* tuner, Uploader* uploader) {
  TETRA_CHECK(!experts.empty(), "moe: no experts to prepare");
  const LinearWeight& g0 = experts[0].gate;
  MoeShape shape{g0.n_in, g0.n_out, int(experts.size()), shared != nullptr};
  const WeightFormat format = g0.format, down_format = experts[0].down.format;
  auto ex = std::make_unique<CudaMoeExperts>(shape, format, tuner, down_format);
  auto stream = static_cast<cudaStream_t>(ctx.stream);

  std::vector<const MlpWeights*> all;
  for (const MlpWeights& m : experts) all.push_back(&m);
  if (shared) all.push_back(shared);
  // A layer's arrays are packed on the host in one pass over the mapping and uploaded whole:
  // a few large queued copies instead of thousands of small synchronous ones.
  std::vector<uint8_t> w13, w2, s13, s2;
  std::vector<float> gscale;
  for (const MlpWeights* m : all) {
    check_linear(m->gate, format, shape.intermediate, shape.hidden, "gate");
    check_linear(m->up, format, shape.intermediate, shape.hidden, "up");
    check_linear(m->down, down_format, shape.hidden, shape.intermediate, "down");
    const bool fp4 = format == WeightFormat::Nvfp4, fp4_down = down_format == WeightFormat::Nvfp4;
    const bool tiled = ex->tiled();
    const int64_t I = shape.intermediate;
    if (fp4) {
      const int64_t at = int64_t(w13.size()), s_at = int64_t(s13.size());
      w13.resize(w13.size() + size_t(ex->w13_expert_bytes()));
      s13.resize(s13.size() + size_t(ex->w13_scale_expert_bytes()));
      put_nvfp4(w13, s13, at, s_at, m->gate, tiled, [&](int64_t r) { return tiled ? nvfp4_gate_up_row(r, false) : r; });
      put_nvfp4(w13, s13, at, s_at, m->up, tiled, [&](int64_t r) { return tiled ? nvfp4_gate_up_row(r, true) : I + r; });
    } else {
      append_dense(w13, m->gate);
      append_dense(w13, m->up);
    }
    if (fp4_down) {
      const int64_t at = int64_t(w2.size()), s_at = int64_t(s2.size());
      w2.resize(w2.size() + size_t(ex->w2_expert_bytes()));
      s2.resize(s2.size() + size_t(ex->w2_scale_expert_bytes()));
      put_nvfp4(w2, s2, at, s_at, m->down, tiled, [](int64_t r) { return r; });
    } else {
      append_dense(w2, m->down);
    }
    gscale.insert(gscale.end(), {fp4 ? m->gate.global_scale : 1.0f, fp4 ? m->up.global_scale : 1.0f,
                                 fp4_down ? m->down.global_scale : 1.0f});
  }
  put(stream, uploader, ex->w13, w13);
  put(stream, uploader, ex->w2, w2);
  if (format == WeightFormat::Nvfp4) put(stream, uploader, ex->w13_scale, s13);
  if (down_format == WeightFormat::Nvfp4) put(stream, uploader, ex->w2_scale, s2);
  const auto* g = reinterpret_cast<const uint8_t*>(gscale.data());
  put(stream, uploader, ex->global_scale, std::vector<uint8_t>(g, g + gscale.size() * sizeof(float)));
  return ex;
}

std::unique_ptr<MoeExperts> random_experts(const Context& ctx, const MoeShape& shape,
                                           WeightFormat format, uint64_t seed, MoeTuner* tuner,
                                           std::optional<WeightFormat> down_format) {
  auto ex = std::make_unique<CudaMoeExperts>(shape, format, tuner, down_format);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  launch_fill_dummy_experts(stream, *ex, seed);
  std::vector<float> gscale;
  for (int e = 0; e < ex->n_stored(); ++e)
    for (WeightFormat f : {ex->format, ex->format, ex->down_format})
      gscale.push_back(f == WeightFormat::Nvfp4 ? kDummyNvfp4GlobalScale : 1.0f);
  copy_and_wait(stream, ex->global_scale, gscale.data(), gscale.size() * sizeof(float), cudaMemcpyHostToDevice);
  return ex;
}

}  // namespace tetra::ops::cuda

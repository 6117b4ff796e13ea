#include "model/weights.h"

namespace tetra::model {

WeightLoader::WeightLoader(const Checkpoint& checkpoint, ops::Backend& backend,
                           const LoadOptions& options)
    : checkpoint_(checkpoint), backend_(backend), options_(options) {}

void WeightLoader::count(const TensorView& t) {
  stats_.tensors += 1;
  stats_.bytes += t.nbytes();
  if (options_.on_progress) options_.on_progress(stats_);
}

TensorView WeightLoader::take(const std::string& name, DType dtype, Shape shape) {
  TensorView t = checkpoint_.get(name, dtype, shape);
  count(t);
  return backend_.upload(t);
}

TensorView WeightLoader::floats(const std::string& name, Shape shape) {
  const TensorInfo* info = checkpoint_.find(name);
  if (!info) checkpoint_.get(name);  // throws: names the folder and the tensor
  const DType dt = info->dtype;
  if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)
    fail(checkpoint_.file_of(name).string(), ": tensor ", name, " is ", dtype_name(dt),
         ", expected BF16, F16 or F32");
  return take(name, dt, shape);
}

ops::LinearWeight WeightLoader::linear(const std::string& module, int64_t n_out, int64_t n_in,
                                       bool with_bias) {
  const std::string wname = module + ".weight";
  const TensorInfo* info = checkpoint_.find(wname);
  if (!info) checkpoint_.get(wname);  // throws: names the folder and the tensor
  ops::LinearWeight w;
  w.n_out = n_out;
  w.n_in = n_in;
  if (info->dtype == DType::U8) {
    // NVFP4 (ModelOpt): 2 e2m1 codes per byte along n_in, one E4M3 scale per 16 inputs.
    TETRA_CHECK(n_in % 16 == 0, module, ": NVFP4 needs an input width divisible by 16, got ", n_in);
    w.format = ops::WeightFormat::Nvfp4;
    w.weight = take(wname, DType::U8, {n_out, n_in / 2});
    w.block_scale = take(module + ".weight_scale", DType::F8_E4M3, {n_out, n_in / 16});
    TensorView s2 = checkpoint_.get(module + ".weight_scale_2", DType::F32, Shape{});
    count(s2);
    w.global_scale = *s2.as<const float>();
    if (checkpoint_.has(module + ".input_scale")) {
      TensorView is = checkpoint_.get(module + ".input_scale", DType::F32, Shape{});
      count(is);
      w.input_scale = *is.as<const float>();
    }
  } else if (info->dtype == DType::F8_E4M3) {
    w.format = ops::WeightFormat::Fp8;
    w.weight = take(wname, DType::F8_E4M3, {n_out, n_in});
    TensorView s = checkpoint_.get(module + ".weight_scale", DType::F32, Shape{});
    count(s);
    w.global_scale = *s.as<const float>();
  } else {
    w.weight = floats(wname, {n_out, n_in});
  }
  if (with_bias) w.bias = floats(module + ".bias", {n_out});
  return w;
}

ops::MlpWeights WeightLoader::mlp(const std::string& prefix, const char* gate, const char* up,
                                  const char* down, int64_t hidden, int64_t inter) {
  ops::MlpWeights m;
  m.gate = linear(prefix + gate, inter, hidden, false);
  m.up = linear(prefix + up, inter, hidden, false);
  m.down = linear(prefix + down, hidden, inter, false);
  return m;
}

}  // namespace tetra::model

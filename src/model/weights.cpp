#include "model/weights.h"

#include "formats/linear_tensors.h"

namespace tetra::model {

WeightLoader::WeightLoader(const Checkpoint& checkpoint, ops::Backend& backend,
                           const LoadOptions& options)
    : checkpoint_(checkpoint), quant_(load_quant_config(checkpoint.dir())), backend_(backend),
      options_(options) {}

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
  const LinearTensors t = load_linear(checkpoint_, quant_ ? &*quant_ : nullptr, module, n_out, n_in);
  if (with_bias && t.bias.empty())
    fail(checkpoint_.file_of(module + ".weight").string(), ": ", module,
         " needs a bias (the config says attention_bias) but ", module, ".bias is missing");
  ops::LinearWeight w;
  w.n_out = n_out;
  w.n_in = n_in;
  switch (t.algo) {
    case QuantAlgo::Nvfp4:
    case QuantAlgo::W4a16Nvfp4: w.format = ops::WeightFormat::Nvfp4; break;
    case QuantAlgo::Fp8: w.format = ops::WeightFormat::Fp8; break;
    default: w.format = ops::WeightFormat::Dense; break;
  }
  count(t.weight);
  w.weight = backend_.upload(t.weight);
  if (!t.block_scale.empty()) {
    count(t.block_scale);
    w.block_scale = backend_.upload(t.block_scale);
  }
  w.global_scale = t.global_scale;
  w.input_scale = t.input_scale;
  if (with_bias) {
    count(t.bias);
    w.bias = backend_.upload(t.bias);
  }
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

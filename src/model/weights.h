// Reads a model's tensors from its checkpoint with the checks the config implies, and hands
// them to the backend. Knows checkpoint naming conventions, not any one family's layout.
#pragma once

#include <string>

#include <optional>

#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"

namespace tetra::model {

class WeightLoader {
 public:
  WeightLoader(const Checkpoint& checkpoint, ops::Backend& backend, const LoadOptions& options);

  bool has(const std::string& name) const { return checkpoint_.has(name); }
  // A linear layer `<module>.weight` [n_out, n_in] in the format the checkpoint's quant
  // config gives the module: BF16/F16/F32, NVFP4 (U8 codes + weight_scale + weight_scale_2)
  // or FP8 per-tensor; `<module>.bias` [n_out] required when with_bias.
  ops::LinearWeight linear(const std::string& module, int64_t n_out, int64_t n_in, bool with_bias);
  // A float tensor (BF16/F16/F32) of exactly this shape.
  TensorView floats(const std::string& name, Shape shape);
  // The same, F32 only (router biases are kept in fp32).
  ops::MlpWeights mlp(const std::string& prefix, const char* gate, const char* up, const char* down,
                      int64_t hidden, int64_t inter);

  const LoadStats& stats() const { return stats_; }

 private:
  TensorView take(const std::string& name, DType dtype, Shape shape);
  void count(const TensorView& t);

  const Checkpoint& checkpoint_;
  std::optional<QuantConfig> quant_;  // nullopt: a BF16 checkpoint
  ops::Backend& backend_;
  const LoadOptions& options_;
  LoadStats stats_;
};

}  // namespace tetra::model

// Reads a model's tensors from its checkpoint with the checks the config implies, and hands
// them to the backend; or, for --load-format dummy, draws them at random in the shapes and
// formats the config implies. Knows checkpoint naming conventions, not any one family's layout.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"

namespace tetra::model {

// The layer index i of a "model.layers.<i>.<...>" tensor (MTP layers come after the last
// decoder layer); -1 for every other tensor.
int64_t tensor_layer(const std::string& name);

// Bytes of one expert's three matrices ([inter, hidden] gate and up, [hidden, inter] down):
// NVFP4 costs 9/16 of a byte a weight (4-bit codes and an E4M3 scale per 16), BF16 two.
int64_t expert_bytes(ops::WeightFormat format, int64_t hidden, int64_t inter);

// A rank's part of a linear layer under tensor parallelism: a block of its output rows
// (column-parallel: q/k/v, gate/up) or of its input columns (row-parallel: o_proj, down_proj,
// whose outputs the ranks sum, so only one of them keeps the bias).
struct LinearSlice {
  enum Kind : uint8_t { Whole, Rows, Columns } kind = Whole;
  parallel::Range range;
  bool keep_bias = true;  // Columns only

  static LinearSlice rows(parallel::Range r) { return {Rows, r, true}; }
  static LinearSlice columns(parallel::Range r, bool keep_bias) { return {Columns, r, keep_bias}; }
};

// Which routed experts a rank holds and how much of each (parallel::RankShard).
struct ExpertsShard {
  parallel::Part ids;     // experts by id: E / parts each
  parallel::Part width;   // each routed expert's intermediate width
  parallel::Part shared;  // the shared expert's width
};

class WeightLoader {
 public:
  // checkpoint null: dummy weights (the folder's quant config still says which modules are
  // NVFP4).
  WeightLoader(const Checkpoint* checkpoint, const std::filesystem::path& dir, ops::Backend& backend,
               const LoadOptions& options);

  bool dummy() const { return checkpoint_ == nullptr; }
  // What this rank holds (LoadOptions::shard).
  const parallel::RankShard& shard() const { return options_.shard; }
  // Dummy weights have no optional tensors.
  bool has(const std::string& name) const { return checkpoint_ && checkpoint_->has(name); }
  // A linear layer `<module>.weight` [n_out, n_in] in the format the checkpoint's quant
  // config gives the module: BF16/F16/F32, NVFP4 (U8 codes + weight_scale + weight_scale_2)
  // or FP8 per-tensor; `<module>.bias` [n_out] required when with_bias.
  // With a slice, the rank's part only (n_out, n_in are the whole layer's, checked as such):
  // rows are views of the mapping, columns a copy (NVFP4 cut on its 16-value blocks).
  ops::LinearWeight linear(const std::string& module, int64_t n_out, int64_t n_in, bool with_bias,
                           const LinearSlice& slice = {});
  // A float tensor (BF16/F16/F32) of exactly this shape.
  TensorView floats(const std::string& name, Shape shape);
  // The first of `names` the checkpoint has, an F32 scalar ([] or [1]) that must be positive
  // and finite (a KV cache scale), or `fallback` where it has none (dummy weights have none).
  float scalar_or(const std::vector<std::string>& names, float fallback);
  // The same, converted to F32 where it is stored narrower (router biases, which transformers
  // keeps in fp32 whatever the checkpoint stores).
  TensorView floats_f32(const std::string& name, Shape shape);
  // `part` of the intermediate width: gate and up take its rows, down its columns.
  ops::MlpWeights mlp(const std::string& prefix, const char* gate, const char* up, const char* down,
                      int64_t hidden, int64_t inter, parallel::Part part = {});
  // One layer's routed experts `<prefix><e>.` (and a shared expert `shared_prefix` of width
  // shared_inter when given), prepared by the backend straight from the checkpoint's mapping.
  std::unique_ptr<ops::MoeExperts> experts(const std::string& prefix, int64_t n_experts,
                                           const char* gate, const char* up, const char* down,
                                           int64_t hidden, int64_t inter,
                                           const std::string* shared_prefix, int64_t shared_inter,
                                           const ExpertsShard& shard = {});

  const LoadStats& stats() const { return stats_; }
  // Buffers the weights live in where the backend does not own them (dummy weights,
  // converted tensors): the model keeps them as long as it keeps the weights.
  std::vector<std::unique_ptr<ops::Buffer>> take_storage() { return std::move(storage_); }

 private:
  TensorView take(const std::string& name, DType dtype, Shape shape);
  TensorView random(const std::string& name, DType dtype, Shape shape, const ops::RandomFill& fill);
  ops::LinearWeight host_linear(const std::string& module, int64_t n_out, int64_t n_in, bool with_bias,
                                const LinearSlice& slice);
  ops::LinearWeight slice_host(const std::string& module, const ops::LinearWeight& w, const LinearSlice& slice);
  ops::MlpWeights host_mlp(const std::string& prefix, const char* gate, const char* up, const char* down,
                           int64_t hidden, int64_t inter, parallel::Range width);
  // The intermediate width's range for `part`: cut at 16s where the down projection is NVFP4.
  parallel::Range width_range(const std::string& down_module, int64_t inter, parallel::Part part) const;
  ops::WeightFormat format_of(const std::string& module) const;
  void count(const TensorView& t);

  const Checkpoint* checkpoint_;
  std::filesystem::path dir_;
  std::optional<QuantConfig> quant_;  // nullopt: a BF16 checkpoint
  ops::Backend& backend_;
  const LoadOptions& options_;
  LoadStats stats_;
  std::vector<std::unique_ptr<ops::Buffer>> storage_;
};

}  // namespace tetra::model

// BF16 checkpoint -> NVFP4 checkpoint as ModelOpt exports it (what `tetra quantize` does).
// Every MLP linear is quantized (routed experts, shared experts, dense MLPs; Mixtral's
// block_sparse_moe w1/w2/w3); attention (all of self_attn, the DSA indexer included), routers,
// embeddings, lm_head, norms, biases and MTP layers are copied as they are. The output is read
// by tetra, vLLM and SGLang: per-module weight / weight_scale / weight_scale_2 (/ input_scale),
// hf_quant_config.json and config.json's quantization_config.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tetra {

class Checkpoint;

// How one source tensor is treated.
struct QuantizePlan {
  // Quantized modules (tensor name without ".weight") -> the module whose amax it shares
  // (gate_proj <-> up_proj, w1 <-> w3), "" when it has none.
  std::map<std::string, std::string> quantized;
  std::vector<std::string> unquantized;  // other linear modules (rank-2 weights, no embeddings)
  std::vector<std::string> mtp_layers;   // "model.layers.N" with N >= num_hidden_layers
  // exclude_modules as ModelOpt summarizes them (prefix wildcards), then "<mtp layer>*".
  std::vector<std::string> exclude;
};

// The module of an MLP linear weight tensor ("...mlp.experts.3.up_proj" for
// "...mlp.experts.3.up_proj.weight"), or nullopt for any other tensor.
std::optional<std::string> mlp_linear_module(std::string_view tensor_name);

// Decides every tensor of `ckpt` (n_layers = config's num_hidden_layers).
QuantizePlan plan_quantization(const Checkpoint& ckpt, int64_t n_layers);

// ModelOpt's _prefix_wildcard_summarize_exclude_modules: for each unquantized module the first
// of `a*`, {`a`, `a.*`} (a = each prefix ending before a dot, shortest first), or the name itself
// that matches no quantized module; sorted.
std::vector<std::string> summarize_exclusions(const std::vector<std::string>& unquantized,
                                              const std::vector<std::string>& quantized);

struct QuantizeOptions {
  std::filesystem::path src, dst;
  // Calibrated input amax per quantized module (from running the model over --calib text).
  // Present: input_scale = amax / (6 * 448) is written and the algo is NVFP4 (W4A4); absent:
  // W4A16_NVFP4 without input_scale.
  std::optional<std::map<std::string, float>> input_amax;
  int n_threads = 0;  // quantization threads (0 = all cores)
  // After each source tensor: tensors done, total, bytes read so far, total bytes.
  std::function<void(int64_t, int64_t, int64_t, int64_t)> on_progress;
};

struct QuantizeSummary {
  int64_t n_quantized = 0, n_copied = 0;
  int64_t bytes_in = 0, bytes_out = 0;
  std::string algo;
};

// Writes the quantized checkpoint to a temporary folder beside `dst` and renames it to `dst`
// only when everything is written, so an interrupted run leaves nothing that looks complete.
// `dst` must not exist. Tensors stream one at a time (memory stays near one tensor).
QuantizeSummary quantize_checkpoint(const QuantizeOptions& options);

}  // namespace tetra

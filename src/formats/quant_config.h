// The quantization config of a ModelOpt checkpoint (FORMATS.md §3.1), from either form:
// hf_quant_config.json ({"producer", "quantization": {quant_algo, kv_cache_quant_algo,
// group_size, exclude_modules | quantized_layers}}) or config.json's quantization_config
// ({quant_method: "modelopt", quant_algo, config_groups, ignore, kv_cache_scheme,
// quantized_layers}). Which format each linear module is stored in follows vLLM's
// ModelOptQuantConfigBase / ModelOptMixedPrecisionConfig rules, so a checkpoint reads the same
// in tetra as in vLLM.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tetra {

// How one linear module's weight is stored.
enum class QuantAlgo : uint8_t {
  None,        // BF16/F16/F32 weight as in the original model
  Nvfp4,       // "NVFP4": NVFP4 weights, static activation scale (input_scale) for W4A4
  W4a16Nvfp4,  // "W4A16_NVFP4": NVFP4 weights, activations stay 16-bit, no input_scale
  Fp8,         // "FP8": E4M3 weight with a per-tensor F32 weight_scale (and input_scale)
};

enum class KvCacheQuant : uint8_t { None, Fp8, Nvfp4 };

std::string_view quant_algo_name(QuantAlgo a);  // as ModelOpt spells it ("NVFP4", ...)
inline bool is_nvfp4(QuantAlgo a) { return a == QuantAlgo::Nvfp4 || a == QuantAlgo::W4a16Nvfp4; }

struct ModuleQuant {
  QuantAlgo algo = QuantAlgo::None;
  int group_size = 0;  // elements per block scale (16 for NVFP4), 0 for per-tensor formats
};

struct QuantConfig {
  // quant_algo of the whole checkpoint; for MIXED_PRECISION `mixed` is set and `algo` is None
  // (each module's algo comes from `layers`).
  QuantAlgo algo = QuantAlgo::None;
  bool mixed = false;
  int group_size = 16;
  KvCacheQuant kv_cache = KvCacheQuant::None;
  // exclude_modules (hf_quant_config.json) or ignore (config.json): module names, prefixes
  // or fnmatch wildcards.
  std::vector<std::string> exclude;
  // MIXED_PRECISION's quantized_layers: module name -> its algo.
  std::map<std::string, ModuleQuant, std::less<>> layers;
  std::string source;  // the file it came from, for messages

  // vLLM's is_layer_excluded: an exact entry, then an entry that is a substring of the name,
  // then an fnmatch wildcard.
  bool is_excluded(std::string_view module) const;
  // The format of a linear module (its name without ".weight"): None when excluded; under
  // MIXED_PRECISION the quantized_layers entry (exact, "lm_head" for "*.lm_head", then the
  // an entry under "module.") and None when absent; otherwise the checkpoint's algo.
  ModuleQuant module_quant(std::string_view module) const;
};

// Parses either form; `source` names the file in errors. Throws tetra::Error for an unknown
// quant_algo (tetra reads NVFP4, W4A16_NVFP4, FP8 and MIXED_PRECISION), a non-ModelOpt
// quant_method, or malformed fields.
QuantConfig parse_quant_config(const nlohmann::json& j, const std::string& source);

// The quantization config of a model folder: config.json's quantization_config when it is a
// ModelOpt one (as vLLM prefers it), else hf_quant_config.json; a MIXED_PRECISION
// quantization_config without its quantized_layers falls back to hf_quant_config.json.
// nullopt when the folder declares no quantization (a BF16 checkpoint). `hf_overrides` are
// merged into config.json first, as the model config reads it (formats/config_overrides.h).
std::optional<QuantConfig> load_quant_config(const std::filesystem::path& dir, const std::string& hf_overrides = {});

// Python's fnmatch.fnmatchcase: `*`, `?`, `[seq]`, `[!seq]`; everything else literal.
bool fnmatch(std::string_view name, std::string_view pattern);

}  // namespace tetra

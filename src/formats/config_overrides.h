// --hf-overrides (vLLM's flag; SGLang's --json-model-override-args): a JSON object whose keys
// are merged into config.json when it is read, before it is parsed, e.g.
// {"num_hidden_layers": 6} to run a published config shortened. Every reader of config.json
// (the model config, the quantization config) takes the same text and applies it here.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tetra {

// The flag's text as a JSON object; empty text is an empty object. Not JSON, or JSON that is
// not an object, is one sentence naming --hf-overrides.
nlohmann::json parse_config_overrides(const std::string& text);

// Merges `overrides` into `config` (config.json's object). An object value merges key by key
// into the object `config` holds under that key, recursively; any other value (a number, a
// list, null) replaces the value or adds the key. (vLLM merges this way only inside nested
// sub-configs and sets a top-level dict such as rope_scaling whole; for the families here,
// merging every object is the one that lets {"rope_scaling": {"factor": 8}} mean what it says.)
//
// Fewer num_hidden_layers than the file describes keep its first layers: the per-layer fields
// the overrides leave alone (mlp_layer_types, indexer_types, index_topk_pattern, the indices
// of mlp_only_layers, first_k_dense_replace) are cut to the layers left, as vLLM reads only
// the first entries of the lists an override leaves longer than the model.
void apply_config_overrides(nlohmann::json& config, const nlohmann::json& overrides);

}  // namespace tetra

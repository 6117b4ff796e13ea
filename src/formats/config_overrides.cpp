#include "formats/config_overrides.h"

#include <algorithm>

#include "core/error.h"
#include "formats/json_fields.h"

namespace tetra {
namespace {

using nlohmann::json;

constexpr const char* kExample = "give a JSON object such as '{\"num_hidden_layers\": 6}'";

void merge(json& into, const json& from) {
  for (const auto& [key, value] : from.items()) {
    auto it = into.find(key);
    if (value.is_object() && it != into.end() && it->is_object()) {
      merge(*it, value);
    } else {
      into[key] = value;
    }
  }
}

// The layers' own fields, cut to the first n layers unless the overrides set them.
void keep_first_layers(json& config, const json& overrides, int64_t n) {
  auto untouched = [&](const char* key) { return config.contains(key) && !overrides.contains(key); };
  for (const char* key : {"mlp_layer_types", "indexer_types", "index_topk_pattern"}) {
    if (!untouched(key)) continue;
    json& v = config[key];
    if (v.is_array() && int64_t(v.size()) > n) v.erase(v.begin() + n, v.end());
    if (v.is_string() && int64_t(v.get_ref<const std::string&>().size()) > n)
      v = v.get<std::string>().substr(0, size_t(n));
  }
  if (untouched("mlp_only_layers") && config["mlp_only_layers"].is_array()) {
    json& only = config["mlp_only_layers"];
    only.erase(std::remove_if(only.begin(), only.end(),
                              [n](const json& i) { return i.is_number_integer() && i.get<int64_t>() >= n; }),
               only.end());
  }
  // Layers before first_k_dense_replace are dense: with fewer layers than that, all of them.
  if (untouched("first_k_dense_replace") && config["first_k_dense_replace"].is_number_integer() &&
      config["first_k_dense_replace"].get<int64_t>() > n)
    config["first_k_dense_replace"] = n;
}

}  // namespace

json parse_config_overrides(const std::string& text) {
  if (text.empty()) return json::object();
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("--hf-overrides is not valid JSON (at byte ", e.byte, "); ", kExample, ".");
  }
  if (!j.is_object()) fail("--hf-overrides is ", json_kind(j), "; ", kExample, ".");
  return j;
}

void apply_config_overrides(json& config, const json& overrides) {
  TETRA_CHECK(config.is_object() && overrides.is_object(),
              "apply_config_overrides: the config and the overrides must be JSON objects");
  const auto layers_before = config.find("num_hidden_layers");
  const bool shorter = overrides.contains("num_hidden_layers") && overrides["num_hidden_layers"].is_number_integer() &&
                       layers_before != config.end() && layers_before->is_number_integer() &&
                       overrides["num_hidden_layers"].get<int64_t>() < layers_before->get<int64_t>();
  merge(config, overrides);
  if (shorter) keep_first_layers(config, overrides, std::max<int64_t>(0, config["num_hidden_layers"].get<int64_t>()));
}

}  // namespace tetra

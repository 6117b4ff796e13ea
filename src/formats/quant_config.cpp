#include "formats/quant_config.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/config_overrides.h"

namespace tetra {
namespace {

using nlohmann::json;

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A quant_algo value as one module's format. MIXED_PRECISION is only valid at the top level
// and handled by the caller.
QuantAlgo parse_algo(const std::string& raw, const std::string& where) {
  const std::string a = upper(raw);
  if (a == "NVFP4") return QuantAlgo::Nvfp4;
  if (a == "W4A16_NVFP4") return QuantAlgo::W4a16Nvfp4;
  if (a == "FP8") return QuantAlgo::Fp8;
  fail(where, ": quant_algo '", raw,
       "' is not supported by tetra (it reads NVFP4, W4A16_NVFP4, FP8 and MIXED_PRECISION)");
}

int parse_group_size(const json& v, const std::string& where) {
  if (v.is_null()) return 0;
  if (v.is_number_integer()) return v.get<int>();
  if (v.is_string()) {  // vLLM accepts a numeric string too
    const std::string s = v.get<std::string>();
    try {
      size_t used = 0;
      const int g = std::stoi(s, &used);
      if (used == s.size()) return g;
    } catch (const std::exception&) {
    }
  }
  fail(where, ": group_size must be an integer, not ", v.dump());
}

// Checks the block size a module's NVFP4 weights can have: vLLM's kernels and tetra's
// only know 16-element blocks.
void check_group_size(const ModuleQuant& m, const std::string& where) {
  if (is_nvfp4(m.algo) && m.group_size != 16)
    fail(where, ": NVFP4 group_size is ", m.group_size, ", but only 16 is supported");
}

KvCacheQuant parse_kv(const json& v, const std::string& where) {
  if (v.is_null()) return KvCacheQuant::None;
  if (v.is_object()) {  // config.json's kv_cache_scheme: {"type": "float", "num_bits": 8, ...}
    if (v.value("type", std::string()) == "float" && v.value("num_bits", 0) == 8)
      return KvCacheQuant::Fp8;
    fail(where, ": kv_cache_scheme ", v.dump(), " is not supported (tetra reads FP8 and NVFP4)");
  }
  TETRA_CHECK(v.is_string(), where, ": the KV cache algo must be a string, not ", v.dump());
  const std::string s = upper(v.get<std::string>());
  if (s == "FP8") return KvCacheQuant::Fp8;
  if (s == "NVFP4") return KvCacheQuant::Nvfp4;
  if (s.empty() || s == "NONE") return KvCacheQuant::None;
  fail(where, ": kv cache quant algo '", v.get<std::string>(),
       "' is not supported (tetra reads FP8 and NVFP4)");
}

std::vector<std::string> parse_names(const json& v, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  TETRA_CHECK(v.is_array(), where, ": ", key, " must be a list of module names, not ",
              v.type_name());
  for (const json& e : v) {
    TETRA_CHECK(e.is_string(), where, ": ", key, " holds ", e.dump(), ", not a module name");
    out.push_back(e.get<std::string>());
  }
  return out;
}

void parse_layers(const json& v, const std::string& where, QuantConfig& cfg) {
  if (v.is_null()) return;
  TETRA_CHECK(v.is_object(), where, ": quantized_layers must be an object, not ", v.type_name());
  for (const auto& [name, info] : v.items()) {
    const std::string at = str_cat(where, ": quantized_layers[\"", name, "\"]");
    TETRA_CHECK(info.is_object() && info.contains("quant_algo") && info["quant_algo"].is_string(),
                at, " needs a quant_algo string");
    ModuleQuant m;
    m.algo = parse_algo(info["quant_algo"].get<std::string>(), at);
    m.group_size = is_nvfp4(m.algo) ? 16 : 0;
    if (info.contains("group_size") && !info["group_size"].is_null())
      m.group_size = parse_group_size(info["group_size"], at);
    check_group_size(m, at);
    cfg.layers.emplace(name, m);
  }
}

// The first weights.group_size among config.json's config_groups (ModelOpt writes no
// top-level group_size there).
int group_size_from_config_groups(const json& j, const std::string& where) {
  if (!j.contains("config_groups") || !j["config_groups"].is_object()) return 0;
  for (const auto& [_, g] : j["config_groups"].items())
    if (g.is_object() && g.contains("weights") && g["weights"].is_object() &&
        g["weights"].contains("group_size"))
      return parse_group_size(g["weights"]["group_size"], where);
  return 0;
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TETRA_CHECK(in, "cannot read ", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail(path.string(), " is not valid JSON (", e.what(), ")");
  }
}

// fnmatch over [p, pe) against [n, ne), with backtracking on the last '*'.
bool match_class(std::string_view pat, size_t& i, char c, bool& ok) {
  // pat[i] == '['; on success leaves i after ']' and sets ok to whether c is in the class.
  size_t j = i + 1;
  bool negate = false;
  if (j < pat.size() && pat[j] == '!') negate = true, ++j;
  size_t k = j;
  if (k < pat.size() && pat[k] == ']') ++k;  // a leading ']' is a member
  while (k < pat.size() && pat[k] != ']') ++k;
  if (k >= pat.size()) return false;  // no closing ']': '[' is a literal
  bool in = false;
  for (size_t m = j; m < k; ++m) {
    if (m + 2 < k && pat[m + 1] == '-') {
      if (pat[m] <= c && c <= pat[m + 2]) in = true;
      m += 2;
    } else if (pat[m] == c) {
      in = true;
    }
  }
  ok = in != negate;
  i = k + 1;
  return true;
}

}  // namespace

std::string_view quant_algo_name(QuantAlgo a) {
  switch (a) {
    case QuantAlgo::None: return "NONE";
    case QuantAlgo::Nvfp4: return "NVFP4";
    case QuantAlgo::W4a16Nvfp4: return "W4A16_NVFP4";
    case QuantAlgo::Fp8: return "FP8";
  }
  return "?";
}

bool fnmatch(std::string_view name, std::string_view pat) {
  size_t n = 0, p = 0;
  size_t star_p = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pat.size()) {
      const char c = pat[p];
      if (c == '*') {
        star_p = p++;
        star_n = n;
        continue;
      }
      if (c == '?') {
        ++p, ++n;
        continue;
      }
      if (c == '[') {
        size_t q = p;
        bool ok = false;
        if (match_class(pat, q, name[n], ok)) {
          if (ok) {
            p = q, ++n;
            continue;
          }
        } else if (name[n] == '[') {
          ++p, ++n;
          continue;
        }
      } else if (c == name[n]) {
        ++p, ++n;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1;  // let the last '*' swallow one more character
    n = ++star_n;
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

bool QuantConfig::is_excluded(std::string_view module) const {
  for (const std::string& e : exclude)
    if (e == module) return true;
  for (const std::string& e : exclude)
    if (module.find(e) != std::string_view::npos) return true;
  for (const std::string& e : exclude)
    if (fnmatch(module, e)) return true;
  return false;
}

ModuleQuant QuantConfig::module_quant(std::string_view module) const {
  if (is_excluded(module)) return {};
  if (!mixed) return {algo, is_nvfp4(algo) ? group_size : 0};
  if (auto it = layers.find(module); it != layers.end()) return it->second;
  constexpr std::string_view kLmHead = ".lm_head";
  if (module.size() > kLmHead.size() && module.ends_with(kLmHead))
    if (auto it = layers.find(std::string_view("lm_head")); it != layers.end()) return it->second;
  // A parent module (vLLM's RoutedExperts prefix) takes the algo of the first entry under it.
  const std::string under = std::string(module) + ".";
  if (auto it = layers.lower_bound(under); it != layers.end() && it->first.starts_with(under))
    return it->second;
  return {};
}

QuantConfig parse_quant_config(const json& j, const std::string& source) {
  TETRA_CHECK(j.is_object(), source, ": the quantization config must be a JSON object");
  QuantConfig cfg;
  cfg.source = source;
  std::string algo;
  int group_size = 0;
  try {
    if (j.contains("quantization")) {  // hf_quant_config.json
      const json& q = j["quantization"];
      TETRA_CHECK(q.is_object(), source, ": \"quantization\" must be an object");
      TETRA_CHECK(q.contains("quant_algo") && q["quant_algo"].is_string(), source,
                  ": \"quantization\" has no quant_algo");
      algo = q["quant_algo"].get<std::string>();
      cfg.kv_cache = parse_kv(q.value("kv_cache_quant_algo", json()), source);
      group_size = parse_group_size(q.value("group_size", json()), source);
      cfg.exclude = parse_names(q.value("exclude_modules", json()), "exclude_modules", source);
      parse_layers(q.value("quantized_layers", json()), source, cfg);
    } else {  // config.json quantization_config
      const std::string method = j.value("quant_method", std::string("modelopt"));
      TETRA_CHECK(upper(method).starts_with("MODELOPT"), source, ": quant_method '", method,
                  "' is not a ModelOpt checkpoint, which is what tetra reads");
      TETRA_CHECK(j.contains("quant_algo") && j["quant_algo"].is_string(), source,
                  ": the quantization config has no quant_algo");
      algo = j["quant_algo"].get<std::string>();
      cfg.kv_cache = parse_kv(j.value("kv_cache_scheme", json()), source);
      group_size = parse_group_size(j.value("group_size", json()), source);
      if (group_size == 0) group_size = group_size_from_config_groups(j, source);
      cfg.exclude = parse_names(j.value("ignore", json()), "ignore", source);
      parse_layers(j.value("quantized_layers", json()), source, cfg);
    }
  } catch (const json::exception& e) {
    fail(source, ": malformed quantization config (", e.what(), ")");
  }
  TETRA_CHECK(!algo.empty(), source, ": quant_algo is empty");
  if (upper(algo) == "MIXED_PRECISION") {
    cfg.mixed = true;
  } else {
    cfg.algo = parse_algo(algo, source);
  }
  if (group_size == 0) group_size = 16;
  cfg.group_size = group_size;
  if (!cfg.mixed) check_group_size({cfg.algo, group_size}, source);
  return cfg;
}

std::optional<QuantConfig> load_quant_config(const std::filesystem::path& dir, const std::string& hf_overrides) {
  const auto config_path = dir / "config.json";
  const auto hf_path = dir / "hf_quant_config.json";
  if (std::filesystem::exists(config_path)) {
    json cfg = read_json_file(config_path);
    const json overrides = parse_config_overrides(hf_overrides);
    if (cfg.is_object() && !overrides.empty()) apply_config_overrides(cfg, overrides);
    if (cfg.is_object() && cfg.contains("quantization_config") &&
        !cfg["quantization_config"].is_null()) {
      const std::string src = config_path.string() + (overrides.contains("quantization_config")
                                                          ? " quantization_config with --hf-overrides"
                                                          : " quantization_config");
      QuantConfig q = parse_quant_config(cfg["quantization_config"], src);
      if (!(q.mixed && q.layers.empty() && std::filesystem::exists(hf_path))) {
        TETRA_CHECK(!q.mixed || !q.layers.empty(), src,
                    ": MIXED_PRECISION needs a non-empty quantized_layers map");
        return q;
      }
    }
  }
  if (!std::filesystem::exists(hf_path)) return std::nullopt;
  QuantConfig q = parse_quant_config(read_json_file(hf_path), hf_path.string());
  TETRA_CHECK(!q.mixed || !q.layers.empty(), hf_path.string(),
              ": MIXED_PRECISION needs a non-empty quantized_layers map");
  return q;
}

}  // namespace tetra

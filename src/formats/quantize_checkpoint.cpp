#include "formats/quantize_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/nvfp4.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;

// Who wrote the checkpoint; vLLM and SGLang read the format fields, not this one.
const OrderedJson kProducer = {{"name", "tetra"}, {"version", "0.1"}};

// "model.layers.N." -> N, or -1.
int64_t layer_index(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  int64_t n = 0;
  size_t i = kPrefix.size();
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    n = n * 10 + (name[i] - '0');
  return i < name.size() && name[i] == '.' ? n : -1;
}

bool is_float(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

OrderedJson read_ordered_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TETRA_CHECK(in, "cannot read ", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return OrderedJson::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), " is not valid JSON (", e.what(), ")");
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text << "\n";
  TETRA_CHECK(out.good(), "cannot write ", path.string());
}

// hf_quant_config.json and config.json's quantization_config, keyed as ModelOpt writes them
// (quant_utils.process_layer_quant_config, convert_hf_config.convert_hf_quant_config_format).
std::pair<OrderedJson, OrderedJson> quant_configs(const std::string& algo,
                                                  const std::vector<std::string>& exclude) {
  const int g = nvfp4::kBlockSize;
  OrderedJson hf = {{"producer", kProducer},
                    {"quantization",
                     {{"quant_algo", algo},
                      {"kv_cache_quant_algo", nullptr},
                      {"group_size", g},
                      {"exclude_modules", exclude}}}};
  const OrderedJson weights = {
      {"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", g}};
  OrderedJson group = OrderedJson::object();
  if (algo == "NVFP4") group["input_activations"] = weights;
  group["weights"] = weights;
  group["targets"] = {"Linear"};
  OrderedJson qc = {{"config_groups", {{"group_0", group}}},
                    {"ignore", exclude},
                    {"quant_algo", algo},
                    {"producer", kProducer},
                    {"quant_method", "modelopt"}};
  return {hf, qc};
}

// Removes the temporary folder unless the run got as far as renaming it.
struct TempDir {
  fs::path path;
  bool keep = false;
  ~TempDir() {
    if (!keep && !path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

}  // namespace

std::optional<std::string> mlp_linear_module(std::string_view tensor_name) {
  // <prefix>.(mlp|block_sparse_moe)[.experts.E | .shared_experts | .shared_expert].<proj>.weight
  static const std::regex kMlpLinear(
      R"(^(.*\.(?:mlp|block_sparse_moe)(?:\.(?:experts\.[0-9]+|shared_experts|shared_expert))?)"
      R"(\.(?:gate_proj|up_proj|down_proj|w1|w2|w3))\.weight$)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(tensor_name.begin(), tensor_name.end(), m, kMlpLinear)) return std::nullopt;
  return m[1].str();
}

std::vector<std::string> summarize_exclusions(const std::vector<std::string>& unquantized,
                                              const std::vector<std::string>& quantized) {
  std::vector<std::string> q(quantized);
  std::sort(q.begin(), q.end());
  const std::set<std::string, std::less<>> exact(q.begin(), q.end());
  // ModelOpt's negative wildcards: every quantized name and every `prefix*` of one.
  auto some_starts_with = [&](std::string_view p) {
    auto it = std::lower_bound(q.begin(), q.end(), p);
    return it != q.end() && std::string_view(*it).starts_with(p);
  };
  auto negative = [&](const std::string& w) {
    if (w.ends_with('*')) return some_starts_with(std::string_view(w).substr(0, w.size() - 1));
    return exact.count(w) > 0;
  };
  std::set<std::string> result;
  for (const std::string& layer : unquantized) {
    std::vector<std::vector<std::string>> candidates;
    for (size_t i = 0; i < layer.size(); ++i) {
      if (layer[i] != '.') continue;
      const std::string p = layer.substr(0, i);
      candidates.push_back({p + "*"});
      candidates.push_back({p, p + ".*"});
    }
    candidates.push_back({layer});
    for (const auto& wildcards : candidates) {
      if (std::any_of(wildcards.begin(), wildcards.end(), negative)) continue;
      result.insert(wildcards.begin(), wildcards.end());
      break;
    }
  }
  return {result.begin(), result.end()};
}

QuantizePlan plan_quantization(const Checkpoint& ckpt, int64_t n_layers) {
  QuantizePlan plan;
  std::set<int64_t> mtp;
  for (const std::string& name : ckpt.names()) {
    const int64_t layer = layer_index(name);
    if (layer >= n_layers) {
      mtp.insert(layer);
      continue;
    }
    const TensorInfo* info = ckpt.find(name);
    const auto module = mlp_linear_module(name);
    const bool quantizable = module && is_float(info->dtype) && info->shape.rank == 2 &&
                             info->shape[1] > 0 && info->shape[1] % nvfp4::kBlockSize == 0;
    if (quantizable) {
      plan.quantized.emplace(*module, "");
    } else if (name.ends_with(".weight") && info->shape.rank == 2 &&
               name.find("embed_tokens") == std::string::npos) {
      plan.unquantized.push_back(name.substr(0, name.size() - 7));
    }
  }
  // gate_proj and up_proj (Mixtral w1 and w3) of one MLP read the same input and share one
  // weight_scale_2 (ModelOpt's preprocess_linear_fusion / sync_moe_gate_up_amax).
  static const std::pair<std::string_view, std::string_view> kPairs[] = {
      {".gate_proj", ".up_proj"}, {".up_proj", ".gate_proj"}, {".w1", ".w3"}, {".w3", ".w1"}};
  for (auto& [module, partner] : plan.quantized)
    for (auto [a, b] : kPairs)
      if (module.ends_with(a)) {
        const std::string other = module.substr(0, module.size() - a.size()) + std::string(b);
        if (plan.quantized.count(other)) partner = other;
      }
  for (int64_t l : mtp) plan.mtp_layers.push_back(str_cat("model.layers.", l));
  std::vector<std::string> q;
  for (const auto& [m, _] : plan.quantized) q.push_back(m);
  plan.exclude = summarize_exclusions(plan.unquantized, q);
  for (const std::string& m : plan.mtp_layers) plan.exclude.push_back(m + "*");
  return plan;
}

QuantizeSummary quantize_checkpoint(const QuantizeOptions& opt) {
  const fs::path src = opt.src, dst = opt.dst;
  TETRA_CHECK(fs::is_directory(src), "model folder ", src.string(), " does not exist");
  TETRA_CHECK(!fs::exists(dst), "output folder ", dst.string(),
              " already exists; choose a new one (tetra quantize never overwrites)");
  OrderedJson config = read_ordered_json(src / "config.json");
  TETRA_CHECK(config.is_object(), (src / "config.json").string(), " is not a JSON object");
  TETRA_CHECK(!config.contains("quantization_config") && !fs::exists(src / "hf_quant_config.json"),
              src.string(), " is already quantized (it has a quantization config); "
              "tetra quantize reads BF16 checkpoints");
  int64_t n_layers = INT64_MAX;
  if (config.contains("num_hidden_layers") && config["num_hidden_layers"].is_number_integer())
    n_layers = config["num_hidden_layers"].get<int64_t>();

  auto ckpt = Checkpoint::open(src);
  const QuantizePlan plan = plan_quantization(*ckpt, n_layers);
  TETRA_CHECK(!plan.quantized.empty(), src.string(),
              " has no MLP linear weights to quantize (BF16/F16/F32, input width a multiple of ",
              nvfp4::kBlockSize, ")");
  QuantizeSummary summary;
  summary.algo = opt.input_amax ? "NVFP4" : "W4A16_NVFP4";

  // Source tensors grouped by shard file, each in file order so reads stream sequentially.
  std::map<std::string, std::vector<const TensorInfo*>> shards;
  int64_t n_total = 0, bytes_total = 0;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo* info = ckpt->find(name);
    shards[ckpt->file_of(name).filename().string()].push_back(info);
    ++n_total;
    bytes_total += int64_t(info->end - info->begin);
  }
  for (auto& [_, infos] : shards)
    std::sort(infos.begin(), infos.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });

  ThreadPool pool(opt.n_threads);
  std::map<std::string, float> amax_cache;
  auto amax = [&](const std::string& module) {
    auto it = amax_cache.find(module);
    if (it != amax_cache.end()) return it->second;
    const std::string name = module + ".weight";
    const float a = nvfp4::tensor_amax(ckpt->get(name),
                                       str_cat(ckpt->file_of(name).string(), ": ", name), &pool);
    amax_cache.emplace(module, a);
    return a;
  };
  auto input_scale = [&](const std::string& module, const std::string& partner) {
    auto get = [&](const std::string& m) {
      auto it = opt.input_amax->find(m);
      return it == opt.input_amax->end() ? 0.0f : it->second;
    };
    float a = get(module);
    if (!partner.empty()) a = std::max(a, get(partner));
    if (!(a > 0.0f)) a = nvfp4::kE2m1Max;  // ModelOpt's export_amax: a zero amax becomes 6
    return a / (nvfp4::kE2m1Max * nvfp4::kE4m3Max);
  };

  TempDir tmp;
  const fs::path parent = dst.has_parent_path() ? dst.parent_path() : fs::path(".");
  fs::create_directories(parent);
  tmp.path = parent / str_cat(".", dst.filename().string(), ".partial-", ::getpid());
  fs::remove_all(tmp.path);
  fs::create_directories(tmp.path);

  std::map<std::string, std::string> weight_map;
  int64_t n_done = 0, bytes_done = 0;
  for (const auto& [shard, infos] : shards) {
    std::vector<TensorDecl> decls;
    for (const TensorInfo* t : infos) {
      const std::string module = t->name.size() > 7 ? t->name.substr(0, t->name.size() - 7) : "";
      auto q = t->name.ends_with(".weight") ? plan.quantized.find(module) : plan.quantized.end();
      if (q == plan.quantized.end() || layer_index(t->name) >= n_layers) {
        decls.push_back({t->name, t->dtype, t->shape});
        continue;
      }
      const int64_t n_out = t->shape[0], n_in = t->shape[1];
      // 2 e2m1 codes per byte, low nibble = even index; one E4M3 scale per 16 inputs.
      decls.push_back({t->name, DType::U8, Shape{n_out, n_in / 2}});
      decls.push_back({module + ".weight_scale", DType::F8_E4M3,
                       Shape{n_out, n_in / nvfp4::kBlockSize}});
      decls.push_back({module + ".weight_scale_2", DType::F32, Shape{}});
      if (opt.input_amax) decls.push_back({module + ".input_scale", DType::F32, Shape{}});
    }
    for (const TensorDecl& d : decls) weight_map[d.name] = shard;
    SafetensorsWriter writer(tmp.path / shard, decls, {{"format", "pt"}});
    for (const TensorInfo* t : infos) {
      const std::string module = t->name.size() > 7 ? t->name.substr(0, t->name.size() - 7) : "";
      auto q = t->name.ends_with(".weight") ? plan.quantized.find(module) : plan.quantized.end();
      const TensorView view = ckpt->get(t->name);
      if (q == plan.quantized.end() || layer_index(t->name) >= n_layers) {
        writer.write(t->name, view.data, uint64_t(view.nbytes()));
        ++summary.n_copied;
      } else {
        const std::string& partner = q->second;
        const float a = partner.empty() ? amax(module) : std::max(amax(module), amax(partner));
        const float gs = nvfp4::global_scale_from_amax(a);
        const int64_t n_out = t->shape[0], n_in = t->shape[1];
        std::vector<uint8_t> packed(size_t(n_out * n_in / 2));
        std::vector<uint8_t> scales(size_t(n_out * n_in / nvfp4::kBlockSize));
        nvfp4::quantize_tensor(view, gs, packed, scales, &pool);
        writer.write(t->name, packed.data(), packed.size());
        writer.write(module + ".weight_scale", scales.data(), scales.size());
        writer.write(module + ".weight_scale_2", &gs, sizeof gs);
        if (opt.input_amax) {
          const float is = input_scale(module, partner);
          writer.write(module + ".input_scale", &is, sizeof is);
        }
        ++summary.n_quantized;
      }
      ++n_done;
      bytes_done += int64_t(t->end - t->begin);
      if (opt.on_progress) opt.on_progress(n_done, n_total, bytes_done, bytes_total);
    }
    writer.finish();
    summary.bytes_out += int64_t(writer.file_bytes());
  }
  summary.bytes_in = bytes_total;

  const bool single = shards.size() == 1 && shards.begin()->first == "model.safetensors";
  if (!single) {
    uint64_t total = 0;
    for (const auto& [shard, _] : shards) {
      auto f = SafetensorsFile::open(tmp.path / shard);
      for (const TensorInfo& t : f->header().tensors) total += t.end - t.begin;
    }
    write_safetensors_index(tmp.path / "model.safetensors.index.json", weight_map, total);
  }

  const auto [hf, qc] = quant_configs(summary.algo, plan.exclude);
  write_text(tmp.path / "hf_quant_config.json", hf.dump(4));
  config["quantization_config"] = qc;
  write_text(tmp.path / "config.json", config.dump(4));

  // Everything else (tokenizer, chat template, generation config, ...) is copied.
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || name.ends_with(".safetensors") ||
        name == "model.safetensors.index.json" || name == "config.json" ||
        name == "hf_quant_config.json")
      continue;
    fs::copy(e.path(), tmp.path / name, fs::copy_options::recursive);
  }
  // The last step: until here, nothing at `dst` exists.
  fs::rename(tmp.path, dst);
  tmp.keep = true;
  return summary;
}

}  // namespace tetra

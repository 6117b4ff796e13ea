// tetra inspect: what a model folder holds, from its config alone or with its weights.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "commands.h"
#include "device_options.h"
#include "core/error.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "model_summary.h"
#include "progress.h"

namespace tetra::cli {

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"Describe a model folder: architecture, sizes, tensors.", "tetra inspect"};
  app.option_defaults()->always_capture_default();
  std::string model_dir, hf_overrides;
  bool json = false;
  app.add_option("--model", model_dir, "model folder (config.json, optional safetensors)")->required();
  add_hf_overrides_flag(app, hf_overrides);
  app.add_flag("--json", json, "print one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::filesystem::path dir(model_dir);
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");
  const ModelConfig c = load_model_config(dir, hf_overrides);
  const ModelSizes sizes = model_sizes(c, 2);

  nlohmann::json out = {
      {"model_type", c.model_type},
      {"layers", c.n_layers},
      {"dense_layers", std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), false)},
      {"hidden_size", c.hidden_size},
      {"vocab_size", c.vocab_size},
      {"attention", c.is_mla() ? "mla" : "gqa"},
      {"heads", c.n_heads},
      {"kv_heads", c.n_kv_heads},
      {"routed_experts", c.n_routed_experts},
      {"experts_per_token", c.n_experts_per_tok},
      {"shared_experts", c.n_shared_experts},
      {"mtp_layers", c.n_mtp_layers},
      {"params_total", sizes.params_total},
      {"params_active", sizes.params_active},
      {"kv_bytes_per_token_bf16", sizes.kv_bytes_per_token},
  };
  if (!c.hf_overrides.empty()) out["hf_overrides"] = nlohmann::json::parse(c.hf_overrides);
  const bool has_weights = std::filesystem::exists(dir / "model.safetensors") ||
                           std::filesystem::exists(dir / "model.safetensors.index.json");
  if (has_weights) {
    auto ckpt = Checkpoint::open(dir);
    std::map<std::string, int64_t> by_dtype;
    int64_t n_tensors = 0, mtp_tensors = 0, unloaded_tensors = 0;
    // The MTP layer follows the file's last layer, whatever --hf-overrides leaves.
    const int64_t file_layers = c.hf_overrides.empty() ? c.n_layers : load_model_config(dir).n_layers;
    for (const auto& name : ckpt->names()) {
      const TensorInfo* info = ckpt->find(name);
      by_dtype[std::string(dtype_name(info->dtype))] += int64_t(info->end - info->begin);
      ++n_tensors;
      const int64_t layer = model::tensor_layer(name);
      mtp_tensors += layer == file_layers;
      unloaded_tensors += layer >= c.n_layers;
    }
    out["weights"] = {{"tensors", n_tensors}, {"bytes", ckpt->total_bytes()}, {"bytes_by_dtype", by_dtype},
                      {"mtp_tensors", mtp_tensors}, {"unloaded_tensors", unloaded_tensors}};
  }
  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s\n", describe_architecture(c).c_str());
  std::printf("parameters: %s total, %s active per token\n", format_count(double(sizes.params_total)).c_str(),
              format_count(double(sizes.params_active)).c_str());
  std::printf("KV cache: %s per token at bf16 (%s)\n", format_bytes(double(sizes.kv_bytes_per_token)).c_str(),
              !c.is_mla() ? "K and V per layer"
              : c.index_topk ? "latent + rope key + DSA indexer key per layer"
                             : "latent + rope key per layer");
  if (c.n_mtp_layers) std::printf("MTP layers: %lld (skipped in generation)\n", (long long)c.n_mtp_layers);
  if (has_weights) {
    const auto& w = out["weights"];
    std::printf("weights: %lld tensors, %s", (long long)w["tensors"].get<int64_t>(),
                format_bytes(double(w["bytes"].get<int64_t>())).c_str());
    for (const auto& [dt, bytes] : w["bytes_by_dtype"].items())
      std::printf("; %s %s", dt.c_str(), format_bytes(double(bytes.get<int64_t>())).c_str());
    if (const int64_t unloaded = w["unloaded_tensors"].get<int64_t>())
      std::printf("; %lld tensors of layers past num_hidden_layers, never loaded", (long long)unloaded);
    std::printf("\n");
  } else {
    std::printf("weights: none in this folder (config only)\n");
  }
  return 0;
}

}  // namespace tetra::cli

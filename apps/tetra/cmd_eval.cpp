// tetra eval: perplexity of a model over a text and, with --ref, the mean KL divergence from a
// reference model's next-token distribution and the top-1 agreement (how quantization is
// judged: llama.cpp's perplexity/KLD rule).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "device_options.h"
#include "core/error.h"
#include "model/model.h"
#include "formats/model_config.h"
#include "parallel_flags.h"
#include "progress.h"
#include "runtime/evaluate.h"
#ifdef TETRA_HAVE_TOKENIZER
#include "tokenizer/tokenizer.h"
#endif

namespace tetra::cli {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TETRA_CHECK(in, "cannot read the text file ", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// On its own ranks (backends made from `backend`), or, with `shared`, on that one backend.
std::unique_ptr<runtime::ModelRanks> load(const std::filesystem::path& dir, const ops::BackendOptions& backend,
                                          const parallel::Parallelism& par, ops::Backend* shared,
                                          std::unique_ptr<model::Model>& owned, const std::string& hf_overrides) {
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");
  Progress progress("loading " + dir.filename().string());
  model::LoadOptions options;
  options.hf_overrides = hf_overrides;
  options.on_progress = [&](const model::LoadStats& s) { progress.update(s.tensors, s.bytes); };
  std::unique_ptr<runtime::ModelRanks> m;
  if (shared) {
    owned = model::load_model(dir, *shared, options);
    m = std::make_unique<runtime::ModelRanks>(*owned, *shared);
  } else {
    m = runtime::load_ranks(dir, backend, par, options);
  }
  progress.finish(m->model().load_stats().tensors, m->model().load_stats().bytes);
  return m;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text; with --ref, KL divergence and top-1 "
               "agreement against a reference model.", "tetra eval"};
  app.option_defaults()->always_capture_default();
  std::string model_dir, text_file, ref_dir, ids_file, hf_overrides, ref_kv_cache_dtype = "auto",
                                                                ref_moe_activation_dtype = "auto";
  int64_t window = 512;
  DeviceFlags dev;
  bool json = false;
  app.add_option("--model", model_dir, "model folder")->required();
  auto* t = app.add_option("--text", text_file, "text file, tokenized with the model's tokenizer");
  auto* i = app.add_option("--ids", ids_file, "file of token ids (JSON list) instead of --text");
  t->excludes(i);
  app.add_option("--ref", ref_dir, "reference model folder (e.g. the BF16 original)");
  app.add_option("--window", window, "tokens per evaluation window")->check(CLI::Range(2, 1 << 20));
  add_device_flags(app, dev, false);
  app.add_option("--ref-kv-cache-dtype", ref_kv_cache_dtype,
                 "the KV cache dtype of --ref (auto or fp8_e4m3): --kv-cache-dtype fp8_e4m3 with the default "
                 "measures the FP8 cache against the model's own");
  app.add_option("--ref-moe-activation-dtype", ref_moe_activation_dtype,
                 "the expert activations of --ref (auto or fp8_e4m3): --moe-activation-dtype fp8_e4m3 with the "
                 "default measures W4A8 against the model's W4A16");
  add_hf_overrides_flag(app, hf_overrides)->description(
      "a JSON object merged into the config.json of --model and of --ref before it is read, e.g. "
      "'{\"num_hidden_layers\": 6}' (nested objects merge key by key)");
  parallel::Parallelism par;
  add_parallel_flags(app, par);  // the reference model is split the same way
  app.add_flag("--json", json, "print one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  TETRA_CHECK(!text_file.empty() || !ids_file.empty(), "give the text with --text (or --ids)");
  check_parallel_flags(par);
  const std::filesystem::path dir(model_dir);
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");
  // A window is one forward over consecutive tokens: it cannot pass either model's context.
  for (const std::string& d : {model_dir, ref_dir}) {
    if (d.empty()) continue;
    const int64_t context = load_model_config(d, hf_overrides).max_position_embeddings;
    TETRA_CHECK(window <= context, "--window ", window, " is more than the context of ", context,
                " tokens of ", d, " (max_position_embeddings in config.json)");
  }

  std::vector<int32_t> tokens;
  if (!ids_file.empty()) {
    try {
      tokens = nlohmann::json::parse(read_text(ids_file)).get<std::vector<int32_t>>();
    } catch (const nlohmann::json::exception&) {
      fail(ids_file, " is not a JSON list of token ids");
    }
  } else {
#ifdef TETRA_HAVE_TOKENIZER
    TETRA_CHECK(tok::has_tokenizer(dir), "--text needs ", (dir / "tokenizer.json").string(),
                " (or tiktoken.model); use --ids with a model that has none");
    const auto tok = tok::Tokenizer::load(dir);
    for (auto id : tok.encode(read_text(text_file))) tokens.push_back(int32_t(id));
#else
    fail("--text needs a build with the tokenizer; use --ids");
#endif
  }

  const ops::BackendOptions backend = backend_options(dev);
  ops::BackendOptions ref_backend = backend;
  ref_backend.kv_cache_dtype = ops::parse_auto_or_fp8(ref_kv_cache_dtype, "--ref-kv-cache-dtype");
  ref_backend.moe_activation_dtype = ops::parse_auto_or_fp8(ref_moe_activation_dtype, "--ref-moe-activation-dtype");
  std::unique_ptr<model::Model> unused;
  auto model = load(dir, backend, par, nullptr, unused, hf_overrides);
  // One rank and the same dtypes: the reference shares the model's backend; else its own.
  const bool share = par.world() == 1 && ref_backend.kv_cache_dtype == backend.kv_cache_dtype &&
                     ref_backend.moe_activation_dtype == backend.moe_activation_dtype;
  std::unique_ptr<model::Model> ref_model;
  std::unique_ptr<runtime::ModelRanks> ref;
  if (!ref_dir.empty()) ref = load(ref_dir, ref_backend, par, share ? &model->backend() : nullptr, ref_model,
                                   hf_overrides);

  runtime::EvalOptions opt;
  opt.window = window;
  Progress progress("evaluating", "tokens");
  opt.on_progress = [&](int64_t done, int64_t) { progress.update(done, 0); };
  const runtime::EvalResult r = runtime::evaluate(*model, ref.get(), tokens, opt);
  progress.finish(r.n_scored, 0);

  if (json) {
    nlohmann::json out = {{"tokens", tokens.size()}, {"scored", r.n_scored},
                          {"perplexity", r.perplexity}, {"mean_nll", r.nll_sum / double(r.n_scored)}};
    if (r.has_ref) {
      out["ref_perplexity"] = r.ref_perplexity;
      out["mean_kl"] = r.mean_kl;
      out["max_kl"] = r.max_kl;
      out["top1_agreement"] = r.top1_agreement;
    }
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%lld tokens, %lld predictions scored\nperplexity: %.4f\n",
                static_cast<long long>(tokens.size()), static_cast<long long>(r.n_scored),
                r.perplexity);
    if (r.has_ref)
      std::printf("reference perplexity: %.4f\nmean KL(ref || model): %.6f nats (max %.6f)\n"
                  "top-1 agreement: %.2f%%\n",
                  r.ref_perplexity, r.mean_kl, r.max_kl, 100.0 * r.top1_agreement);
  }
  return 0;
}

}  // namespace tetra::cli

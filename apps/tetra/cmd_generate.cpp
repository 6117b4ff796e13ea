// tetra generate: one prompt in, generated tokens out, on the chosen backend.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "device_options.h"
#include "core/error.h"
#include "formats/model_config.h"
#include "model/model.h"
#include "model_summary.h"
#include "parallel_flags.h"
#include "progress.h"
#include "runtime/generate.h"
#ifdef TETRA_HAVE_TOKENIZER
#include "tokenizer/tokenizer.h"
#include "tokenizer_check.h"
#endif

namespace tetra::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TETRA_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX,
                "--prompt-ids must be a comma-separated list of token ids, got '", item, "'");
    ids.push_back(int32_t(v));
  }
  TETRA_CHECK(!ids.empty(), "--prompt-ids is empty");
  return ids;
}


}  // namespace

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Generate tokens from a prompt.", "tetra generate"};
  app.option_defaults()->always_capture_default();
  std::string model_dir, prompt, prompt_ids, hf_overrides;
  DeviceFlags dev;
  int max_new_tokens = 16;
  float temperature = 0.0f, top_p = 1.0f, repetition_penalty = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  bool json = false, ignore_eos = false;
  app.add_option("--model", model_dir, "model folder (config.json, safetensors)")->required();
  auto* p_text = app.add_option("--prompt", prompt, "prompt text (needs tokenizer.json)");
  auto* p_ids = app.add_option("--prompt-ids", prompt_ids, "prompt token ids, comma-separated");
  p_text->excludes(p_ids);
  app.add_option("--max-new-tokens", max_new_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", temperature, "0 = greedy")->check(CLI::Range(0.0f, 2.0f));
  app.add_option("--top-p", top_p, "nucleus mass in (0, 1]")->check(CLI::Range(1e-6f, 1.0f));
  app.add_option("--top-k", top_k, "0 = all tokens")->check(CLI::NonNegativeNumber);
  app.add_option("--repetition-penalty", repetition_penalty,
                 "above 1 discourages the prompt's and the output's tokens; 1 = off")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "sampling seed");
  add_device_flags(app, dev);
  add_hf_overrides_flag(app, hf_overrides);
  parallel::Parallelism par;
  add_parallel_flags(app, par);
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-sequence tokens");
  app.add_flag("--json", json, "print one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  TETRA_CHECK(!prompt.empty() || !prompt_ids.empty(), "give a prompt with --prompt or --prompt-ids");
  check_parallel_flags(par);
  TETRA_CHECK(std::isfinite(repetition_penalty), "--repetition-penalty must be a finite number above 0");
  const std::filesystem::path dir(model_dir);
  TETRA_CHECK(std::filesystem::is_directory(dir), "model folder ", dir.string(), " does not exist");

  const ModelConfig file_config = load_model_config(dir, hf_overrides);
#ifdef TETRA_HAVE_TOKENIZER
  std::optional<tok::Tokenizer> tokenizer;
  if (tok::has_tokenizer(dir)) {
    tokenizer = tok::Tokenizer::load(dir);
    check_tokenizer_fits(*tokenizer, file_config, dir);
  }
#endif
  std::vector<int32_t> prompt_tokens;
  if (!prompt_ids.empty()) {
    prompt_tokens = parse_ids(prompt_ids);
  } else {
#ifdef TETRA_HAVE_TOKENIZER
    TETRA_CHECK(tokenizer.has_value(), "--prompt needs ", (dir / "tokenizer.json").string(),
                " (or tiktoken.model); use --prompt-ids with a model that has no tokenizer");
    for (auto id : tokenizer->encode(prompt, {.add_special_tokens = true})) prompt_tokens.push_back(int32_t(id));
    TETRA_CHECK(!prompt_tokens.empty(), "the prompt encodes to no tokens");
#else
    fail("--prompt needs a build with the tokenizer; use --prompt-ids");
#endif
  }

  // Requests are checked against the config before the weights are touched.
  runtime::check_prompt(file_config, prompt_tokens, max_new_tokens);

  Progress progress("loading " + dir.filename().string());
  model::LoadOptions options;
  options.on_progress = [&](const model::LoadStats& s) { progress.update(s.tensors, s.bytes); };
  options.dummy = dev.load_format == "dummy";
  options.hf_overrides = hf_overrides;
  auto ranks = runtime::load_ranks(dir, backend_options(dev), par, options);
  model::Model* model = &ranks->model();
  ops::Backend* backend = &ranks->backend();
  const auto stats = model->load_stats();
  progress.finish(stats.tensors, stats.bytes);
  const ModelConfig& config = model->config();
  std::fprintf(stderr, "%s\nbackend: %s%s\n", describe_architecture(config).c_str(), backend->name().c_str(),
               ranks->size() > 1 ? str_cat(", ", ranks->size(), " ranks (--tp ", par.tp, " --ep ", par.ep, ")").c_str() : "");

  runtime::GenerateOptions gen{.max_new_tokens = max_new_tokens,
                                .sampling = {.temperature = temperature,
                                             .top_p = top_p,
                                             .top_k = top_k,
                                             .repetition_penalty = repetition_penalty},
                                .seed = seed,
                                .ignore_eos = ignore_eos};
  const runtime::GenerateResult r = runtime::generate(*ranks, prompt_tokens, gen);
  const auto& generated = r.token_ids;
  std::string text;
#ifdef TETRA_HAVE_TOKENIZER
  if (tokenizer) text = tokenizer->decode(std::vector<tok::TokenId>(generated.begin(), generated.end()));
#endif
  char fp[16];
  std::snprintf(fp, sizeof fp, "#%08x", r.logits_fingerprint);
  const double decode_s = r.total_seconds - r.prefill_seconds;
  const double decode_tps = generated.size() > 1 && decode_s > 0 ? double(generated.size() - 1) / decode_s : 0.0;
  std::fprintf(stderr, "prompt %zu tokens in %.3f s; %zu tokens generated, %.1f tok/s decode; logits %s\n",
               prompt_tokens.size(), r.prefill_seconds, generated.size(), decode_tps, fp);
  if (json) {
    nlohmann::json out = {{"token_ids", generated},
                          {"logprobs", r.logprobs},
                          {"text", text},
                          {"finish_reason", r.finish_reason},
                          {"prompt_tokens", prompt_tokens.size()},
                          {"fingerprint", fp}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.empty() ? nlohmann::json(generated).dump().c_str() : text.c_str());
  }
  return 0;
}

}  // namespace tetra::cli

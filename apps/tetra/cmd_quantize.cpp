// tetra quantize: BF16 checkpoint -> NVFP4 checkpoint as ModelOpt exports it (tetra, vLLM and
// SGLang read it). The work is formats/quantize_checkpoint; this file parses flags and shows
// progress.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "formats/quantize_checkpoint.h"
#include "progress.h"
#include "runtime/calibrate.h"
#ifdef TETRA_HAVE_TOKENIZER
#include "tokenizer/tokenizer.h"
#endif

namespace tetra::cli {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Quantize a BF16 checkpoint's MLP linears to NVFP4 (ModelOpt format).",
               "tetra quantize"};
  app.option_defaults()->always_capture_default();
  std::string model_dir, out_dir, scheme = "nvfp4", calib;
  app.add_option("--model", model_dir, "BF16 model folder (config.json + safetensors)")
      ->required();
  app.add_option("--out", out_dir, "output folder (must not exist)")->required();
  app.add_option("--scheme", scheme, "quantization scheme (nvfp4)");
  app.add_option("--calib", calib,
                 "text to calibrate activation scales on (W4A4 NVFP4), or a .json list of token "
                 "ids; without it the checkpoint is W4A16_NVFP4");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  TETRA_CHECK(scheme == "nvfp4", "unknown --scheme '", scheme, "' (tetra quantizes to nvfp4)");
  QuantizeOptions opt;
  opt.src = model_dir;
  opt.dst = out_dir;
  TETRA_CHECK(std::filesystem::is_directory(opt.src), "model folder ", model_dir, " does not exist");
  TETRA_CHECK(!std::filesystem::exists(opt.dst), "output folder ", out_dir,
              " already exists; choose a new one (tetra quantize never overwrites)");
  if (!calib.empty()) {
    std::ifstream in(calib, std::ios::binary);
    TETRA_CHECK(in, "cannot read the calibration text ", calib);
    std::stringstream text;
    text << in.rdbuf();
    std::vector<int32_t> tokens;
    if (calib.ends_with(".json")) {  // token ids, for models without a tokenizer
      try {
        tokens = nlohmann::json::parse(text.str()).get<std::vector<int32_t>>();
      } catch (const nlohmann::json::exception&) {
        fail("--calib ", calib, " is not a JSON list of token ids (a .json file must be one)");
      }
    } else {
#ifdef TETRA_HAVE_TOKENIZER
      TETRA_CHECK(tok::has_tokenizer(opt.src), "--calib needs ", (opt.src / "tokenizer.json").string(),
                  " (or tiktoken.model) to tokenize the text (or give token ids as a .json list)");
      for (auto id : tok::Tokenizer::load(opt.src).encode(text.str())) tokens.push_back(int32_t(id));
#else
      fail("--calib with a text needs a build with the tokenizer (or give token ids as a .json list)");
#endif
    }
    TETRA_CHECK(!tokens.empty(), "the calibration text ", calib, " encodes to no tokens");
    // The BF16 model runs over the text on the CPU; each MLP linear's largest input becomes
    // its input_scale (W4A4).
    Progress calib_progress("calibrating on " + std::to_string(tokens.size()) + " tokens", "tokens");
    runtime::CalibrateOptions copt;
    copt.on_progress = [&](int64_t done, int64_t) { calib_progress.update(done, 0); };
    opt.input_amax = runtime::calibrate_input_amax(opt.src, tokens, copt);
    calib_progress.finish(int64_t(tokens.size()), 0);
  }
  // The label carries the totals, known from the first report on.
  std::optional<Progress> progress;
  int64_t n_done = 0, bytes_done = 0;
  opt.on_progress = [&](int64_t done, int64_t n_total, int64_t bytes, int64_t bytes_total) {
    if (!progress)
      progress.emplace("quantizing " + std::to_string(n_total) + " tensors, " +
                       format_bytes(double(bytes_total)));
    n_done = done;
    bytes_done = bytes;
    progress->update(done, bytes);
  };
  const QuantizeSummary s = quantize_checkpoint(opt);
  if (progress) progress->finish(n_done, bytes_done);
  std::fprintf(stderr, "%s: %lld linear weights quantized, %lld tensors copied, %s -> %s (%s)\n",
               out_dir.c_str(), static_cast<long long>(s.n_quantized),
               static_cast<long long>(s.n_copied), format_bytes(double(s.bytes_in)).c_str(),
               format_bytes(double(s.bytes_out)).c_str(), s.algo.c_str());
  return 0;
}

}  // namespace tetra::cli

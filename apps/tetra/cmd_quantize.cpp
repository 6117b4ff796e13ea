// tetra quantize: BF16 checkpoint -> NVFP4 checkpoint as ModelOpt exports it (tetra, vLLM and
// SGLang read it). The work is formats/quantize_checkpoint; this file parses flags and shows
// progress.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "formats/quantize_checkpoint.h"
#include "progress.h"

namespace tetra::cli {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Quantize a BF16 checkpoint's MLP linears to NVFP4 (ModelOpt format).",
               "tetra quantize"};
  std::string model_dir, out_dir, scheme = "nvfp4", calib;
  app.add_option("--model", model_dir, "BF16 model folder (config.json + safetensors)")
      ->required();
  app.add_option("--out", out_dir, "output folder (must not exist)")->required();
  app.add_option("--scheme", scheme, "quantization scheme (nvfp4)");
  app.add_option("--calib", calib,
                 "text file to calibrate activation scales on (W4A4 NVFP4); without it the "
                 "checkpoint is W4A16_NVFP4");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  TETRA_CHECK(scheme == "nvfp4", "unknown --scheme '", scheme, "' (tetra quantizes to nvfp4)");
  TETRA_CHECK(calib.empty(),
              "--calib is not available in this build yet: calibration runs the model's forward "
              "pass, which tetra quantize does not drive yet; omit it for a W4A16_NVFP4 checkpoint");

  QuantizeOptions opt;
  opt.src = model_dir;
  opt.dst = out_dir;
  Progress progress("quantizing");
  int64_t n_done = 0, bytes_done = 0;
  opt.on_progress = [&](int64_t done, int64_t, int64_t bytes, int64_t) {
    n_done = done;
    bytes_done = bytes;
    progress.update(done, bytes);
  };
  const QuantizeSummary s = quantize_checkpoint(opt);
  progress.finish(n_done, bytes_done);
  std::fprintf(stderr, "%s: %lld linear weights quantized, %lld tensors copied, %s -> %s (%s)\n",
               out_dir.c_str(), static_cast<long long>(s.n_quantized),
               static_cast<long long>(s.n_copied), format_bytes(double(s.bytes_in)).c_str(),
               format_bytes(double(s.bytes_out)).c_str(), s.algo.c_str());
  return 0;
}

}  // namespace tetra::cli

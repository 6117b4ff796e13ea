#include "device_options.h"

#include <CLI/CLI.hpp>

#include <cstdlib>

namespace tetra::cli {

void add_device_flags(CLI::App& app, DeviceFlags& flags, bool load_format) {
  app.add_option("--device", flags.device, "auto (cuda where a GPU answers, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  if (load_format)
    app.add_option("--load-format", flags.load_format,
                   "auto (the safetensors checkpoint) or dummy (random weights from config.json alone)")
        ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--threads", flags.threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 4096));
  app.add_flag("--disable-pdl", flags.disable_pdl,
               "GPU: launch kernels without programmatic dependent launch (with it, on Hopper, a kernel "
               "starts while the one before it drains)");
  // Checked by backend_options, so a bad value is the flag's one sentence, not CLI11's.
  app.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "the paged KV cache's element type: auto (the backend's own: F32 on the CPU, BF16 on the "
                 "GPU) or fp8_e4m3 (E4M3 bytes with a per-layer scale for K and V, MLA's latent at 1; half "
                 "BF16's bytes)");
  app.add_option("--moe-activation-dtype", flags.moe_activation_dtype,
                 "the activations NVFP4 experts multiply: auto (the model's own, W4A16) or fp8_e4m3 (W4A8: E4M3 "
                 "with a scale per token per 128 channels; the CPU reference only so far)");
}

CLI::Option* add_hf_overrides_flag(CLI::App& app, std::string& overrides) {
  return app.add_option("--hf-overrides,--json-model-override-args", overrides,
                 "a JSON object merged into config.json before it is read, e.g. '{\"num_hidden_layers\": 6}' "
                 "(nested objects merge key by key; fewer layers load only the layers left)");
}

std::string moe_tune_cache_path() {
  if (const char* p = std::getenv("TETRA_MOE_TUNE_CACHE")) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tetra/moe_tune.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tetra/moe_tune.json";
  return {};
}

ops::BackendOptions backend_options(const DeviceFlags& flags) {
  ops::BackendOptions o;
  o.device = flags.device;
  o.n_threads = flags.threads;
  o.pdl = !flags.disable_pdl;
  o.kv_cache_dtype = ops::parse_auto_or_fp8(flags.kv_cache_dtype, "--kv-cache-dtype");
  o.moe_activation_dtype = ops::parse_auto_or_fp8(flags.moe_activation_dtype, "--moe-activation-dtype");
  o.moe_tune_cache = moe_tune_cache_path();
  const char* autotune = std::getenv("TETRA_MOE_AUTOTUNE");
  o.moe_autotune = !(autotune && std::string(autotune) == "0");
  if (flags.device == "cuda")
    TETRA_CHECK(ops::cuda_device_available(), "--device cuda: no CUDA device answers on this machine",
                " (or this build has no CUDA backend); use --device cpu");
  return o;
}

}  // namespace tetra::cli

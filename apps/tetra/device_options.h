// The flags every command that loads a model shares (--device, --load-format, --hf-overrides,
// --disable-pdl, --kv-cache-dtype, --moe-activation-dtype) and what the environment says about the backend (the MoE tuning cache).
// Commands read the environment here; ops never do.
#pragma once

#include <string>

#include "ops/ops.h"

namespace CLI {
class App;
class Option;
}

namespace tetra::cli {

struct DeviceFlags {
  std::string device = "auto";       // auto: cuda where a GPU answers, else cpu
  std::string load_format = "auto";  // auto: the checkpoint's safetensors; dummy: random weights
  int threads = 0;                   // CPU backend threads
  bool disable_pdl = false;          // GPU: kernels launch without programmatic dependent launch
  std::string kv_cache_dtype = "auto";  // auto (the backend's own) or fp8_e4m3
  std::string moe_activation_dtype = "auto";  // auto (W4A16 for NVFP4 experts) or fp8_e4m3 (W4A8)
};

// Adds --device, --threads, --disable-pdl, --kv-cache-dtype and --moe-activation-dtype (and
// --load-format) to a command.
void add_device_flags(CLI::App& app, DeviceFlags& flags, bool load_format = true);

// Adds --hf-overrides (SGLang's --json-model-override-args): a JSON object merged into
// config.json wherever the command reads it (formats/config_overrides.h). The text is checked
// where the config is read, so a bad value is one sentence naming the flag.
CLI::Option* add_hf_overrides_flag(CLI::App& app, std::string& overrides);

// The backend the flags ask for (cuda on a machine without a GPU is one sentence, thrown).
ops::BackendOptions backend_options(const DeviceFlags& flags);

// The MoE tuning cache file: $TETRA_MOE_TUNE_CACHE, else $XDG_CACHE_HOME/tetra/moe_tune.json,
// else ~/.cache/tetra/moe_tune.json; empty when none can be named.
std::string moe_tune_cache_path();

}  // namespace tetra::cli

// The device flags every command that runs a model shares (--device, --load-format) and
// what the environment says about the backend (the MoE tuning cache). Commands read the
// environment here; ops never do.
#pragma once

#include <string>

#include "ops/ops.h"

namespace CLI {
class App;
}

namespace tetra::cli {

struct DeviceFlags {
  std::string device = "auto";       // auto: cuda where a GPU answers, else cpu
  std::string load_format = "auto";  // auto: the checkpoint's safetensors; dummy: random weights
  int threads = 0;                   // CPU backend threads
};

// Adds --device and --threads (and --load-format) to a command.
void add_device_flags(CLI::App& app, DeviceFlags& flags, bool load_format = true);

// The backend the flags ask for (cuda on a machine without a GPU is one sentence, thrown).
ops::BackendOptions backend_options(const DeviceFlags& flags);

// The MoE tuning cache file: $TETRA_MOE_TUNE_CACHE, else $XDG_CACHE_HOME/tetra/moe_tune.json,
// else ~/.cache/tetra/moe_tune.json; empty when none can be named.
std::string moe_tune_cache_path();

}  // namespace tetra::cli

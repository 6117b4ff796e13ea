// Activation calibration for W4A4 NVFP4 (`tetra quantize --calib`): runs the BF16 model over
// calibration tokens and records the largest |input| each MLP linear sees, which becomes its
// input_scale = amax / (6 * 448). As ModelOpt calibrates MoE layers, every token is also run
// through every routed expert for the record (so experts the router rarely picks still get a
// real amax); the layer's output keeps the router's own top-k.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tetra::runtime {

struct CalibrateOptions {
  int64_t window = 512;  // tokens per forward (each window is a fresh sequence)
  int n_threads = 0;     // CPU threads (0 = all cores)
  // After each window: tokens done, total.
  std::function<void(int64_t, int64_t)> on_progress;
};

// module name (tensor name without ".weight") -> max |input| over the calibration tokens, for
// every linear the model ran (attention and routers included; the quantizer reads the MLP ones).
std::map<std::string, float> calibrate_input_amax(const std::filesystem::path& model_dir,
                                                  const std::vector<int32_t>& tokens,
                                                  const CalibrateOptions& options);

}  // namespace tetra::runtime

// `tetra bench moe`: the whole MoE layer (router logits -> combined output) on the GPU, NVFP4
// weights against the same layer with BF16 weights through cuBLAS and with FP8 weights and
// activations through cuBLASLt, per token count.
#pragma once

#include <string>
#include <vector>

namespace tetra::bench {

struct MoeBenchOptions {
  std::vector<std::string> shapes{"glm5", "deepseek-v3", "qwen3-30b"};
  std::vector<int> tokens{1, 4, 16, 64, 256, 1024, 4096, 16384};
  std::vector<std::string> routings{"uniform", "skewed"};
  int iters = 30;            // timed runs per measurement (median, min, max reported)
  int tile_tokens = 0;       // force a GEMM tile (8, 16, 32, 64, 128, 192, 256); 0 = the tuner's choice
  bool fused = false;        // force the fused decode kernel (tile_tokens 8)
  bool sweep_tiles = false;  // also time every tile (and the fused kernel where it takes T) and report each
  bool breakdown = false;    // also time each stage (route, permute, gate_up, down, combine)
  bool baseline = true;      // BF16 (cuBLAS) and FP8 (cuBLASLt) baselines in the same run
  bool json = false;
  bool verbose = false;
  std::string tune_cache;    // the MoE tuning cache file ("" keeps tunings in memory)
};

// Runs the benchmark and prints a table (or one JSON object) on stdout. Returns the exit code.
int run_moe_bench(const MoeBenchOptions& options);

}  // namespace tetra::bench

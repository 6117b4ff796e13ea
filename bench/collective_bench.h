// `tetra bench collective`: what the all-reduce after a row-parallel layer costs at decode
// sizes, with the residual add and RMSNorm that follow it: the peer communicator's fused kernel,
// its all-reduce then the norm, NCCL's all-reduce then the norm (ranks on distinct GPUs where
// libnccl loads), and the norm alone. Ranks are threads, one a GPU; with fewer GPUs than ranks
// they share GPU 0, and the figures are then the kernels' and the flags' cost without a link.
// Each is timed as a decode graph runs it: every rank replays a graph of `reps` of them.
#pragma once

#include <vector>

namespace tetra::bench {

struct CollectiveBenchOptions {
  int ranks = 2;
  std::vector<int> tokens{1, 8, 64, 256};
  std::vector<int> hidden{2048, 6144};  // Qwen3-30B-A3B's and GLM-5's hidden sizes
  int iters = 30;                       // graph replays per measurement (median, min, max)
  int reps = 20;                        // collectives a graph; the figures are per collective
  bool json = false;
};

// Runs the benchmark and prints a table (or one JSON object) on stdout. Returns the exit code.
int run_collective_bench(const CollectiveBenchOptions& options);

}  // namespace tetra::bench

// `tetra bench linear`: a model's dense BF16 decode linears (q/k/v in one launch, or MLA's q_a
// and kv_a; q_b, o_proj, the router, lm_head) on the GPU at a few tokens, through each kernel
// that takes them: the GEMV (1-8 tokens), the wgmma skinny kernel (1-64) and cuBLASLt (any).
// Each is timed as the step runs it: a CUDA graph of launches over as many copies of the
// weights as keep L2 from serving them, with PDL where the kernel has it. The path the engine
// takes (ops/cuda/linear_path.h) is marked.
#pragma once

#include <string>
#include <vector>

namespace tetra::bench {

struct LinearBenchOptions {
  std::vector<std::string> shapes{"qwen3-30b"};
  std::vector<int> tokens{1, 8, 9, 16, 32, 64, 128};
  int iters = 30;  // graph replays per measurement (median, min, max reported)
  bool json = false;
};

// Runs the benchmark and prints a table (or one JSON object) on stdout. Returns the exit code.
int run_linear_bench(const LinearBenchOptions& options);

}  // namespace tetra::bench

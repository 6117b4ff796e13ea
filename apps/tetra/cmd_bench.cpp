// tetra bench: kernel and serving benchmarks, one subcommand each (`tetra bench moe ...`).
// They report numbers; they never decide pass or fail.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "device_options.h"
#include "core/error.h"
#ifdef TETRA_HAVE_BENCH_MOE
#include "bench/collective_bench.h"
#include "bench/linear_bench.h"
#include "bench/moe_bench.h"
#endif

namespace tetra::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// --tokens, --hidden: comma-separated integers (the benchmark checks their range).
std::vector<int> int_list(const std::string& s, const char* flag) {
  std::vector<int> out;
  for (const std::string& t : split_list(s)) {
    try {
      out.push_back(std::stoi(t));
    } catch (const std::exception&) {
      fail(flag, " takes comma-separated integers, not '", t, "'");
    }
  }
  return out;
}

std::vector<int> token_counts(const std::string& s) { return int_list(s, "--tokens"); }

int bench_moe(int argc, char** argv) {
  CLI::App app{"The NVFP4 MoE layer on the GPU against BF16 weights through cuBLAS and FP8 weights through "
               "cuBLASLt, per token count.",
               "tetra bench moe"};
  app.option_defaults()->always_capture_default();
  std::string shapes = "glm5,deepseek-v3,qwen3-30b", tokens = "1,4,16,64,256,1024,4096,16384";
  std::string routing = "uniform,skewed";
  int iters = 30, tile = 0;
  bool sweep = false, breakdown = false, no_baseline = false, json = false, verbose = false, fused = false;
  app.add_option("--shape", shapes, "comma-separated shapes: glm5, deepseek-v3, qwen3-30b");
  app.add_option("--tokens", tokens, "comma-separated token counts (1..65536)");
  app.add_option("--routing", routing, "comma-separated routings: uniform, skewed");
  app.add_option("--iters", iters, "timed runs per measurement (at least 20 for published numbers)")
      ->check(CLI::Range(1, 10000));
  app.add_option("--tile", tile, "force the GEMM tile width in tokens (8, 16, 32, 64, 128, 192, 256)")
      ->check(CLI::IsMember({0, 8, 16, 32, 64, 128, 192, 256}));
  app.add_flag("--fused", fused,
               "force the fused decode kernel (the whole layer in one launch, items of 8 tokens; up to 64 tokens)")
      ->excludes("--tile");
  app.add_flag("--sweep", sweep,
               "also time every tile width, tiles of 8 with each wider tile for the experts with more rows, "
               "and the fused decode kernel, and print each");
  app.add_flag("--breakdown", breakdown, "also time each stage of the layer alone");
  app.add_flag("--no-baseline", no_baseline, "skip the BF16 cuBLAS and FP8 cuBLASLt baselines");
  app.add_flag("--json", json, "print one JSON object on stdout");
  app.add_flag("--verbose", verbose, "say which configuration was chosen and why");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<int> token_list = token_counts(tokens);  // a bad list is named in any build
#ifdef TETRA_HAVE_BENCH_MOE
  bench::MoeBenchOptions opt;
  opt.shapes = split_list(shapes);
  opt.tokens = token_list;
  opt.routings = split_list(routing);
  opt.iters = iters;
  opt.tile_tokens = fused ? 8 : tile;
  opt.fused = fused;
  opt.sweep_tiles = sweep;
  opt.breakdown = breakdown;
  opt.baseline = !no_baseline;
  opt.json = json;
  opt.verbose = verbose;
  opt.tune_cache = moe_tune_cache_path();
  return bench::run_moe_bench(opt);
#else
  (void)verbose, (void)token_list;
  std::fprintf(stderr, "tetra bench moe: this build has no CUDA backend; rebuild with -DTETRA_CUDA=ON\n");
  return 1;
#endif
}

int bench_linear(int argc, char** argv) {
  CLI::App app{"A model's dense BF16 decode linears on the GPU through each kernel that takes them (GEMV, "
               "wgmma skinny, cuBLASLt), per token count.",
               "tetra bench linear"};
  app.option_defaults()->always_capture_default();
  std::string shapes = "qwen3-30b", tokens = "1,8,9,16,32,64,128";
  int iters = 30;
  bool json = false;
  app.add_option("--shape", shapes, "comma-separated shapes: qwen3-30b, glm5, deepseek-v3");
  app.add_option("--tokens", tokens, "comma-separated token counts (1..4096)");
  app.add_option("--iters", iters, "timed graph replays per measurement")->check(CLI::Range(1, 10000));
  app.add_flag("--json", json, "print one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<int> token_list = token_counts(tokens);  // a bad list is named in any build
#ifdef TETRA_HAVE_BENCH_MOE
  bench::LinearBenchOptions opt;
  opt.shapes = split_list(shapes);
  opt.tokens = token_list;
  opt.iters = iters;
  opt.json = json;
  return bench::run_linear_bench(opt);
#else
  (void)json, (void)token_list;
  std::fprintf(stderr, "tetra bench linear: this build has no CUDA backend; rebuild with -DTETRA_CUDA=ON\n");
  return 1;
#endif
}

int bench_collective(int argc, char** argv) {
  CLI::App app{"The all-reduce after a row-parallel layer with the add and RMSNorm after it, at decode sizes: "
               "the peer communicator fused and apart, NCCL where the ranks have GPUs of their own.",
               "tetra bench collective"};
  app.option_defaults()->always_capture_default();
  std::string tokens = "1,8,64,256", hidden = "2048,6144";
  int ranks = 2, iters = 30, reps = 20;
  bool json = false;
  app.add_option("--ranks", ranks, "ranks, one a GPU (all on GPU 0 when there are fewer)")->check(CLI::Range(2, 8));
  app.add_option("--tokens", tokens, "comma-separated token counts (1..4096)");
  app.add_option("--hidden", hidden, "comma-separated hidden sizes (512..8192)");
  app.add_option("--iters", iters, "timed graph replays per measurement")->check(CLI::Range(1, 10000));
  app.add_option("--reps", reps, "collectives a graph (the figures are per collective)")->check(CLI::Range(1, 1000));
  app.add_flag("--json", json, "print one JSON object on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::vector<int> token_list = token_counts(tokens), hidden_list = int_list(hidden, "--hidden");
#ifdef TETRA_HAVE_BENCH_MOE
  bench::CollectiveBenchOptions opt;
  opt.ranks = ranks;
  opt.tokens = token_list;
  opt.hidden = hidden_list;
  opt.iters = iters;
  opt.reps = reps;
  opt.json = json;
  return bench::run_collective_bench(opt);
#else
  (void)json, (void)token_list, (void)hidden_list;
  std::fprintf(stderr, "tetra bench collective: this build has no CUDA backend; rebuild with -DTETRA_CUDA=ON\n");
  return 1;
#endif
}

}  // namespace

int cmd_bench_decode(int argc, char** argv);  // cmd_bench_decode.cpp
#ifdef TETRA_HAVE_SERVER
int cmd_bench_serving(int argc, char** argv);  // cmd_bench_serving.cpp
#endif

namespace {

struct Sub {
  const char* name;
  const char* summary;
  int (*run)(int, char**);
};

const Sub kSubs[] = {
    {"moe", "the MoE layer on the GPU: NVFP4 against BF16 cuBLAS and FP8 cuBLASLt", bench_moe},
    {"linear", "a model's dense decode linears on the GPU, through each kernel that takes them", bench_linear},
    {"collective", "the all-reduce after a row-parallel layer with its add and RMSNorm, fused and apart",
     bench_collective},
    {"decode", "decode steps of the engine in-process: time, byte floor, breakdown by op class", cmd_bench_decode},
#ifdef TETRA_HAVE_SERVER
    {"serving", "an OpenAI-compatible server under random load (SGLang's bench_serving)", cmd_bench_serving},
#endif
};

}  // namespace

int cmd_bench(int argc, char** argv) {
  auto usage = [](FILE* f) {
    std::fprintf(f, "usage: tetra bench <benchmark> [options]\n\nbenchmarks:\n");
    for (const Sub& s : kSubs) std::fprintf(f, "  %-10s %s\n", s.name, s.summary);
  };
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Sub& s : kSubs) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    std::string prog = std::string("tetra bench ") + s.name;
    argv[1] = prog.data();
    return s.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "tetra bench: unknown benchmark '%s' (try `tetra bench --help`)\n", argv[1]);
  return 2;
}

}  // namespace tetra::cli

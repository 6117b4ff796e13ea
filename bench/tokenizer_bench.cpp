// Tokenizer throughput on one core: MB/s of encoding a text file line by line (as prompts
// arrive), after a warm-up pass. Reports, never judges; bench/tokenizer_bench.sh runs it
// side by side with the @lenml/tokenizers reference on the same files.
// usage: tokenizer_bench MODEL_DIR TEXT_FILE [--repeat N]
#include <chrono>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

// CPU time of this thread: on a shared machine wall time measures the neighbours too.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench MODEL_DIR TEXT_FILE [--repeat N]\n");
    return 2;
  }
  int repeat = 3;
  if (argc >= 5 && !std::strcmp(argv[3], "--repeat")) repeat = std::max(1, std::atoi(argv[4]));
  try {
    auto t0 = std::chrono::steady_clock::now();
    tetra::tok::Tokenizer tok = tetra::tok::Tokenizer::load(argv[1]);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ifstream in(argv[2], std::ios::binary);
    TETRA_CHECK(in, "cannot open ", argv[2]);
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    std::vector<std::string_view> lines;  // each line keeps its newline, like the node bench
    for (size_t b = 0; b < text.size();) {
      size_t e = text.find('\n', b);
      e = e == std::string::npos ? text.size() : e + 1;
      lines.push_back(std::string_view(text).substr(b, e - b));
      b = e;
    }
    size_t n_tokens = 0;
    for (std::string_view l : lines) n_tokens += tok.encode(l).size();  // warm-up
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < repeat; ++r) {
      auto start = std::chrono::steady_clock::now();
      double cpu0 = thread_cpu_seconds();
      size_t n = 0;
      for (std::string_view l : lines) n += tok.encode(l).size();
      best_cpu = std::min(best_cpu, thread_cpu_seconds() - cpu0);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      n_tokens = n;
    }
    // The whole file as one string: the cost of a long prompt.
    double cpu0 = thread_cpu_seconds();
    size_t n_whole = tok.encode(text).size();
    double whole_cpu = thread_cpu_seconds() - cpu0;
    std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"cpu_seconds\": %.4f, \"mb_per_cpu_s\": %.2f, "
                "\"wall_mb_per_s\": %.2f, \"whole_text_mb_per_cpu_s\": %.2f, \"whole_text_tokens\": %zu, "
                "\"load_seconds\": %.3f}\n",
                text.size(), n_tokens, best_cpu, text.size() / 1e6 / best_cpu, text.size() / 1e6 / best,
                text.size() / 1e6 / whole_cpu, n_whole, load_s);
  } catch (const tetra::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

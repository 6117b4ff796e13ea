// Runs a libFuzzer target without libFuzzer, for ctest: every seed, then deterministic
// random mutations (byte flips, inserts, deletes, splices) for a fixed number of rounds.
// This is a smoke run on every build; real fuzzing uses -DTETRA_FUZZ=ON with clang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
std::vector<std::string> tetra_fuzz_seeds();

int main(int argc, char** argv) {
  long rounds = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 3000;
  std::vector<std::string> seeds = tetra_fuzz_seeds();
  std::mt19937_64 rng(12345);
  const std::string interesting[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "(", ")", "[", "]", "'", "\"",
                                     "\\", "<|im_end|>", "\xF0\x9F", "\xFF", std::string(1, '\0'), " ", "\n",
                                     "for", "endfor", "if", "endif", "macro", "|", ".", ",", "**", "~"};
  auto run = [](const std::string& s) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  for (const std::string& s : seeds) run(s);
  for (long r = 0; r < rounds; ++r) {
    std::string s = seeds[rng() % seeds.size()];
    int n_mut = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n_mut; ++k) {
      size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
      switch (rng() % 5) {
        case 0: if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng()); break;
        case 1: s.insert(pos, 1, static_cast<char>(rng())); break;
        case 2: if (pos < s.size()) s.erase(pos, 1 + rng() % 8); break;
        case 3: s.insert(pos, interesting[rng() % (sizeof interesting / sizeof interesting[0])]); break;
        case 4: {
          const std::string& o = seeds[rng() % seeds.size()];
          size_t b = o.empty() ? 0 : rng() % o.size();
          s.insert(pos, o.substr(b, rng() % 64));
          break;
        }
      }
    }
    run(s);
  }
  std::printf("%ld mutated inputs and %zu seeds ran without a crash\n", rounds, seeds.size());
  return 0;
}

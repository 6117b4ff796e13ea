// The smallest program that embeds tetra: load a checkpoint folder, tokenize a prompt, run
// greedy generation on the CPU backend, print the text. Usage: embed MODEL_DIR PROMPT [N]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "model/model.h"
#include "ops/ops.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: embed MODEL_DIR PROMPT [MAX_NEW_TOKENS]\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const auto tokenizer = tetra::tok::Tokenizer::load(dir);
    auto backend = tetra::ops::make_cpu_backend(1);
    auto model = tetra::model::load_model(dir, *backend);

    std::vector<int32_t> prompt;
    for (auto id : tokenizer.encode(argv[2])) prompt.push_back(int32_t(id));
    tetra::runtime::GenerateOptions options;
    options.max_new_tokens = argc > 3 ? std::atoi(argv[3]) : 8;
    options.sampling.temperature = 0;  // greedy
    const auto result = tetra::runtime::generate(*model, *backend, prompt, options);

    std::vector<tetra::tok::TokenId> ids(result.token_ids.begin(), result.token_ids.end());
    std::printf("%s\n", tokenizer.decode(ids).c_str());
    std::fprintf(stderr, "%zu tokens, finish_reason %s\n", ids.size(), result.finish_reason.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: %s\n", e.what());
    return 1;
  }
}

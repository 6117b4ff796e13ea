// tetra: dispatches `tetra <command> ...` to the command's own parser.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "core/error.h"

namespace tetra::cli {
// One declaration and one table row per command.
int cmd_bench(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
#ifdef TETRA_HAVE_SERVER
int cmd_serve(int argc, char** argv);
#endif
#ifdef TETRA_HAVE_TOKENIZER
int cmd_tokenize(int argc, char** argv);
#endif
}  // namespace tetra::cli

namespace {

using tetra::cli::Command;

const Command kCommands[] = {
    {"inspect", "describe a model folder: architecture, sizes, tensors", tetra::cli::cmd_inspect},
    {"generate", "generate tokens from a prompt", tetra::cli::cmd_generate},
    {"bench", "benchmarks: tetra bench moe | decode | serving", tetra::cli::cmd_bench},
    {"eval", "perplexity, KL divergence and top-1 agreement against a reference model",
     tetra::cli::cmd_eval},
    {"quantize", "quantize a BF16 checkpoint to NVFP4 (ModelOpt format)", tetra::cli::cmd_quantize},
#ifdef TETRA_HAVE_SERVER
    {"serve", "serve a model over an OpenAI-compatible HTTP API", tetra::cli::cmd_serve},
#endif
#ifdef TETRA_HAVE_TOKENIZER
    {"tokenize", "token ids of a text, a JSONL file of texts, or a chat", tetra::cli::cmd_tokenize},
#endif
};

void print_usage(FILE* out) {
  std::fprintf(out, "usage: tetra <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands)
    if (c.run) std::fprintf(out, "  %-16s %s\n", c.name, c.summary);
  std::fprintf(out, "\n`tetra <command> --help` describes a command's options; `tetra --version` the build.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V"))) {
    std::printf("tetra %s\n", tetra::cli::version_string().c_str());
    return 0;
  }
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (!c.run || std::strcmp(argv[1], c.name) != 0) continue;
    std::string prog = std::string("tetra ") + c.name;
    argv[1] = prog.data();
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const tetra::Error& e) {
      std::fprintf(stderr, "tetra %s: %s\n", c.name, e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "tetra %s: out of memory\n", c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tetra %s: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "tetra: unknown command '%s' (try `tetra --help`)\n", argv[1]);
  return 2;
}

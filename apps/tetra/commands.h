// The subcommands of the tetra CLI. Each is defined in its own cmd_<name>.cpp, parses its own
// flags (CLI11), prints one clear sentence on stderr for bad input, and returns the exit code.
#pragma once

#include <string>

namespace tetra::cli {

// "0.1.0 (commit 1a2b3c4d5e6f)", or "0.1.0" outside a git checkout (version.cpp).
std::string version_string();

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  // argv[0] is "tetra <name>"
};

}  // namespace tetra::cli

// The subcommands of the tetra CLI. Each is defined in its own cmd_<name>.cpp, parses its own
// flags (CLI11), prints one clear sentence on stderr for bad input, and returns the exit code.
#pragma once

namespace tetra::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  // argv[0] is "tetra <name>"
};

}  // namespace tetra::cli

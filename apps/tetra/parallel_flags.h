// --tp and --ep, for the commands that run a model on several ranks (serve, generate, eval,
// bench decode).
#pragma once

#include "parallel/sharding.h"

namespace CLI {
class App;
}

namespace tetra::cli {

void add_parallel_flags(CLI::App& app, parallel::Parallelism& p);
// Throws one sentence for a pair tetra does not run (checked before anything loads).
void check_parallel_flags(const parallel::Parallelism& p);

}  // namespace tetra::cli

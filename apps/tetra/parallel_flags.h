// --tp and --ep, for the commands that run a model on several ranks (serve, generate, eval,
// bench decode).
#pragma once

#include "parallel/node_group.h"
#include "parallel/sharding.h"

namespace CLI {
class App;
}

namespace tetra::cli {

void add_parallel_flags(CLI::App& app, parallel::Parallelism& p);
// Throws one sentence for a pair tetra does not run (checked before anything loads).
void check_parallel_flags(const parallel::Parallelism& p);

// --nnodes, --node-rank, --dist-init-addr, --dist-timeout: one server over several hosts
// (serve; parallel/node_group.h).
void add_node_flags(CLI::App& app, parallel::NodeOptions& o);

}  // namespace tetra::cli

#include "parallel_flags.h"

#include <CLI/CLI.hpp>

namespace tetra::cli {

void add_parallel_flags(CLI::App& app, parallel::Parallelism& p) {
  app.add_option("--tp", p.tp,
                 "tensor-parallel size: attention heads, dense MLPs and the shared expert split over this many "
                 "ranks (a GPU each, or threads sharing the CPU)")
      ->check(CLI::Range(1, 64));
  app.add_option("--ep", p.ep,
                 "expert-parallel size: routed experts split by id over this many ranks; it must divide --tp "
                 "(equal it, or 1 to split each expert's width instead), or --tp be 1; the ranks are the "
                 "larger of the two")
      ->check(CLI::Range(1, 64));
}

void check_parallel_flags(const parallel::Parallelism& p) { parallel::check_parallelism(p); }

void add_node_flags(CLI::App& app, parallel::NodeOptions& o) {
  app.add_option("--nnodes", o.nnodes,
                 "hosts the --tp/--ep ranks are spread over, as many on each; start the same command on each "
                 "with its --node-rank. Node 0 serves the API; the others run their ranks' share of its steps")
      ->check(CLI::Range(1, 64));
  app.add_option("--node-rank", o.node_rank, "this host's place among the --nnodes (0 serves the API)")
      ->check(CLI::Range(0, 63));
  app.add_option("--dist-init-addr", o.dist_init_addr,
                 "HOST:PORT where node 0 listens for the other nodes and they connect (with --nnodes > 1)");
  app.add_option("--dist-timeout", o.timeout_s, "seconds to wait for every node to join")
      ->check(CLI::Range(1.0, 86400.0));
}

}  // namespace tetra::cli

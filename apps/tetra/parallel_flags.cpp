#include "parallel_flags.h"

#include <CLI/CLI.hpp>

namespace tetra::cli {

void add_parallel_flags(CLI::App& app, parallel::Parallelism& p) {
  app.add_option("--tp", p.tp,
                 "tensor-parallel size: attention heads, dense MLPs and the shared expert split over this many "
                 "ranks (CPU only so far: --device cpu)")
      ->check(CLI::Range(1, 64));
  app.add_option("--ep", p.ep,
                 "expert-parallel size: routed experts split by id over this many ranks; it must divide --tp "
                 "(equal it, or 1 to split each expert's width instead), or --tp be 1; the ranks are the "
                 "larger of the two")
      ->check(CLI::Range(1, 64));
}

void check_parallel_flags(const parallel::Parallelism& p) { parallel::check_parallelism(p); }

}  // namespace tetra::cli

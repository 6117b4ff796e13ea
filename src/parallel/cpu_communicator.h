// Ranks that are threads of one process, sharing memory: the communicator of the CPU backend
// (and of the CI tests that run the sharded model on it). Collectives meet at a barrier; the
// sum is taken in rank order, so it is deterministic and the same bits land on every rank.
#pragma once

#include <memory>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

// One communicator per rank, all joined (rank i is element i).
std::vector<std::unique_ptr<ops::Communicator>> make_cpu_communicators(int n_ranks);

}  // namespace tetra::parallel

// CPU ranks on several nodes (--nnodes with --device cpu): every pair of ranks joined by a TCP
// connection of its own, made at startup through the node group. A collective sends this
// rank's tensor to every other rank and receives theirs (all at once, so no pair waits on the
// other's send), then sums in rank order as the CPU communicator does: the same bits on every
// rank, and the same as ranks that are threads of one process. For the tests and small CPU
// groups; GPUs on several nodes meet through NCCL.
#pragma once

#include <memory>
#include <vector>

#include "ops/communicator.h"
#include "parallel/node_group.h"

namespace tetra::parallel {

// One communicator for each of this node's n_local ranks (global ranks first_rank on), out of
// world ranks spread evenly over the nodes. Collective over the nodes: each calls it once.
std::vector<std::unique_ptr<ops::Communicator>> make_tcp_communicators(NodeGroup& nodes, int first_rank, int n_local,
                                                                       int world);

}  // namespace tetra::parallel

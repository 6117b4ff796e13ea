// The GPUs of one host joined by NCCL, one communicator per GPU, all made at once by one
// process that drives every GPU from a thread of its own (the ranks of runtime::ModelRanks).
// Several hosts join through NCCL's own bootstrap, from an id node 0 sends them. Built where
// nccl.h is found (TETRA_HAVE_NCCL); libnccl itself is loaded at the first call
// (nccl_library.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

class NodeGroup;

// Rank i drives devices[i] (distinct GPUs: NCCL refuses two ranks on one). Collectives run on
// the stream in the Context they are given. Throws one sentence where NCCL cannot be loaded.
std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices);

// This node's ranks of a group over several nodes (parallel/node_group.h): devices[i] holds
// global rank first_rank + i of world. Node 0 makes NCCL's id and sends it to the others
// (NCCL's own bootstrap then joins them); collective over the nodes, each calls it once.
std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                        NodeGroup& nodes, int first_rank, int world);

// Whether libnccl loads; if not, why (the sentence make_nccl_communicators would throw). Where
// it does, `description` says which library and version.
bool nccl_loads(std::string* why_not, std::string* description = nullptr);

}  // namespace tetra::parallel

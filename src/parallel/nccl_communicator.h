// The GPUs of one host joined by NCCL, one communicator per GPU, all made at once by one
// process that drives every GPU from a thread of its own (the ranks of runtime::ModelRanks).
// Written against ops::Communicator for the GPU step of tensor and expert parallelism; built
// with -DTETRA_NCCL=ON in a CUDA build, and not yet run on more than one GPU.
#pragma once

#include <memory>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

// Rank i drives devices[i]. Collectives run on the stream in the Context they are given.
std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices);

}  // namespace tetra::parallel

// The GPUs of one host joined by NCCL, one communicator per GPU, all made at once by one
// process that drives every GPU from a thread of its own (the ranks of runtime::ModelRanks).
// Built where nccl.h is found (TETRA_HAVE_NCCL); libnccl itself is loaded at the first call
// (nccl_library.h). Run with one GPU so far: no machine with several has been lent.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

// Rank i drives devices[i] (distinct GPUs: NCCL refuses two ranks on one). Collectives run on
// the stream in the Context they are given. Throws one sentence where NCCL cannot be loaded.
std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices);

// Whether libnccl loads; if not, why (the sentence make_nccl_communicators would throw). Where
// it does, `description` says which library and version.
bool nccl_loads(std::string* why_not, std::string* description = nullptr);

}  // namespace tetra::parallel

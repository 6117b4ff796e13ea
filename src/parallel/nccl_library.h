// NCCL, loaded when a model is first split over GPUs rather than linked: tetra runs on
// machines without it (one GPU needs none), and a multi-GPU host brings its own (the CUDA
// toolkit's, or pip's nvidia-nccl-cu13). Only the calls tetra makes are resolved.
#pragma once

#include <nccl.h>

#include <string>

namespace tetra::parallel {

struct NcclLibrary {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetErrorString) get_error_string;
  decltype(&ncclCommInitAll) comm_init_all;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) comm_init_rank;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclCommDestroy) comm_destroy;
  decltype(&ncclCommAbort) comm_abort;
  decltype(&ncclCommRevoke) comm_revoke = nullptr;  // NCCL 2.28 on; null where the library lacks it
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclAllGather) all_gather;
  std::string path;  // what was loaded
  int version = 0;   // NCCL_VERSION_CODE of the loaded library, e.g. 22809
};

// The library at $TETRA_NCCL_LIBRARY, else libnccl.so.2 from the loader's search path; loaded
// once and kept for the process. Throws one sentence (what was tried, how to supply it) when
// it cannot be loaded or lacks a symbol.
const NcclLibrary& nccl_library();

}  // namespace tetra::parallel

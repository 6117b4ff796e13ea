// Ranks that are threads of one process, each driving a CUDA device, joined without NCCL: the
// fallback where NCCL is not built, and how the sharded CUDA model is tested on one GPU (several
// ranks on the same device). Devices may repeat, or be distinct GPUs of one host that can read
// each other's memory (peer access, enabled when the communicators are made).
//
// A collective is synchronised on the host: each rank waits for its stream, meets the others at
// a barrier (parallel/rank_barrier.h), reads every rank's tensor directly, waits again and meets
// them once more. The sum is taken in rank order in f32 (BF16 rounded once at the end), so it is
// deterministic and the same bits land on every rank, as with the CPU communicator. Because it
// waits on the host it is slow, and it cannot be captured in a CUDA graph: a collective on a
// stream that is being captured throws.
#pragma once

#include <memory>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

// One communicator per rank, all joined: rank i runs on CUDA device devices[i] (1 to 8 ranks).
// Collectives run on the stream in the Context they are given; tensors live on the rank's
// device. Throws if two of the devices cannot access each other's memory.
std::vector<std::unique_ptr<ops::Communicator>> make_cuda_thread_communicators(const std::vector<int>& devices);

}  // namespace tetra::parallel

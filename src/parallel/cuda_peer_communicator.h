// Ranks that are threads of one process, each driving a CUDA device (one GPU shared, or GPUs
// that can read each other's memory), joined through peer memory: the one-shot collectives of
// ops/cuda/peer_all_reduce.h. Nothing waits on the host, so the collectives run inside CUDA
// graphs; and the all-reduce after a row-parallel layer is fused with the residual add and
// RMSNorm that follow it (all_reduce_sum_add_rms_norm).
//
// Messages up to the staging size (8 MiB a rank) go through peer memory. Larger ones (prompt
// steps) go to `large` where it is given (NCCL over several GPUs: a ring moves fewer bytes than
// every rank reading every other's whole message); without it they take several launches here.
// Sums are taken in rank order in f32, so every rank gets the same bits.
//
// Outside a graph, while a step's arena still grows and whenever ranks share a GPU, the ranks
// also meet on the host around each collective (see launch() for why); serving steps on
// distinct GPUs never do.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/communicator.h"

namespace tetra::parallel {

// The largest message a rank sends through peer memory in one launch: a staging half. It holds a
// decode step's hidden states many times over (256 rows of 7,168 BF16 values are 3.5 MiB);
// larger messages go to `large` where there is one.
constexpr int64_t kPeerMessageBytes = int64_t(8) << 20;

// One communicator per rank, all joined: rank i runs on CUDA device devices[i] (1 to 8 ranks).
// `large` is empty or one communicator a rank over the same devices. Throws where two of the
// devices cannot reach each other's memory.
std::vector<std::unique_ptr<ops::Communicator>> make_cuda_peer_communicators(
    const std::vector<int>& devices, std::vector<std::unique_ptr<ops::Communicator>> large = {});

}  // namespace tetra::parallel

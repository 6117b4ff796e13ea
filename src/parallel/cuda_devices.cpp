#include "parallel/cuda_devices.h"

#include <cuda_runtime.h>

#include <set>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace tetra::parallel {

RestoreDevice::RestoreDevice() {
  if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
}

RestoreDevice::~RestoreDevice() {
  if (device_ >= 0) cudaSetDevice(device_);
}

bool peers_reach_each_other(const std::vector<int>& devices) {
  const std::set<int> distinct(devices.begin(), devices.end());
  for (int a : distinct)
    for (int b : distinct) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) {
        cudaGetLastError();
        return false;
      }
    }
  return true;
}

void enable_peer_access(const std::vector<int>& devices) {
  const std::set<int> distinct(devices.begin(), devices.end());
  if (distinct.size() < 2) return;
  RestoreDevice restore;
  for (int a : distinct)
    for (int b : distinct) {
      if (a == b) continue;
      int can = 0;
      TETRA_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      TETRA_CHECK(can, "GPUs ", a, " and ", b,
                  " cannot read each other's memory (no peer access), so ranks on them need NCCL "
                  "(libnccl.so.2, or the file TETRA_NCCL_LIBRARY names)");
      TETRA_CUDA_CHECK(cudaSetDevice(a));
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled)
        cudaGetLastError();  // enabled before, by an earlier group: not an error
      else
        TETRA_CUDA_CHECK(err);
    }
}

void check_devices_exist(const std::vector<int>& devices) {
  int count = 0;
  TETRA_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (size_t r = 0; r < devices.size(); ++r)
    TETRA_CHECK(devices[r] >= 0 && devices[r] < count, "rank ", r, "'s CUDA device ", devices[r],
                " does not exist (this machine has ", count, ")");
}

}  // namespace tetra::parallel

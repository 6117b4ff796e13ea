// Device and pinned host memory for the CUDA backend: owning buffers, the weight arena that
// holds every uploaded weight, and the uploader that streams host bytes (an mmap'd checkpoint)
// to the device through pinned staging, overlapping the file reads with the copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops::cuda {

// Device memory: cudaMalloc, freed on destruction. An allocation failure names the bytes.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(DType dtype, Shape shape);
  ~DeviceBuffer() override;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  TensorView view() const override { return view_; }

 private:
  TensorView view_;
};

// Page-locked host memory the copy engines read and write directly.
class PinnedBuffer final : public Buffer {
 public:
  explicit PinnedBuffer(int64_t bytes);
  ~PinnedBuffer() override;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  TensorView view() const override { return view_; }

 private:
  TensorView view_;
};

// cudaMalloc'd bytes, one allocation; "what" names the allocation in an out-of-memory error.
void* device_alloc(int64_t bytes, const char* what);

// Weights live here for the backend's lifetime: large chunks carved in 256-byte steps, so a
// model of tens of thousands of tensors costs a few hundred allocations, not one each.
class WeightArena {
 public:
  WeightArena() = default;
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  void* alloc(int64_t bytes);
  int64_t bytes_used() const { return used_; }

 private:
  std::vector<void*> chunks_;
  int64_t offset_ = 0, chunk_bytes_ = 0, used_ = 0;
};

// Copies host bytes to the device in slices through a ring of pinned staging buffers: the
// memcpy into one slot (where page faults read the file) overlaps the DMA of the others.
class Uploader {
 public:
  explicit Uploader(cudaStream_t stream, int64_t slot_bytes = int64_t(32) << 20, int n_slots = 4);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Queues dst[0, bytes) = src[0, bytes); src may be freed on return.
  void copy(void* dst, const void* src, int64_t bytes);
  // Waits for every queued copy.
  void finish();
  int64_t bytes_copied() const { return copied_; }

 private:
  cudaStream_t stream_;
  int64_t slot_bytes_;
  std::vector<void*> slots_;
  std::vector<cudaEvent_t> done_;  // recorded after each slot's copy
  int next_ = 0;
  int64_t copied_ = 0;
};

}  // namespace tetra::ops::cuda

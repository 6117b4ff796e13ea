#include "ops/cuda/device_memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/cuda/cuda_check.h"

namespace tetra::ops::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

double gib(int64_t b) { return std::round(double(b) / (1 << 30) * 100) / 100; }

}  // namespace

void* device_alloc(int64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, size_t(std::max<int64_t>(bytes, 1)));
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear it: an allocation failure is not sticky
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    fail("out of GPU memory: ", what, " needs ", gib(bytes), " GiB, ", gib(int64_t(free)), " GiB of ",
         gib(int64_t(total)), " are free");
  }
  TETRA_CUDA_CHECK(err);
  return p;
}

DeviceBuffer::DeviceBuffer(DType dtype, Shape shape) {
  view_.dtype = dtype;
  view_.shape = shape;
  view_.device = Device::Cuda;
  view_.data = device_alloc(view_.nbytes(), "a device buffer");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(view_.data); }

PinnedBuffer::PinnedBuffer(int64_t bytes) {
  view_.dtype = DType::U8;
  view_.shape = {bytes};
  view_.device = Device::Cpu;
  TETRA_CUDA_CHECK(cudaMallocHost(&view_.data, size_t(std::max<int64_t>(bytes, 1))));
  std::memset(view_.data, 0, size_t(bytes));
}

PinnedBuffer::~PinnedBuffer() { cudaFreeHost(view_.data); }

WeightArena::~WeightArena() {
  for (void* c : chunks_) cudaFree(c);
}

void* WeightArena::alloc(int64_t bytes) {
  constexpr int64_t kChunk = int64_t(1) << 30;
  bytes = align_up(std::max<int64_t>(bytes, 1));
  if (chunks_.empty() || offset_ + bytes > chunk_bytes_) {
    // A tensor larger than a chunk gets its own allocation; the current chunk stays open.
    if (bytes > kChunk / 4) {
      chunks_.insert(chunks_.begin(), device_alloc(bytes, "a weight"));
      used_ += bytes;
      return chunks_.front();
    }
    chunks_.push_back(device_alloc(kChunk, "the weights"));
    chunk_bytes_ = kChunk;
    offset_ = 0;
  }
  void* p = static_cast<char*>(chunks_.back()) + offset_;
  offset_ += bytes;
  used_ += bytes;
  return p;
}

Uploader::Uploader(cudaStream_t stream, int64_t slot_bytes, int n_slots)
    : stream_(stream), slot_bytes_(slot_bytes) {
  for (int i = 0; i < n_slots; ++i) {
    void* p = nullptr;
    TETRA_CUDA_CHECK(cudaMallocHost(&p, size_t(slot_bytes)));
    slots_.push_back(p);
    cudaEvent_t e;
    TETRA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    TETRA_CUDA_CHECK(cudaEventRecord(e, stream_));
    done_.push_back(e);
  }
}

Uploader::~Uploader() {
  cudaStreamSynchronize(stream_);
  for (void* p : slots_) cudaFreeHost(p);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
}

void Uploader::copy(void* dst, const void* src, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += slot_bytes_) {
    const int64_t n = std::min(slot_bytes_, bytes - at);
    TETRA_CUDA_CHECK(cudaEventSynchronize(done_[size_t(next_)]));  // the slot's last copy is done
    std::memcpy(slots_[size_t(next_)], static_cast<const char*>(src) + at, size_t(n));
    TETRA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + at, slots_[size_t(next_)], size_t(n),
                                     cudaMemcpyHostToDevice, stream_));
    TETRA_CUDA_CHECK(cudaEventRecord(done_[size_t(next_)], stream_));
    next_ = (next_ + 1) % int(slots_.size());
    copied_ += n;
  }
}

void Uploader::finish() { TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace tetra::ops::cuda

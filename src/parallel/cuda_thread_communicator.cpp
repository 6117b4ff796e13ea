#include "parallel/cuda_thread_communicator.h"

#include <cuda_runtime.h>

#include <array>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/rank_sum.h"
#include "ops/ops.h"
#include "parallel/cuda_devices.h"
#include "parallel/rank_barrier.h"

namespace tetra::parallel {
namespace {

// What the ranks share: their devices, the barrier, and each rank's input to the collective
// in progress.
struct Shared {
  explicit Shared(const std::vector<int>& d) : devices(d), barrier(int(d.size())), sources(d.size()) {}

  const std::vector<int> devices;
  RankBarrier barrier;
  std::vector<TensorView> sources;
};

class CudaThreadCommunicator : public ops::Communicator {
 public:
  CudaThreadCommunicator(std::shared_ptr<Shared> shared, int rank)
      : s_(std::move(shared)), rank_(rank), device_(s_->devices[size_t(rank)]) {}
  ~CudaThreadCommunicator() override {
    if (!scratch_) return;
    RestoreDevice restore;
    cudaSetDevice(device_);
    cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return s_->barrier.size(); }

  void all_reduce_sum(const ops::Context& ctx, TensorView x) override {
    const cudaStream_t stream = enter(ctx, "all_reduce_sum");
    TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
                " tensors are not summed (F32 or BF16)");
    check_on_device(x, "all_reduce_sum", "x");
    const int64_t n = x.numel();
    const size_t bytes = size_t(x.nbytes());
    reserve(bytes);
    s_->sources[size_t(rank_)] = x;
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));  // x is complete before any rank reads it
    // Once every input is in place, one rank checks they agree.
    s_->barrier.wait([&] {
      for (const TensorView& t : s_->sources)
        TETRA_CHECK(t.numel() == n && t.dtype == x.dtype, "all_reduce_sum: the ranks' tensors differ (",
                    t.shape.str(), " ", dtype_name(t.dtype), " against ", x.shape.str(), " ",
                    dtype_name(x.dtype), ")");
    });
    // Every rank sums every rank's x, in rank order, into its own scratch ...
    std::array<const void*, ops::cuda::kMaxRankSumSources> ptrs{};
    for (int r = 0; r < size(); ++r) ptrs[size_t(r)] = s_->sources[size_t(r)].data;
    ops::cuda::launch_sum_in_rank_order(stream, ptrs.data(), size(), x.dtype, n, scratch_);
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    s_->barrier.wait();  // ... and no rank's x changes until every rank has read it.
    if (bytes) TETRA_CUDA_CHECK(cudaMemcpyAsync(x.data, scratch_, bytes, cudaMemcpyDeviceToDevice, stream));
    // Waiting here frees the scratch for the next collective, whatever stream that one is on.
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  void all_gather(const ops::Context& ctx, TensorView x, TensorView out) override {
    const cudaStream_t stream = enter(ctx, "all_gather");
    const int ranks = size();
    TETRA_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * ranks, "all_gather: out is ",
                dtype_name(out.dtype), " of ", out.numel(), " elements, not ", dtype_name(x.dtype), " of ", ranks,
                " x ", x.numel());
    check_on_device(x, "all_gather", "x");
    check_on_device(out, "all_gather", "out");
    s_->sources[size_t(rank_)] = x;
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    s_->barrier.wait([&] {
      for (const TensorView& t : s_->sources)
        TETRA_CHECK(t.numel() == x.numel() && t.dtype == x.dtype, "all_gather: the ranks' tensors differ (",
                    t.shape.str(), " ", dtype_name(t.dtype), " against ", x.shape.str(), " ",
                    dtype_name(x.dtype), ")");
    });
    const size_t bytes = size_t(x.nbytes());
    for (int r = 0; r < ranks && bytes; ++r) {
      void* dst = static_cast<char*>(out.data) + size_t(r) * bytes;
      const void* src = s_->sources[size_t(r)].data;
      const int src_device = s_->devices[size_t(r)];
      if (src_device == device_)
        TETRA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
      else
        TETRA_CUDA_CHECK(cudaMemcpyPeerAsync(dst, device_, src, src_device, bytes, stream));
    }
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
    s_->barrier.wait();  // no rank's input changes until every rank has read it
  }

  void abort(const std::string& reason) override { s_->barrier.abort(reason); }

 private:
  // The capture check comes first: waiting on a stream under capture would break the capture,
  // and a graph would replay none of the host's part anyway.
  cudaStream_t enter(const ops::Context& ctx, const char* op) const {
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TETRA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    TETRA_CHECK(capture == cudaStreamCaptureStatusNone, op,
                ": the CUDA thread communicator waits for the stream on the host, so it cannot run inside a "
                "CUDA graph capture");
    TETRA_CUDA_CHECK(cudaSetDevice(device_));  // the calling thread may have another device current
    return stream;
  }

  void check_on_device(const TensorView& t, const char* op, const char* what) const {
    if (t.empty()) return;
    TETRA_CHECK(t.device == Device::Cuda, op, ": ", what, " is not on the GPU");
    cudaPointerAttributes attrs{};
    TETRA_CUDA_CHECK(cudaPointerGetAttributes(&attrs, t.data));
    TETRA_CHECK(attrs.type != cudaMemoryTypeDevice || attrs.device == device_, op, ": ", what, " is on GPU ",
                attrs.device, ", not on rank ", rank_, "'s GPU ", device_);
  }

  // The scratch the sum lands in before it is copied over x; it only grows.
  void reserve(size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    if (scratch_) TETRA_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    TETRA_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }

  std::shared_ptr<Shared> s_;
  int rank_, device_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<ops::Communicator>> make_cuda_thread_communicators(const std::vector<int>& devices) {
  const int n = int(devices.size());
  TETRA_CHECK(n >= 1, "a communicator needs at least one rank");
  TETRA_CHECK(n <= ops::cuda::kMaxRankSumSources, "the CUDA thread communicator joins at most ",
              ops::cuda::kMaxRankSumSources, " ranks, not ", n);
  check_devices_exist(devices);
  enable_peer_access(devices);
  auto shared = std::make_shared<Shared>(devices);
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<CudaThreadCommunicator>(shared, r));
  return comms;
}

}  // namespace tetra::parallel

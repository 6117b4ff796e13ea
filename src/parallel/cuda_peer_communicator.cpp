#include "parallel/cuda_peer_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/peer_all_reduce.h"
#include "parallel/cuda_devices.h"
#include "parallel/rank_barrier.h"

namespace tetra::parallel {
namespace {

// The group's memory: each rank's flags and staging on its own device, and the abort word every
// device reads (host memory mapped into all of them).
struct Shared {
  explicit Shared(const std::vector<int>& d)
      : devices(d),
        one_gpu_shared(std::set<int>(d.begin(), d.end()).size() < d.size()),
        barrier(int(d.size())),
        flags(d.size()),
        staging(d.size()) {}
  ~Shared() {
    RestoreDevice restore;
    for (size_t r = 0; r < devices.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaFree(flags[r]);
      cudaFree(staging[r]);
    }
    if (abort_word) cudaFreeHost(const_cast<int*>(abort_word));
  }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  const std::vector<int> devices;
  const bool one_gpu_shared;  // two ranks on one GPU (tests)
  RankBarrier barrier;        // for collectives synchronised on the host
  std::vector<ops::cuda::PeerFlags*> flags;
  std::vector<void*> staging;
  volatile int* abort_word = nullptr;
  const volatile int* abort_on_device = nullptr;

  std::mutex mu;
  bool aborted = false;
  std::string reason;
};

class CudaPeerCommunicator : public ops::Communicator {
 public:
  CudaPeerCommunicator(std::shared_ptr<Shared> shared, int rank, std::unique_ptr<ops::Communicator> large)
      : s_(std::move(shared)), large_(std::move(large)), device_(s_->devices[size_t(rank)]) {
    group_.rank = rank;
    group_.size = int(s_->devices.size());
    for (int r = 0; r < group_.size; ++r) {
      group_.flags[r] = s_->flags[size_t(r)];
      group_.staging[r] = s_->staging[size_t(r)];
    }
    group_.half_bytes = kPeerMessageBytes;
    group_.abort = s_->abort_on_device;
  }

  int rank() const override { return group_.rank; }
  int size() const override { return group_.size; }

  void all_reduce_sum(const ops::Context& ctx, TensorView x) override {
    enter();
    if (large_ && x.nbytes() > kPeerMessageBytes) return large_->all_reduce_sum(ctx, x);
    TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
                " tensors are not summed (F32 or BF16)");
    // Pieces of a staging half each, whole 16-byte vectors.
    const int64_t elem = dtype_bits(x.dtype) / 8, n = x.numel();
    const int64_t piece = kPeerMessageBytes / elem / 8 * 8;
    for (int64_t at = 0; at < n; at += piece) {
      const TensorView part{static_cast<char*>(x.data) + at * elem, x.dtype, {std::min(piece, n - at)}, x.device};
      launch(ctx, [&] { ops::cuda::peer_all_reduce_sum(ops::cuda::kernel_launch(ctx), group_, part); });
    }
  }

  void all_gather(const ops::Context& ctx, TensorView x, TensorView out) override {
    enter();
    if (large_ && x.nbytes() > kPeerMessageBytes) return large_->all_gather(ctx, x, out);
    launch(ctx, [&] { ops::cuda::peer_all_gather(ops::cuda::kernel_launch(ctx), group_, x, out); });
  }

  bool all_reduce_sum_add_rms_norm(const ops::Context& ctx, TensorView delta, TensorView h, TensorView weight,
                                   float eps, TensorView out) override {
    enter();
    if (h.empty()) return false;
    const int64_t d = h.dim(-1);
    if (!ops::cuda::peer_add_rms_norm_takes(h.numel() / d, d, h.dtype, group_)) return false;
    launch(ctx, [&] {
      ops::cuda::peer_all_reduce_add_rms_norm(ops::cuda::kernel_launch(ctx), group_, delta, h, weight, eps, out);
    });
    return true;
  }

  bool capturable() const override { return !large_ || large_->capturable(); }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (!s_->aborted) {
        s_->aborted = true;
        s_->reason = reason;
        *s_->abort_word = 1;  // every rank's waiting kernels give up
      }
    }
    s_->barrier.abort(reason);
    if (large_) large_->abort(reason);
  }

 private:
  void enter() {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (s_->aborted) fail("a collective was abandoned: ", s_->reason);
    }
    // The calling thread may have another device current; the kernels run on the rank's.
    TETRA_CUDA_CHECK(cudaSetDevice(device_));
  }

  // A collective's kernel spins until every rank's has started. Meanwhile a thread that
  // allocates or frees device memory, which may wait for its GPU to go idle, must not be one
  // that has yet to launch (NCCL's kernels share the hazard). Two cases risk it: steps whose
  // arena still grows (the measuring pass before serving), and ranks sharing one GPU (tests),
  // where any rank's allocation waits for the other's spinning kernel. There the ranks meet on
  // the host first and each waits for its kernel after. A capture launches nothing, and a
  // graph's replay runs kernels only: both go free. Host-synchronised, a rank's stream holds one
  // collective kernel and nothing after it, so ranks whose streams share one of the GPU's work
  // queues still run side by side (a kernel queued behind a spinning one of its own stream would
  // block the queue).
  template <typename Launch>
  void launch(const ops::Context& ctx, Launch&& enqueue) {
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TETRA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const bool on_host = capture == cudaStreamCaptureStatusNone &&
                         (s_->one_gpu_shared || ctx.arena == nullptr || !ctx.arena->frozen());
    if (on_host) s_->barrier.wait();
    enqueue();
    if (on_host) TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  std::shared_ptr<Shared> s_;
  std::unique_ptr<ops::Communicator> large_;
  int device_;
  ops::cuda::PeerGroup group_;
};

}  // namespace

std::vector<std::unique_ptr<ops::Communicator>> make_cuda_peer_communicators(
    const std::vector<int>& devices, std::vector<std::unique_ptr<ops::Communicator>> large) {
  const int n = int(devices.size());
  TETRA_CHECK(n >= 1 && n <= ops::cuda::kMaxPeerRanks, "the CUDA peer communicator joins 1 to ",
              ops::cuda::kMaxPeerRanks, " ranks, not ", n);
  TETRA_CHECK(large.empty() || int(large.size()) == n, "one communicator a rank for large messages, not ",
              large.size(), " for ", n, " ranks");
  check_devices_exist(devices);
  enable_peer_access(devices);
  auto shared = std::make_shared<Shared>(devices);
  {
    RestoreDevice restore;
    for (int r = 0; r < n; ++r) {
      TETRA_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
      TETRA_CUDA_CHECK(cudaMalloc(&shared->flags[size_t(r)], sizeof(ops::cuda::PeerFlags)));
      TETRA_CUDA_CHECK(cudaMemset(shared->flags[size_t(r)], 0, sizeof(ops::cuda::PeerFlags)));
      TETRA_CUDA_CHECK(cudaMalloc(&shared->staging[size_t(r)], size_t(2 * kPeerMessageBytes)));
      ops::cuda::load_peer_kernels();
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());  // the flags are zero before any rank's first launch
    }
    int* word = nullptr;
    TETRA_CUDA_CHECK(cudaHostAlloc(&word, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    shared->abort_word = word;
    *shared->abort_word = 0;
    int* on_device = nullptr;
    TETRA_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&on_device), word, 0));
    shared->abort_on_device = on_device;
  }
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  for (int r = 0; r < n; ++r)
    comms.push_back(std::make_unique<CudaPeerCommunicator>(shared, r,
                                                           large.empty() ? nullptr : std::move(large[size_t(r)])));
  return comms;
}

}  // namespace tetra::parallel

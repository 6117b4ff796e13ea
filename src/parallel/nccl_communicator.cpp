#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>

#include <cstring>
#include <mutex>
#include <string>

#include "core/error.h"
#include "ops/ops.h"
#include "parallel/nccl_library.h"
#include "parallel/node_group.h"

namespace tetra::parallel {
namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL ", what, " failed: ", nccl_library().get_error_string(r));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
    default: fail("NCCL collectives take F32, BF16, F16, I32 or U8 tensors, not ", dtype_name(d));
  }
}

class NcclCommunicator : public ops::Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device)
      : comm_(comm), rank_(rank), size_(size), device_(device) {}
  // By now the engine's graphs, which hold references to this communicator's captured plans,
  // are gone, so freeing it cannot wait on them.
  ~NcclCommunicator() override {
    if (revoked_)
      nccl_library().comm_abort(comm_);
    else if (!aborted_)
      nccl_library().comm_destroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(const ops::Context& ctx, TensorView x) override {
    TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
                " tensors are not summed (F32 or BF16)");
    std::lock_guard<std::mutex> lock(mu_);
    enter(x);
    // A ring (or tree) all-reduce leaves the same bits on every rank.
    check(nccl_library().all_reduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), ncclSum, comm_,
                                    stream(ctx)),
          "all-reduce");
  }

  void all_gather(const ops::Context& ctx, TensorView x, TensorView out) override {
    TETRA_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * size_, "all_gather: out holds ", out.numel(),
                " elements, not ", size_, " x ", x.numel());
    std::lock_guard<std::mutex> lock(mu_);
    enter(x);
    check(nccl_library().all_gather(x.data, out.data, size_t(x.numel()), nccl_type(x.dtype), comm_, stream(ctx)),
          "all-gather");
  }

  // NCCL enqueues its collectives as kernels that a CUDA graph captures (NCCL 2.9 and later).
  bool capturable() const override { return true; }

  // Ends this rank's collectives still in flight (a kernel waiting for a peer that failed), so
  // its thread's wait on the stream returns. Where NCCL has ncclCommRevoke (2.28 on), abort only
  // revokes: ncclCommAbort frees the process's communicators once the last is aborted, which
  // waits for every CUDA graph that captured their collectives to be destroyed (the engine
  // still holds them here) and frees communicators other rank threads may still be inside. The
  // destructor frees it instead, after the ranks' threads and the graphs are gone.
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return;
    aborted_ = true;
    reason_ = reason;
    const NcclLibrary& lib = nccl_library();
    // A revoke in progress (kernels still stopping) is as good: the destructor comes later.
    const ncclResult_t r = lib.comm_revoke ? lib.comm_revoke(comm_, NCCL_REVOKE_DEFAULT) : ncclInvalidUsage;
    revoked_ = r == ncclSuccess || r == ncclInProgress;
    if (!revoked_) lib.comm_abort(comm_);
  }

 private:
  static cudaStream_t stream(const ops::Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

  void enter(const TensorView& x) {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_) fail("a collective was abandoned: ", reason_);
    }
    TETRA_CHECK(x.device == Device::Cuda, "NCCL collectives take tensors on the GPU");
    // The calling thread may have another device current; NCCL launches on the comm's.
    if (cudaSetDevice(device_) != cudaSuccess) fail("cudaSetDevice(", device_, ") failed");
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  std::mutex mu_;        // one collective at a time on this rank
  std::mutex abort_mu_;  // abort() comes from another rank's thread
  bool aborted_ = false;  // no collective may start
  bool revoked_ = false;  // aborted by ncclCommRevoke: the destructor still frees it
  std::string reason_;
};

}  // namespace

std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices) {
  const int n = int(devices.size());
  TETRA_CHECK(n >= 1, "an NCCL communicator needs at least one GPU");
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  check(nccl_library().comm_init_all(comms.data(), n, devices.data()), "communicator setup (ncclCommInitAll)");
  std::vector<std::unique_ptr<ops::Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[size_t(r)], r, n, devices[size_t(r)]));
  return out;
}

std::vector<std::unique_ptr<ops::Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                        NodeGroup& nodes, int first_rank, int world) {
  const int n = int(devices.size());
  TETRA_CHECK(n >= 1 && first_rank >= 0 && first_rank + n <= world, "NCCL ranks ", first_rank, " .. ",
              first_rank + n - 1, " are not ranks of ", world);
  const NcclLibrary& lib = nccl_library();  // on every node before the id travels
  ncclUniqueId id{};
  std::string mine;
  if (nodes.node_rank() == 0) {
    check(lib.get_unique_id(&id), "id (ncclGetUniqueId)");
    mine.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  const std::string theirs = nodes.all_gather(mine).front();
  TETRA_CHECK(theirs.size() == sizeof id, "node 0 sent an NCCL id of ", theirs.size(), " bytes, not ", sizeof id,
              " (is every node's NCCL the same version?)");
  std::memcpy(&id, theirs.data(), sizeof id);
  // This node's ranks join in one group call, so one thread can start them all.
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  check(lib.group_start(), "group start");
  try {
    for (int i = 0; i < n; ++i) {
      if (cudaSetDevice(devices[size_t(i)]) != cudaSuccess) fail("cudaSetDevice(", devices[size_t(i)], ") failed");
      check(lib.comm_init_rank(&comms[size_t(i)], world, id, first_rank + i), "communicator setup (ncclCommInitRank)");
    }
  } catch (...) {
    lib.group_end();  // a group left open would swallow this thread's next NCCL calls
    throw;
  }
  check(lib.group_end(), "communicator setup across nodes (ncclGroupEnd)");
  std::vector<std::unique_ptr<ops::Communicator>> out;
  for (int i = 0; i < n; ++i)
    out.push_back(std::make_unique<NcclCommunicator>(comms[size_t(i)], first_rank + i, world, devices[size_t(i)]));
  return out;
}

bool nccl_loads(std::string* why_not, std::string* description) {
  try {
    const NcclLibrary& lib = nccl_library();
    if (description) *description = str_cat(lib.path, " (NCCL ", lib.version, ")");
    return true;
  } catch (const Error& e) {
    if (why_not) *why_not = e.what();
    return false;
  }
}

}  // namespace tetra::parallel

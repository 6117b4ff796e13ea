#include "parallel/cpu_communicator.h"

#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/host_sum.h"
#include "parallel/rank_barrier.h"

namespace tetra::parallel {
namespace {

// What the ranks share: the barrier and the buffers of the collective in progress.
struct Shared {
  explicit Shared(int n) : n_ranks(n), barrier(n), sources(size_t(n)) {}

  const int n_ranks;
  RankBarrier barrier;
  // The collective in progress: each rank's input, its shape and dtype, and the result.
  std::vector<TensorView> sources;
  std::vector<float> sum;
};

class CpuCommunicator : public ops::Communicator {
 public:
  CpuCommunicator(std::shared_ptr<Shared> shared, int rank) : s_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->n_ranks; }

  void all_reduce_sum(const ops::Context&, TensorView x) override {
    TETRA_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "all_reduce_sum: ", dtype_name(x.dtype),
                " tensors are not summed (F32 or BF16)");
    const int64_t n = x.numel();
    s_->sources[size_t(rank_)] = x;
    // Once every input is in place, one rank checks they agree and sizes the result.
    s_->barrier.wait([&] {
      for (const TensorView& t : s_->sources)
        TETRA_CHECK(t.numel() == n && t.dtype == x.dtype, "all_reduce_sum: the ranks' tensors differ (",
                    t.shape.str(), " ", dtype_name(t.dtype), " against ", x.shape.str(), " ",
                    dtype_name(x.dtype), ")");
      s_->sum.resize(size_t(n));
    });
    // Each rank sums its share of the elements, always in rank order ...
    const int ranks = s_->n_ranks;
    const int64_t begin = n * rank_ / ranks, end = n * (rank_ + 1) / ranks;
    for (int64_t i = begin; i < end; ++i) {
      float acc = 0.0f;
      for (int r = 0; r < ranks; ++r) acc += host_value(s_->sources[size_t(r)].data, s_->sources[size_t(r)].dtype, i);
      s_->sum[size_t(i)] = acc;
    }
    s_->barrier.wait();
    // ... then each copies the whole sum into its own tensor. The next collective's first
    // barrier keeps `sum` until every rank has copied it.
    store_sum(x, s_->sum.data());
  }

  void all_gather(const ops::Context&, TensorView x, TensorView out) override {
    const int ranks = s_->n_ranks;
    TETRA_CHECK(out.dtype == x.dtype && out.numel() == x.numel() * ranks, "all_gather: out holds ",
                out.numel(), " elements, not ", ranks, " x ", x.numel());
    s_->sources[size_t(rank_)] = x;
    s_->barrier.wait([&] {
      for (const TensorView& t : s_->sources)
        TETRA_CHECK(t.nbytes() == x.nbytes(), "all_gather: the ranks' tensors differ in size");
    });
    for (int r = 0; r < ranks; ++r)
      std::memcpy(static_cast<char*>(out.data) + r * x.nbytes(), s_->sources[size_t(r)].data,
                  size_t(x.nbytes()));
    s_->barrier.wait();  // no rank's input changes until every rank has read it
  }

  void abort(const std::string& reason) override {
    s_->barrier.abort(reason);
  }

 private:
  std::shared_ptr<Shared> s_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<ops::Communicator>> make_cpu_communicators(int n_ranks) {
  TETRA_CHECK(n_ranks >= 1, "a communicator needs at least one rank");
  auto shared = std::make_shared<Shared>(n_ranks);
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  for (int r = 0; r < n_ranks; ++r) comms.push_back(std::make_unique<CpuCommunicator>(shared, r));
  return comms;
}

}  // namespace tetra::parallel

// The barrier the ranks of one process meet at in a collective (the CPU communicator's and the
// CUDA thread communicator's): reusable (a generation counter), and abortable, so a rank that
// failed never leaves the others waiting.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include "core/error.h"

namespace tetra::parallel {

class RankBarrier {
 public:
  explicit RankBarrier(int n_ranks) : n_ranks_(n_ranks) {}
  RankBarrier(const RankBarrier&) = delete;
  RankBarrier& operator=(const RankBarrier&) = delete;

  int size() const { return n_ranks_; }

  // Waits until every rank has arrived; the last to arrive runs `last` first (under the lock,
  // so it may read what every rank published before arriving). If `last` throws, the group is
  // aborted with its message and it rethrows. Throws once the group is aborted, whether this
  // rank was waiting or came late.
  template <typename F>
  void wait(F&& last) {
    std::unique_lock<std::mutex> lock(mu_);
    check_aborted();
    const uint64_t gen = generation_;
    if (++arrived_ == n_ranks_) {
      try {
        last();
      } catch (const std::exception& e) {
        abort_locked(e.what());  // the others are waiting here
        throw;
      }
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) check_aborted();
  }
  void wait() { wait([] {}); }

  // Every rank waiting now, or arriving later, throws with `reason` in its message. The first
  // reason stays.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    abort_locked(reason);
  }

 private:
  void abort_locked(const std::string& why) {
    if (aborted_) return;
    aborted_ = true;
    reason_ = why;
    cv_.notify_all();
  }

  void check_aborted() const {
    if (aborted_) fail("a collective was abandoned: ", reason_);
  }

  const int n_ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace tetra::parallel

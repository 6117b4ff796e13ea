// A thread per rank for the ranks of one model: run(fn) calls fn(rank) on every rank at once
// (rank 0 on the calling thread) and returns when all have. Ranks must run at once, since
// their collectives wait for each other.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tetra::parallel {

class RankThreads {
 public:
  // on_failure(reason) is called once a rank throws, while the others may still be waiting
  // in a collective: it aborts their communicators. Reasons name rank first_rank + r (a
  // node's ranks of several nodes carry global numbers).
  RankThreads(int n_ranks, std::function<void(const std::string&)> on_failure, int first_rank = 0);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Rethrows the first failure (the cause; the others' are its echoes). Not reentrant.
  void run(const std::function<void(int rank)>& fn);

 private:
  void worker_loop(int rank);
  void call(int rank);

  std::function<void(const std::string&)> on_failure_;
  int first_rank_ = 0;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
};

}  // namespace tetra::parallel

// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tetra {

class ThreadPool {
 public:
  // n_threads = 0 uses the hardware concurrency.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n); the calling thread works too.
  // Chunks are contiguous and at least `grain` long, so results do not depend on timing.
  // An exception thrown by fn on any thread reaches the caller once every chunk has ended
  // (the calling thread's own first, else the first a worker threw).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  std::exception_ptr job_error_;  // the first a worker threw in this job
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace tetra

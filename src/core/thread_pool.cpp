#include "core/thread_pool.h"

#include <algorithm>
#include <exception>

namespace tetra {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t n_parts = std::min<int64_t>(size(), std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
  if (n_parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + n_parts - 1) / n_parts;
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_ = int(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, std::min(n, chunk));  // part 0 on the calling thread
  } catch (...) {
    mine = std::current_exception();
  }
  // Every worker is done with `fn` before this returns or throws.
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  std::exception_ptr failed = mine ? mine : job_error_;
  job_error_ = nullptr;
  if (failed) std::rethrow_exception(failed);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t begin, end;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      begin = std::min(job_n_, index * job_chunk_);
      end = std::min(job_n_, begin + job_chunk_);
    }
    std::exception_ptr error;
    if (begin < end) {
      try {
        (*job)(begin, end);
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (error && !job_error_) job_error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

}  // namespace tetra

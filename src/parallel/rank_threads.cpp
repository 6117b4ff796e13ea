#include "parallel/rank_threads.h"

#include "core/error.h"

namespace tetra::parallel {

RankThreads::RankThreads(int n_ranks, std::function<void(const std::string&)> on_failure, int first_rank)
    : on_failure_(std::move(on_failure)), first_rank_(first_rank) {
  TETRA_CHECK(n_ranks >= 1, "a model needs at least one rank");
  for (int r = 1; r < n_ranks; ++r) workers_.emplace_back([this, r] { worker_loop(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void RankThreads::call(int rank) {
  std::string what;
  std::exception_ptr error;
  try {
    (*job_)(rank);
    return;
  } catch (const std::exception& e) {
    what = e.what();
    error = std::current_exception();
  } catch (...) {
    what = "an exception that is not a std::exception";
    error = std::current_exception();
  }
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_) first_error_ = error, first = true;
  }
  if (first && on_failure_) on_failure_(str_cat("rank ", first_rank_ + rank, " failed: ", what));
}

void RankThreads::worker_loop(int rank) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    call(rank);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_.notify_all();
  }
}

void RankThreads::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    first_error_ = nullptr;
    pending_ = int(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  call(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    error = first_error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace tetra::parallel

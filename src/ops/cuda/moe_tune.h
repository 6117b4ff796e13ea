// The MoE GEMM configurations tune_moe chose per (GPU, weight format, shape, top-k, token
// bucket): kept in memory and in a JSON cache file so a restart reuses them. Tuning happens at the backend's
// warm-up, never inside a forward (timing needs a host sync); untuned buckets take the
// heuristic. The cache file's path is the caller's (the CLI reads it from the environment).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "ops/cuda/moe.h"

namespace tetra::ops::cuda {

class MoeTuner {
 public:
  // path: the cache file; empty = memory only.
  explicit MoeTuner(std::string path);

  std::optional<MoeConfig> find(const std::string& key);
  void store(const std::string& key, const MoeConfig& config);
  const std::string& path() const { return path_; }

 private:
  void load();
  void save() const;

  std::string path_;
  std::mutex mu_;
  std::map<std::string, MoeConfig> entries_;
};

// Token counts are tuned in power-of-two buckets.
int moe_token_bucket(int64_t n_tokens);

}  // namespace tetra::ops::cuda

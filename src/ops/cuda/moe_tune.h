// Autotuning of the MoE GEMM configuration: on the first call for a (GPU, weight format, shape,
// top-k, token bucket), time the candidate tiles on the call's own inputs and keep the fastest,
// in memory and in a JSON cache file so a restart reuses it. Never runs while a stream is
// being captured (timing needs a host sync); then the heuristic decides.
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

// The cache file: $TETRA_MOE_TUNE_CACHE, else $XDG_CACHE_HOME/tetra/moe_tune.json, else
// ~/.cache/tetra/moe_tune.json; empty when none can be named.
std::string moe_tune_cache_path();

// Token counts are tuned in power-of-two buckets.
int moe_token_bucket(int64_t n_tokens);

}  // namespace tetra::ops::cuda

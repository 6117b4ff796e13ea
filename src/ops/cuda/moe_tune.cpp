// The MoE tuning cache (see moe_tune.h).
#include "ops/cuda/moe_tune.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra::ops::cuda {

namespace fs = std::filesystem;

int moe_token_bucket(int64_t n_tokens) {
  int b = 1;
  while (b < n_tokens && b < (1 << 30)) b <<= 1;
  return b;
}

MoeTuner::MoeTuner(std::string path) : path_(std::move(path)) { load(); }

void MoeTuner::load() {
  if (path_.empty() || !fs::exists(path_)) return;
  try {
    std::ifstream in(path_);
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [key, v] : j.at("entries").items()) {
      MoeConfig c;
      c.tile_tokens = v.at("tile_tokens").get<int>();
      c.why = v.value("why", std::string());
      c.fused = v.value("fused", false);
      c.hot_tokens = v.value("hot_tokens", 0);
      entries_[key] = c;
    }
  } catch (const std::exception& e) {
    // A damaged cache costs a re-tune, never a failure.
    entries_.clear();
  }
}

void MoeTuner::save() const {
  if (path_.empty()) return;
  nlohmann::json j{{"version", 1}, {"entries", nlohmann::json::object()}};
  for (const auto& [key, c] : entries_)
    j["entries"][key] = {{"tile_tokens", c.tile_tokens}, {"fused", c.fused}, {"hot_tokens", c.hot_tokens}, {"why", c.why}};
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  // Write then rename, so a reader never sees half a file. The ranks of one process (--tp,
  // --ep) each have a tuner on the same file: the temporary is this tuner's own.
  const std::string tmp =
      str_cat(path_, ".tmp", ::getpid(), "-", reinterpret_cast<uintptr_t>(static_cast<const void*>(this)));
  {
    std::ofstream out(tmp);
    if (!out) return;  // an unwritable cache only means tuning again after a restart
    out << j.dump(1) << "\n";
  }
  fs::rename(tmp, path_, ec);
}

std::optional<MoeConfig> MoeTuner::find(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  MoeConfig c = it->second;
  c.tuned = true;
  c.why = "tuned (" + (path_.empty() ? std::string("in memory") : path_) + "): " + c.why;
  return c;
}

void MoeTuner::store(const std::string& key, const MoeConfig& config) {
  std::lock_guard lock(mu_);
  load();  // keep what other processes added meanwhile
  entries_[key] = config;
  save();
}

}  // namespace tetra::ops::cuda

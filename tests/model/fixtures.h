// The reference fixtures under tests/fixtures/: tiny random checkpoints with the greedy tokens
// and log-probs transformers computed for them (tools/make_fixtures.py).
#pragma once

#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tetra::testing {

inline std::filesystem::path fixtures_dir() {
  return std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures";
}

struct FixtureCase {
  std::vector<int32_t> prompt_ids;
  int64_t max_new_tokens = 0;
  std::vector<int32_t> token_ids;
  std::vector<double> logprobs;
};

inline std::vector<FixtureCase> read_cases(const std::filesystem::path& dir) {
  std::ifstream in(dir / "expected.json");
  const auto j = nlohmann::json::parse(in);
  std::vector<FixtureCase> cases;
  for (const auto& c : j.at("cases"))
    cases.push_back({c.at("prompt_ids").get<std::vector<int32_t>>(), c.at("max_new_tokens").get<int64_t>(),
                     c.at("token_ids").get<std::vector<int32_t>>(),
                     c.at("logprobs").get<std::vector<double>>()});
  return cases;
}

// A name gtest takes: every character but letters and digits becomes '_'.
inline std::string gtest_name(std::string name) {
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

// A fixture folder's name as a test name ("qwen3_moe-tiny-nvfp4" -> "qwen3_moe_tiny_nvfp4").
inline std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  return gtest_name(info.param);
}

}  // namespace tetra::testing

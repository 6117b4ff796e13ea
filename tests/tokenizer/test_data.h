// Locates the reference data scripts/fetch-test-data writes (tests/.cache/tokenizer). Tests
// that need it fail, never skip, when it is missing.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace tetra::tok::testing {

inline std::filesystem::path data_dir() {
  return std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / ".cache" / "tokenizer";
}

inline std::filesystem::path require_data(const std::string& rel) {
  std::filesystem::path p = data_dir() / rel;
  if (!std::filesystem::exists(p))
    ADD_FAILURE() << "missing " << p << ": run scripts/fetch-test-data first";
  return p;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tetra::tok::testing

// A tokenizer file's whole text (tokenizer.json, tokenizer_config.json, tiktoken.model).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

namespace tetra::tok {

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  TETRA_CHECK(in, "cannot open ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  TETRA_CHECK(!in.bad(), "cannot read ", path.string());
  return ss.str();
}

}  // namespace tetra::tok

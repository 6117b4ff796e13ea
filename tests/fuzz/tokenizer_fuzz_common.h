// Shared by the tokenizer fuzz targets: a small but complete tokenizer.json (Qwen3's split
// regex, NFC, added tokens with every flag) and seeds. Each target defines
// LLVMFuzzerTestOneInput and tetra_fuzz_seeds(); under libFuzzer the seeds are unused, under
// tokenizer_fuzz_driver.cpp (the ctest smoke run) they start the mutation loop.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace tetra::tok::fuzz {

inline std::string small_tokenizer_json() {
  using nlohmann::json;
  const ByteLevelTable& t = byte_level_table();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[t.byte_to_utf8[b]] = b;
  const char* merges[][2] = {{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"Ġ", "Ġ"},
                             {"ĠĠ", "ĠĠ"}, {"o", "n"}, {"Ġa", "n"}, {"1", "2"}};
  json m = json::array();
  int id = 256;
  for (auto& p : merges) {
    std::string merged = std::string(p[0]) + p[1];
    if (!vocab.contains(merged)) vocab[merged] = id++;
    m.push_back({p[0], p[1]});
  }
  auto added = [](int i, const char* content, bool special, bool l, bool r, bool sw, bool norm) {
    return json{{"id", i}, {"content", content}, {"special", special}, {"lstrip", l}, {"rstrip", r},
                {"single_word", sw}, {"normalized", norm}};
  };
  json j = {
      {"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr},
      {"added_tokens", json::array({added(1000, "<|im_start|>", true, false, false, false, false),
                                    added(1001, "<|im_end|>", true, false, false, false, false),
                                    added(1002, "[L]", false, true, false, false, false),
                                    added(1003, "[R]", false, false, true, false, false),
                                    added(1004, "word", false, false, false, true, true)})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                       {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", m}}}};
  return j.dump();
}

}  // namespace tetra::tok::fuzz

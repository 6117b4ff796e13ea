// Parity with the reference tokenizers (@lenml/tokenizers, a port of transformers.js, on the
// official DeepSeek-V3 and Qwen3 tokenizer.json files; the Rust tiktoken on a tiktoken.model
// folder), over the corpus of
// tools/tokenizer_ref/make_corpus.py: every id must match.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tokenizer/test_data.h"
#include "tokenizer/tokenizer.h"

namespace tetra::tok {
namespace {

using testing::require_data;

struct Case {
  std::string text;
  std::vector<TokenId> ids;
  std::string decoded;
};

std::vector<Case> load_cases(const std::string& model) {
  std::vector<Case> cases;
  std::ifstream corpus(require_data("corpus.jsonl")), ref(require_data("ref_" + model + ".jsonl"));
  std::string a, b;
  while (std::getline(corpus, a)) {
    if (!std::getline(ref, b)) {
      ADD_FAILURE() << "reference for " << model << " is shorter than the corpus";
      break;
    }
    nlohmann::json r = nlohmann::json::parse(b);
    cases.push_back({nlohmann::json::parse(a).get<std::string>(), r["ids"].get<std::vector<TokenId>>(),
                     r["text"].get<std::string>()});
  }
  return cases;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + (ids.size() > 40 ? ",..." : "");
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, CorpusIdsMatchReference) {
  const std::string model = GetParam();
  Tokenizer tok = Tokenizer::load(testing::require_data(model));
  std::vector<Case> cases = load_cases(model);
  ASSERT_GE(cases.size(), 2000u);
  size_t mismatches = 0, decode_mismatches = 0;
  for (const Case& c : cases) {
    std::vector<TokenId> ids = tok.encode(c.text);
    if (ids != c.ids) {
      if (++mismatches <= 10)
        ADD_FAILURE() << model << ": ids differ for " << nlohmann::json(c.text).dump() << "\n  tetra: "
                      << show(ids) << "\n  ref:   " << show(c.ids);
      continue;
    }
    if (tok.decode(ids) != c.decoded && ++decode_mismatches <= 10)
      ADD_FAILURE() << model << ": decode differs for " << nlohmann::json(c.text).dump();
  }
  std::printf("[ parity ] %s: %zu strings, %zu id mismatches, %zu decode mismatches\n", model.c_str(),
              cases.size(), mismatches, decode_mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
}

// kimi_tiktoken: a tiktoken.model folder shaped as Kimi K2's (o200k_base's ranks, Kimi's
// tokenizer class and special tokens; scripts/fetch-test-data), against the Rust tiktoken
// under Kimi's pattern.
INSTANTIATE_TEST_SUITE_P(Models, Parity, ::testing::Values("deepseek_v3", "qwen3", "kimi_tiktoken"));

}  // namespace
}  // namespace tetra::tok

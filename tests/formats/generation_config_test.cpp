// generation_config.json: EOS ids (an int or a list) reach ModelConfig, sampling defaults are
// read, and a malformed file is one sentence naming it and the field.
#include "formats/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/model_config.h"

namespace fs = std::filesystem;

namespace tetra {
namespace {

using nlohmann::json;

const fs::path kFixture = fs::path(TETRA_SOURCE_DIR) / "tests/fixtures/qwen3_moe-tiny";

// A model folder holding the fixture's config.json and the given generation_config.json text.
class GenerationConfigDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tetra_genconf_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(kFixture / "config.json", dir_ / "config.json");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "generation_config.json") << text; }
  std::string load_error() {
    try {
      load_model_config(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST(GenerationConfig, ParsesEosAndSamplingDefaults) {
  // Qwen3-30B-A3B's file as published.
  const json j = json::parse(R"({"bos_token_id": 151643, "do_sample": true,
      "eos_token_id": [151645, 151643], "pad_token_id": 151643, "temperature": 0.6,
      "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})");
  const GenerationConfig g = parse_generation_config(j, "generation_config.json", 151936);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  EXPECT_DOUBLE_EQ(g.temperature.value(), 0.6);
  EXPECT_DOUBLE_EQ(g.top_p.value(), 0.95);
  EXPECT_EQ(g.top_k.value(), 20);
  EXPECT_FALSE(g.repetition_penalty.has_value());

  const GenerationConfig one = parse_generation_config(json::parse(R"({"eos_token_id": 7, "top_k": -1,
      "repetition_penalty": 1.05, "temperature": null})"), "g", 10);
  EXPECT_EQ(one.eos_token_ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(one.top_k.value(), 0);
  EXPECT_DOUBLE_EQ(one.repetition_penalty.value(), 1.05);
  EXPECT_FALSE(one.temperature.has_value());
}

TEST(GenerationConfig, RefusesBadFields) {
  auto error = [](const std::string& text) -> std::string {
    try {
      parse_generation_config(json::parse(text), "gen.json", 100);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error(R"({"eos_token_id": "x"})").find("\"eos_token_id\""), std::string::npos);
  EXPECT_NE(error(R"({"eos_token_id": [1, 100]})").find("100"), std::string::npos);
  EXPECT_NE(error(R"({"eos_token_id": [-1]})").find("eos_token_id"), std::string::npos);
  EXPECT_NE(error(R"({"temperature": "hot"})").find("\"temperature\""), std::string::npos);
  EXPECT_NE(error(R"({"temperature": 5})").find("temperature"), std::string::npos);
  EXPECT_NE(error(R"({"top_p": 0})").find("top_p"), std::string::npos);
  EXPECT_NE(error(R"({"top_k": 1.5})").find("top_k"), std::string::npos);
  // A request's range (vLLM's: above 0, no upper bound but the float's), so a default is
  // always a value a request could send.
  for (const char* bad : {"0", "-1", "1e39", "1e-50", "\"1.1\""})
    EXPECT_NE(error(str_cat(R"({"repetition_penalty": )", bad, "}")).find("repetition_penalty"), std::string::npos)
        << bad;
  EXPECT_EQ(error(R"({"repetition_penalty": 1e30})"), "");
  EXPECT_EQ(error(R"({"repetition_penalty": 0.5})"), "");
  EXPECT_NE(error(R"([1, 2])").find("gen.json"), std::string::npos);
}

TEST_F(GenerationConfigDir, EosIdsJoinConfigJsons) {
  EXPECT_EQ(load_model_config(dir_).eos_token_ids, (std::vector<int64_t>{511}));  // config.json alone
  write(R"({"eos_token_id": [511, 509]})");
  EXPECT_EQ(load_model_config(dir_).eos_token_ids, (std::vector<int64_t>{511, 509}));
  write(R"({"eos_token_id": 510})");
  EXPECT_EQ(load_model_config(dir_).eos_token_ids, (std::vector<int64_t>{511, 510}));
}

TEST_F(GenerationConfigDir, MalformedFileIsALoadError) {
  write("{not json");
  std::string e = load_error();
  EXPECT_NE(e.find("generation_config.json is not valid JSON"), std::string::npos) << e;
  write(R"({"eos_token_id": 512})");
  e = load_error();
  EXPECT_NE(e.find("generation_config.json: \"eos_token_id\" holds 512"), std::string::npos) << e;
}

}  // namespace
}  // namespace tetra

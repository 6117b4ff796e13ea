// Every validation failure of parse_model_config / load_model_config, with its message.
#include "formats/model_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model_config_fixtures.h"

namespace tetra {
namespace {

using nlohmann::json;
using namespace tetra::testing;

// ---- validation ---------------------------------------------------------------------------

TEST(ModelConfigValidation, UnsupportedModelTypeListsSupported) {
  json j = qwen3_30b();
  j["model_type"] = "llama";
  EXPECT_ERROR(j, "config.json: model_type \"llama\" is not supported; supported model types: "
                  "qwen3_moe, glm4_moe, mixtral, deepseek_v3, kimi_k2, glm4_moe_lite, glm_moe_dsa.");
  j.erase("model_type");
  EXPECT_ERROR(j, "\"model_type\" is missing; supported model types: qwen3_moe");
  EXPECT_ERROR(json::array(), "config.json: the config must be a JSON object, not an array");
}

TEST(ModelConfigValidation, WrongJsonTypesNameTheField) {
  json j = qwen3_30b();
  j["hidden_size"] = "2048";
  EXPECT_ERROR(j, "config.json: \"hidden_size\" must be an integer, not a string.");
  j = qwen3_30b();
  j["hidden_size"] = 2048.5;
  EXPECT_ERROR(j, "\"hidden_size\" must be an integer, not a fractional number");
  j = qwen3_30b();
  j["num_hidden_layers"] = nullptr;
  EXPECT_ERROR(j, "\"num_hidden_layers\" must be an integer, not null");
  j = qwen3_30b();
  j["rms_norm_eps"] = "1e-6";
  EXPECT_ERROR(j, "\"rms_norm_eps\" must be a number, not a string");
  j = qwen3_30b();
  j["tie_word_embeddings"] = "no";
  EXPECT_ERROR(j, "\"tie_word_embeddings\" must be true or false, not a string");
  j = qwen3_30b();
  j["rope_scaling"] = "yarn";
  EXPECT_ERROR(j, "\"rope_scaling\" must be an object, not a string");
  j = deepseek_v3();
  j["rope_scaling"]["factor"] = "40";
  EXPECT_ERROR(j, "\"rope_scaling.factor\" must be a number, not a string");
  j = qwen3_30b();
  j["eos_token_id"] = "</s>";
  EXPECT_ERROR(j, "\"eos_token_id\" must be an integer or a list of integers, not a string");
  j = qwen3_30b();
  j["mlp_only_layers"] = 3;
  EXPECT_ERROR(j, "\"mlp_only_layers\" must be an array, not an integer");
  j = qwen3_30b();
  j["vocab_size"] = 18446744073709551615ull;
  EXPECT_ERROR(j, "\"vocab_size\" is too large");
}

TEST(ModelConfigValidation, DimensionBounds) {
  struct Case {
    const char* field;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"hidden_size", 0, "\"hidden_size\" is 0; it must be between 1 and 65536."},
      {"hidden_size", 65537, "\"hidden_size\" is 65537; it must be between 1 and 65536."},
      {"num_hidden_layers", 1025, "\"num_hidden_layers\" is 1025; it must be between 1 and 1024."},
      {"vocab_size", 5000000, "\"vocab_size\" is 5000000; it must be between 1 and 4194304."},
      {"num_experts", 5000, "\"n_routed_experts\" is 5000; it must be between 1 and 4096."},
      {"num_experts", 0, "\"n_routed_experts\" is 0"},
      {"num_attention_heads", 2048, "\"num_attention_heads\" is 2048; it must be between 1 and 1024."},
      {"head_dim", 2048, "\"head_dim\" is 2048; it must be between 2 and 1024."},
      {"num_experts_per_tok", 129, "\"num_experts_per_tok\" is 129; it must be between 1 and 128."},
      {"num_experts_per_tok", 0, "\"num_experts_per_tok\" is 0"},
      {"num_key_value_heads", 3, "\"num_attention_heads\" is 32, not a multiple of num_key_value_heads (3)"},
      {"num_key_value_heads", 64, "\"num_key_value_heads\" is 64; it must be between 1 and 32."},
      {"max_position_embeddings", 20000000, "\"max_position_embeddings\" is 20000000; it must be between 1 and 16777216."},
      {"intermediate_size", -1, "\"intermediate_size\" is -1"},
      {"moe_intermediate_size", 0, "\"moe_intermediate_size\" is 0"},
      {"rms_norm_eps", 0, "\"rms_norm_eps\" is 0; it must be in (0, 1)."},
      {"rms_norm_eps", 1.0, "\"rms_norm_eps\" is 1; it must be in (0, 1)."},
      {"decoder_sparse_step", 0, "\"decoder_sparse_step\" is 0; it must be between 1 and 1024."},
      {"mlp_only_layers", {48}, "\"mlp_only_layers\" is 48; it must be between 0 and 47."},
      {"mlp_layer_types", {"dense"}, "\"mlp_layer_types\" has 1 entries for 48 layers"},
      {"hidden_act", "gelu", "\"hidden_act\" is \"gelu\"; these families use \"silu\""},
      {"use_sliding_window", true, "\"use_sliding_window\" is true"},
      {"eos_token_id", 151936, "\"eos_token_id\" holds 151936, outside the vocabulary of 151936"},
      {"eos_token_id", {-1}, "\"eos_token_id\" holds -1; token ids cannot be negative"},
      {"rope_theta", 0, "config.json: \"rope_theta\" is 0; it must be a finite number above 1."},
  };
  for (const Case& c : cases) {
    json j = qwen3_30b();
    j[c.field] = c.value;
    SCOPED_TRACE(c.field);
    EXPECT_ERROR(j, c.message);
  }
  json j = qwen3_30b();
  j["mlp_layer_types"] = mlp_types(48, 1);
  j["mlp_layer_types"][5] = "moe";
  EXPECT_ERROR(j, "\"mlp_layer_types\" entry 5 is \"moe\"; each must be \"dense\" or \"sparse\"");
  j = mixtral_8x7b();
  j["mlp_layer_types"] = mlp_types(32, 1);
  EXPECT_ERROR(j, "Mixtral has no dense MLP");
}

TEST(ModelConfigValidation, RopeAndHeadDim) {
  json j = glm45();
  j["partial_rotary_factor"] = 1.5;
  EXPECT_ERROR(j, "\"partial_rotary_factor\" is 1.5; it must be in (0, 1]");
  j["head_dim"] = 100;
  j["partial_rotary_factor"] = 0.25;  // 25 rotary dims cannot pair up
  EXPECT_ERROR(j, "gives a rotary dim of 25 for head dim 100; it must be even");
  EXPECT_ERROR(json({{"model_type", "glm4_moe"}}),  // 4096 / 96: head_dim must be given
               "\"head_dim\" is absent and hidden_size 4096 is not a multiple of num_attention_heads 96");
  j = qwen3_30b();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_ERROR(j, "\"rope_scaling.rope_type\" is \"linear\"; tetra supports \"default\" and \"yarn\"");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 0.5}};
  EXPECT_ERROR(j, "\"rope_scaling.factor\" is 0.5; it must be between 1 and 1024");
  j = glm5();
  j["rope_parameters"]["partial_rotary_factor"] = 0;
  EXPECT_ERROR(j, "\"rope_parameters.partial_rotary_factor\" is 0; it must be in (0, 1]");
  j = glm5();
  j["rope_interleave"] = false;
  EXPECT_ERROR(j, "\"rope_interleave\" is false, but glm_moe_dsa always uses interleaved RoPE");
  j = glm5();
  j["indexer_rope_interleave"] = false;
  EXPECT_ERROR(j, "\"indexer_rope_interleave\" is false");
  j = deepseek_v3();  // DeepSeek honours the flag: half-split RoPE
  j["rope_interleave"] = false;
  EXPECT_FALSE(parse(j).rope.interleaved);
  j = deepseek_v3();  // a top-level original_max_position_embeddings overrides the dict's
  j["original_max_position_embeddings"] = 8192;
  EXPECT_DOUBLE_EQ(parse(j).rope.yarn_original_max_position, 8192);
  j["original_max_position_embeddings"] = 0;
  EXPECT_ERROR(j, "config.json: \"original_max_position_embeddings\" must be positive.");
  j = glm5();
  j["rope_parameters"]["rope_theta"] = -1;
  EXPECT_ERROR(j, "\"rope_parameters.rope_theta\" is -1; it must be a finite number above 1");
  j = glm5();
  j["rope_parameters"] = {{"deepseek_sparse_attention", {{"rope_theta", 1e6}}}};
  EXPECT_ERROR(j, "\"rope_parameters\" holds per-layer-type RoPE parameters");
}

TEST(ModelConfigValidation, RoutingAndMla) {
  struct Case {
    const char* field;
    json value;
    const char* message;
  };
  const Case cases[] = {
      {"n_group", 7, "\"n_group\" is 7, which does not divide n_routed_experts (256)"},
      {"n_group", 0, "\"n_group\" is 0; it must be between 1 and 256."},
      {"topk_group", 9, "\"topk_group\" is 9; it must be between 1 and 8."},
      {"n_group", 256, "\"n_group\" leaves 1 expert per group"},
      {"kv_lora_rank", 0, "\"kv_lora_rank\" is 0; it must be between 1 and 65536."},
      {"q_lora_rank", 100000, "\"q_lora_rank\" is 100000; it must be between 0 and 65536."},
      {"qk_rope_head_dim", 0, "\"qk_rope_head_dim\" is 0"},
      {"v_head_dim", 0, "\"v_head_dim\" is 0"},
      {"qk_nope_head_dim", 1000, "\"qk_nope_head_dim + qk_rope_head_dim\" is 1064"},
      {"n_shared_experts", -1, "\"n_shared_experts\" is -1"},
      {"routed_scaling_factor", 0, "\"routed_scaling_factor\" is 0; it must be in (0, 1000]"},
      {"scoring_func", "softmax", "\"scoring_func\" is \"softmax\"; this family routes with \"sigmoid\""},
      {"topk_method", "greedy", "\"topk_method\" is \"greedy\""},
      {"first_k_dense_replace", 62, "\"first_k_dense_replace\" is 62; it must be between 0 and 61."},
      {"moe_layer_freq", 0, "\"moe_layer_freq\" is 0"},
      {"num_nextn_predict_layers", 17, "\"num_nextn_predict_layers\" is 17; it must be between 0 and 16."},
  };
  for (const Case& c : cases) {
    json j = deepseek_v3();
    j[c.field] = c.value;
    SCOPED_TRACE(c.field);
    EXPECT_ERROR(j, c.message);
  }
  json j = deepseek_v3();  // 64 groups of 4, keep 1: only 4 candidates for top-8
  j["n_group"] = 64;
  j["topk_group"] = 1;
  EXPECT_ERROR(j, "\"num_experts_per_tok\" is 8, more than the 4 experts in topk_group groups");
  j = glm5();
  j["q_lora_rank"] = nullptr;  // the DSA indexer reads the q latent
  EXPECT_ERROR(j, "\"q_lora_rank\" is 0; it must be between 1 and 65536.");
  j = glm5();
  j["index_head_dim"] = 32;
  EXPECT_ERROR(j, "\"index_head_dim\" is 32; it must be between 64 and 1024.");
  j = glm5();
  j["num_mtp_layers"] = 2;
  EXPECT_ERROR(j, "\"num_mtp_layers\" is 2 but \"num_nextn_predict_layers\" is 1");
  j = deepseek_v3();  // DeepSeek-V2-Lite style: q projected directly
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(parse(j).q_lora_rank, 0);
}

// ---- loading ------------------------------------------------------------------------------

class ModelConfigLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tetra_model_config_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }
  std::string load_error() {
    try {
      load_model_config(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::filesystem::path dir_;
};

TEST_F(ModelConfigLoad, ReadsConfigJson) {
  write(glm5().dump(2));
  ModelConfig c = load_model_config(dir_);
  EXPECT_EQ(c, parse(glm5()));
}

TEST_F(ModelConfigLoad, MissingFolderOrFileNamesTheFolder) {
  EXPECT_EQ(load_error(), "model folder " + dir_.string() + " has no config.json.");
  write("{}");
  std::filesystem::path file = dir_ / "config.json";
  try {
    load_model_config(file);
    ADD_FAILURE() << "a file is not a model folder";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), file.string() + " is not a folder; pass the model folder that holds config.json.");
  }
  std::filesystem::remove_all(dir_);
  EXPECT_EQ(load_error(), "model folder " + dir_.string() + " does not exist.");
}

TEST_F(ModelConfigLoad, InvalidJsonNamesTheFile) {
  write("{\"model_type\": \"qwen3_moe\",");
  EXPECT_NE(load_error().find((dir_ / "config.json").string() + " is not valid JSON"), std::string::npos);
  write(R"({"model_type": "qwen3_moe", "hidden_size": "big"})");
  EXPECT_EQ(load_error(), (dir_ / "config.json").string() + ": \"hidden_size\" must be an integer, not a string.");
}

}  // namespace
}  // namespace tetra

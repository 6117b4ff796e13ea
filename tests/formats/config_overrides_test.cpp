// --hf-overrides: the merge into config.json, the layers a shortened model keeps, and the
// errors, alone and through load_model_config / load_quant_config on the fixtures.
#include "formats/config_overrides.h"

#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/model_config.h"
#include "formats/quant_config.h"

namespace tetra {
namespace {

using nlohmann::json;

const std::filesystem::path kFixtures = std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures";

json merged(json config, const json& overrides) {
  apply_config_overrides(config, overrides);
  return config;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigOverrides, TopLevelValuesReplaceOrAdd) {
  const json config = {{"num_hidden_layers", 78}, {"eos_token_id", {1, 2}}, {"rope_scaling", {{"factor", 4.0}}}};
  const json got = merged(config, {{"num_hidden_layers", 6}, {"eos_token_id", 7}, {"vocab_size", 512}});
  EXPECT_EQ(got["num_hidden_layers"], 6);
  EXPECT_EQ(got["eos_token_id"], 7);  // a list replaced by a number
  EXPECT_EQ(got["vocab_size"], 512);  // added
  EXPECT_EQ(got["rope_scaling"], config["rope_scaling"]);  // untouched
}

TEST(ConfigOverrides, NestedObjectsMergeKeyByKey) {
  const json config = {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta", {{"fast", 32}, {"slow", 1}}}}}};
  const json got = merged(config, {{"rope_scaling", {{"factor", 8.0}, {"beta", {{"slow", 2}}}, {"mscale", 1.0}}}});
  const json want = {{"rope_scaling",
                      {{"rope_type", "yarn"}, {"factor", 8.0}, {"beta", {{"fast", 32}, {"slow", 2}}}, {"mscale", 1.0}}}};
  EXPECT_EQ(got, want);
}

TEST(ConfigOverrides, NonObjectsReplaceObjectsAndTheOtherWayRound) {
  const json config = {{"rope_scaling", {{"factor", 4.0}}}, {"quantization_config", nullptr}, {"layers", {1, 2}}};
  const json got = merged(config, {{"rope_scaling", nullptr},
                                   {"quantization_config", {{"quant_algo", "NVFP4"}}},
                                   {"layers", {3}}});
  EXPECT_TRUE(got["rope_scaling"].is_null());
  EXPECT_EQ(got["quantization_config"], (json{{"quant_algo", "NVFP4"}}));
  EXPECT_EQ(got["layers"], (json{3}));  // lists replace, never merge
}

TEST(ConfigOverrides, FewerLayersKeepTheFirstLayersFields) {
  const json config = {{"num_hidden_layers", 5},
                       {"mlp_layer_types", {"dense", "sparse", "sparse", "sparse", "sparse"}},
                       {"indexer_types", {"full", "shared", "full", "shared", "full"}},
                       {"index_topk_pattern", "FSFSF"},
                       {"mlp_only_layers", {0, 3, 4}},
                       {"first_k_dense_replace", 3}};
  const json got = merged(config, {{"num_hidden_layers", 2}});
  EXPECT_EQ(got["mlp_layer_types"], (json{"dense", "sparse"}));
  EXPECT_EQ(got["indexer_types"], (json{"full", "shared"}));
  EXPECT_EQ(got["index_topk_pattern"], "FS");
  EXPECT_EQ(got["mlp_only_layers"], (json{0}));
  EXPECT_EQ(got["first_k_dense_replace"], 2);  // every layer left is dense, as with 3
  // Fields the overrides set themselves are theirs, and more layers cut nothing.
  const json own = merged(config, {{"num_hidden_layers", 2}, {"mlp_layer_types", {"sparse", "sparse", "sparse"}}});
  EXPECT_EQ(own["mlp_layer_types"], (json{"sparse", "sparse", "sparse"}));
  EXPECT_EQ(merged(config, {{"num_hidden_layers", 7}})["mlp_layer_types"], config["mlp_layer_types"]);
}

TEST(ConfigOverrides, TextMustBeAJsonObject) {
  EXPECT_EQ(parse_config_overrides(""), json::object());
  EXPECT_EQ(parse_config_overrides(R"({"num_hidden_layers": 4})"), (json{{"num_hidden_layers", 4}}));
  EXPECT_EQ(error_of([] { parse_config_overrides("{num_hidden_layers: 4}"); }),
            "--hf-overrides is not valid JSON (at byte 4); give a JSON object such as "
            "'{\"num_hidden_layers\": 6}'.");
  EXPECT_EQ(error_of([] { parse_config_overrides("[1, 2]"); }),
            "--hf-overrides is an array; give a JSON object such as '{\"num_hidden_layers\": 6}'.");
  EXPECT_NE(error_of([] { parse_config_overrides("6"); }).find("--hf-overrides is an integer"), std::string::npos);
}

TEST(ConfigOverrides, LoadModelConfigShortensGlm5) {
  const auto dir = kFixtures / "glm5-config";
  const ModelConfig full = load_model_config(dir);
  const ModelConfig c = load_model_config(dir, R"({"num_hidden_layers": 4})");
  EXPECT_EQ(full.n_layers, 78);
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, false, false, true}));  // first_k_dense_replace 3
  EXPECT_EQ(c.layer_has_indexer.size(), 4u);
  EXPECT_EQ(c.hf_overrides, R"({"num_hidden_layers":4})");
  EXPECT_TRUE(full.hf_overrides.empty());
  ModelConfig same = c;
  same.n_layers = full.n_layers;
  same.layer_is_moe = full.layer_is_moe;
  same.layer_has_indexer = full.layer_has_indexer;
  same.hf_overrides.clear();
  EXPECT_EQ(same, full);  // nothing else changed
  EXPECT_EQ(load_model_config(dir, ""), full);
}

TEST(ConfigOverrides, LoadModelConfigCutsPerLayerLists) {
  // The transformers-5 fixture lists mlp_layer_types and indexer_types for its 3 layers.
  const ModelConfig c = load_model_config(kFixtures / "glm_moe_dsa-tiny", R"({"num_hidden_layers": 2})");
  EXPECT_EQ(c.layer_is_moe, (std::vector<bool>{false, true}));
  EXPECT_EQ(c.layer_has_indexer, (std::vector<bool>{true, true}));
}

TEST(ConfigOverrides, NestedOverrideReachesTheParsedConfig) {
  const auto dir = kFixtures / "deepseek_v3-tiny";
  const ModelConfig c = load_model_config(dir, R"({"rope_parameters": {"factor": 8.0}})");
  const ModelConfig file = load_model_config(dir);
  EXPECT_EQ(c.rope.yarn_factor, 8.0);
  EXPECT_EQ(c.rope.yarn_original_max_position, file.rope.yarn_original_max_position);  // kept
  EXPECT_EQ(c.rope.yarn_mscale_all_dim, file.rope.yarn_mscale_all_dim);
}

TEST(ConfigOverrides, AnInvalidResultNamesTheFlag) {
  const auto dir = kFixtures / "glm5-config";
  const std::string file = (dir / "config.json").string();
  EXPECT_EQ(error_of([&] { load_model_config(dir, R"({"num_hidden_layers": 0})"); }),
            file + " with --hf-overrides: \"num_hidden_layers\" is 0; it must be between 1 and 1024.");
  EXPECT_EQ(error_of([&] { load_model_config(dir, R"({"hidden_size": "wide"})"); }),
            file + " with --hf-overrides: \"hidden_size\" must be an integer, not a string.");
  EXPECT_NE(error_of([&] { load_model_config(dir, "[]"); }).find("--hf-overrides is an array"), std::string::npos);
  // More layers than the per-layer lists describe: the lists stay as written, and say so.
  EXPECT_EQ(error_of([&] { load_model_config(kFixtures / "glm_moe_dsa-tiny", R"({"num_hidden_layers": 5})"); }),
            (kFixtures / "glm_moe_dsa-tiny" / "config.json").string() +
                " with --hf-overrides: \"mlp_layer_types\" has 3 entries for 5 layers (num_hidden_layers).");
}

TEST(ConfigOverrides, QuantizationConfigTakesThemToo) {
  // A BF16 config made NVFP4 by an override (what --load-format dummy draws from), and back.
  const auto bf16 = kFixtures / "deepseek_v3-tiny";
  EXPECT_FALSE(load_quant_config(bf16).has_value());
  const auto q = load_quant_config(bf16, R"({"quantization_config": {"quant_method": "modelopt",
                                               "quant_algo": "NVFP4", "ignore": ["lm_head"]}})");
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::Nvfp4);
  EXPECT_NE(q->source.find("with --hf-overrides"), std::string::npos) << q->source;
  const auto nvfp4 = kFixtures / "deepseek_v3-tiny-nvfp4";
  ASSERT_TRUE(load_quant_config(nvfp4).has_value());
  EXPECT_EQ(load_quant_config(nvfp4, R"({"num_hidden_layers": 2})")->algo, load_quant_config(nvfp4)->algo);
}

}  // namespace
}  // namespace tetra

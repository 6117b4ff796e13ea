// ModelOpt quantization configs in both forms, and vLLM's module matching rules.
#include "formats/quant_config.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra {
namespace {

using nlohmann::json;

QuantConfig parse(const char* text) { return parse_quant_config(json::parse(text), "test.json"); }

TEST(QuantConfig, FnmatchFollowsPython) {
  EXPECT_TRUE(fnmatch("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn*"));
  EXPECT_TRUE(fnmatch("model.layers.3.mlp.gate", "*mlp.gate"));
  EXPECT_FALSE(fnmatch("model.layers.3.mlp.gate_proj", "*mlp.gate"));
  EXPECT_TRUE(fnmatch("lm_head", "lm_head"));
  EXPECT_TRUE(fnmatch("a.b", "a?b"));
  EXPECT_TRUE(fnmatch("layer7", "layer[0-9]"));
  EXPECT_FALSE(fnmatch("layerx", "layer[0-9]"));
  EXPECT_TRUE(fnmatch("layerx", "layer[!0-9]"));
  EXPECT_TRUE(fnmatch("a[b", "a[b"));  // unclosed '[' is a literal
  EXPECT_TRUE(fnmatch("", "*"));
  EXPECT_FALSE(fnmatch("abc", "ab"));
  EXPECT_TRUE(fnmatch("model.layers.10.mlp.experts.3.up_proj", "model.layers.*.mlp.experts.*"));
}

TEST(QuantConfig, HfQuantConfigNvfp4WithExclusions) {
  const QuantConfig q = parse(R"({
    "producer": {"name": "modelopt", "version": "0.23.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.0.self_attn*",
                                         "model.layers.3.mlp.gate", "*indexer*"]}})");
  EXPECT_EQ(q.algo, QuantAlgo::Nvfp4);
  EXPECT_FALSE(q.mixed);
  EXPECT_EQ(q.group_size, 16);
  EXPECT_EQ(q.kv_cache, KvCacheQuant::None);
  // exact
  EXPECT_EQ(q.module_quant("lm_head").algo, QuantAlgo::None);
  // fnmatch
  EXPECT_EQ(q.module_quant("model.layers.0.self_attn.q_proj").algo, QuantAlgo::None);
  EXPECT_EQ(q.module_quant("model.layers.5.self_attn.indexer.wk").algo, QuantAlgo::None);
  // substring, as vLLM's older-checkpoint rule does: the router name is inside nothing else
  // here, but a bare "lm_head" also catches "model.lm_head".
  EXPECT_EQ(q.module_quant("model.lm_head").algo, QuantAlgo::None);
  EXPECT_EQ(q.module_quant("model.layers.3.mlp.gate").algo, QuantAlgo::None);
  const ModuleQuant e = q.module_quant("model.layers.3.mlp.experts.7.gate_proj");
  EXPECT_EQ(e.algo, QuantAlgo::Nvfp4);
  EXPECT_EQ(e.group_size, 16);
  EXPECT_EQ(q.module_quant("model.layers.1.self_attn.q_proj").algo, QuantAlgo::Nvfp4);
}

TEST(QuantConfig, SubstringRuleMatchesLikeVllm) {
  // vLLM checks `exclude in prefix`: an entry naming a module also excludes any name that
  // contains it. ModelOpt never writes such collisions for quantized layers; we match vLLM.
  const QuantConfig q = parse(R"({"quantization": {"quant_algo": "NVFP4",
      "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["mlp.gate"]}})");
  EXPECT_TRUE(q.is_excluded("model.layers.0.mlp.gate"));
  EXPECT_TRUE(q.is_excluded("model.layers.0.mlp.gate_proj"));
  EXPECT_FALSE(q.is_excluded("model.layers.0.mlp.up_proj"));
}

TEST(QuantConfig, ConfigJsonFormW4a16) {
  const QuantConfig q = parse(R"({
    "config_groups": {"group_0": {"weights": {"dynamic": false, "num_bits": 4, "type": "float",
                                              "group_size": 16}, "targets": ["Linear"]}},
    "ignore": ["lm_head", "model.layers.0.self_attn*"], "quant_algo": "W4A16_NVFP4",
    "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"},
    "producer": {"name": "modelopt", "version": "0.40.0"}, "quant_method": "modelopt"})");
  EXPECT_EQ(q.algo, QuantAlgo::W4a16Nvfp4);
  EXPECT_EQ(q.group_size, 16);
  EXPECT_EQ(q.kv_cache, KvCacheQuant::Fp8);
  EXPECT_EQ(q.module_quant("model.layers.0.self_attn.o_proj").algo, QuantAlgo::None);
  EXPECT_EQ(q.module_quant("model.layers.0.mlp.down_proj").algo, QuantAlgo::W4a16Nvfp4);
}

TEST(QuantConfig, MixedPrecisionPerLayerMap) {
  const QuantConfig q = parse(R"({
    "producer": {"name": "modelopt", "version": "0.40.0"},
    "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
      "quantized_layers": {
        "model.layers.0.mlp.gate_proj": {"quant_algo": "FP8"},
        "model.layers.3.mlp.experts.0.gate_proj": {"quant_algo": "NVFP4", "group_size": 16},
        "model.layers.3.mlp.experts.1.down_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
        "lm_head": {"quant_algo": "nvfp4", "group_size": 16}}}})");
  EXPECT_TRUE(q.mixed);
  EXPECT_EQ(q.kv_cache, KvCacheQuant::Fp8);
  EXPECT_EQ(q.module_quant("model.layers.0.mlp.gate_proj").algo, QuantAlgo::Fp8);
  EXPECT_EQ(q.module_quant("model.layers.0.mlp.gate_proj").group_size, 0);
  EXPECT_EQ(q.module_quant("model.layers.3.mlp.experts.0.gate_proj").algo, QuantAlgo::Nvfp4);
  EXPECT_EQ(q.module_quant("model.layers.3.mlp.experts.1.down_proj").algo,
            QuantAlgo::W4a16Nvfp4);
  // Not listed: unquantized.
  EXPECT_EQ(q.module_quant("model.layers.0.self_attn.q_proj").algo, QuantAlgo::None);
  // A parent takes the algo of an entry under it (vLLM's RoutedExperts lookup).
  EXPECT_EQ(q.module_quant("model.layers.3.mlp.experts.0").algo, QuantAlgo::Nvfp4);
  // "*.lm_head" falls back to the "lm_head" entry; algos are case-insensitive.
  EXPECT_EQ(q.module_quant("model.lm_head").algo, QuantAlgo::Nvfp4);
}

TEST(QuantConfig, ClearErrors) {
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "INT4_AWQ"}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "MXFP8"}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"kv_cache_quant_algo": null}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "NVFP4", "group_size": "x"}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}})"),
               Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": [3]}})"),
               Error);
  EXPECT_THROW(parse(R"({"quant_method": "fp8", "quant_algo": "FP8"})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "MIXED_PRECISION",
      "quantized_layers": {"a": {"quant_algo": "INT8"}}}})"), Error);
  EXPECT_THROW(parse(R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}})"),
               Error);
  EXPECT_THROW(parse(R"([1, 2])"), Error);
  try {
    parse(R"({"quantization": {"quant_algo": "INT4_AWQ"}})");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("INT4_AWQ"), std::string::npos);
  }
}

TEST(QuantConfig, LoadsFromAFolderPreferringConfigJson) {
  const auto dir = std::filesystem::temp_directory_path() / "tetra_quant_config_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
  };
  write("config.json", R"({"model_type": "qwen3_moe"})");
  EXPECT_FALSE(load_quant_config(dir).has_value());

  write("hf_quant_config.json", R"({"quantization": {"quant_algo": "NVFP4",
      "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head"]}})");
  auto q = load_quant_config(dir);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::Nvfp4);

  write("config.json", R"({"model_type": "qwen3_moe", "quantization_config": {
      "quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "ignore": ["lm_head"]}})");
  q = load_quant_config(dir);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::W4a16Nvfp4);

  // A MIXED_PRECISION quantization_config without its map falls back to hf_quant_config.json.
  write("config.json", R"({"quantization_config": {"quant_method": "modelopt",
      "quant_algo": "MIXED_PRECISION"}})");
  q = load_quant_config(dir);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::Nvfp4);

  write("config.json", R"({"quantization_config": {"quant_method": "mxfp4"}})");
  EXPECT_THROW(load_quant_config(dir), Error);
  write("config.json", R"({"quantization_config": )");
  EXPECT_THROW(load_quant_config(dir), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tetra

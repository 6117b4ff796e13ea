// model_sizes against published parameter counts, hand-computed KV bytes and the tiny
// checkpoints transformers 5.17 wrote (tests/fixtures): there the count must be exact.
#include "formats/model_config.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model_config_fixtures.h"

namespace tetra {
namespace {

using nlohmann::json;
using namespace tetra::testing;

// ---- sizes --------------------------------------------------------------------------------

TEST(ModelSizes, Glm5MatchesPublishedFigures) {
  ModelSizes s = model_sizes(parse(glm5()));
  // Published: 744B total, 40B active. By hand from §1.1 (MTP layer 78 excluded):
  //   embed + lm_head 2 x 154880 x 6144 (+ final norm)             =   1.903B
  //   attention per layer: MLA 165.0M + DSA indexer 9.37M + norms 12K = 174.4M x 78 = 13.60B
  //     (q_a 12.58M, q_b 33.55M, kv_a 3.54M, kv_b 14.68M, o 100.66M, q/kv norms 2.5K)
  //   dense MLP 3 x 6144 x 12288 = 226.5M                             x 3  =  0.68B
  //   MoE layer: 256 experts x 37.75M + shared 37.75M + router 1.57M   x 75 = 727.72B
  //   total 743,911,218,432 = 743.9B, 0.01% under the published 744B.
  // Active keeps 8 of 256 experts: 341.3M per MoE layer x 75 = 25.6B, 41.78B in all, 4.5%
  // over the published 40B. Leaving out the input embedding table (0.95B; a token reads one
  // row of it) gives 40.83B, and the rest is rounding: the card's "40B" is not more precise
  // than that. We count the whole table in active (DeepSeek-V3: 37.55B here, 37B on its card).
  EXPECT_EQ(s.params_total, 743911218432);
  EXPECT_EQ(s.params_active, 41784728832);
  EXPECT_NEAR(s.params_total / 744e9, 1.0, 0.01);
  EXPECT_NEAR(s.params_active / 40e9, 1.0, 0.05);
  EXPECT_NEAR((s.params_active - 154880.0 * 6144) / 40e9, 1.0, 0.03);
  // Latent (512) + rope key (64) per layer, plus the 128-dim indexer key, bf16.
  EXPECT_EQ(s.kv_bytes_per_token, 78 * (512 + 64) * 2 + 78 * 128 * 2);
  EXPECT_EQ(model_sizes(parse(glm5()), 1).kv_bytes_per_token, 78 * (512 + 64 + 128));
}

TEST(ModelSizes, Glm5ConfigFixture) {
  // tests/fixtures/glm5-config is the published file that `tetra inspect` reads.
  const std::filesystem::path dir = std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / "glm5-config";
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c, parse(glm5()));
  EXPECT_EQ(model_sizes(c).params_total, 743911218432);
}

TEST(ModelSizes, KimiK2ConfigFixture) {
  // tests/fixtures/kimi_k2-config is the published file (its FP8 quantization_config included).
  const std::filesystem::path dir = std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / "kimi_k2-config";
  ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c, parse(kimi_k2()));
  EXPECT_EQ(model_sizes(c).params_total, 1026408232448);
  EXPECT_EQ(model_sizes(c).params_active, 32861500928);
}

TEST(ModelSizes, PublishedModels) {
  // Computed here (MTP layers excluded, embeddings counted) against the model cards.
  // GLM-4.5's card (355B-A32B) likely counts its MTP layer (~3.9B with a full MoE block); we
  // get 352.8B / 33.6B. GLM-4.7-Flash's "A3B" is a rounded name: 3.90B active, 3.58B without
  // the input embedding, so only its total is compared.
  // `exact` is what transformers 5.17 counts for the same config.json (parameters plus the
  // e_score_correction_bias buffers, model built on the meta device; tools/model_config_ref.py).
  struct Case {
    const char* name;
    json config;
    double total, active, tolerance;  // published, in parameters; 0: not compared
    int64_t exact;
  };
  const Case cases[] = {
      {"DeepSeek-V3 671B-A37B", deepseek_v3(), 671e9, 37e9, 0.02, 671026419200},  // active 37.55B
      {"Qwen3-30B-A3B", qwen3_30b(), 30.5e9, 3.3e9, 0.02, 30532122624},           // active 3.35B
      {"Mixtral 8x7B", mixtral_8x7b(), 46.7e9, 12.9e9, 0.01, 46702792704},        // active 12.88B
      {"GLM-4.5 355B-A32B", glm45(), 355e9, 32e9, 0.06, 352797829024},            // active 33.63B
      {"GLM-4.7-Flash 30B-A3B", glm47_flash(), 30e9, 0, 0.01, 29943393920},       // active 3.90B
      {"GLM-5 744B-A40B", glm5(), 744e9, 40e9, 0.05, 743911218432},               // active 41.78B
      // Kimi K2 ("1T total, 32B activated"), by hand: embed + lm_head 2 x 163840 x 7168 + norm
      // = 2.349B; MLA per layer 101.14M (q_a 11.01M, q_b 18.87M, kv_a 4.13M, kv_b 8.39M, o
      // 58.72M, norms) x 61 = 6.169B; dense layer 0.396B; 60 MoE layers of 384 + 1 experts of
      // 44.04M, router 2.75M and bias = 16.958B each. Active: 8 + 1 experts, 32.86B.
      {"Kimi K2 1T-A32B", kimi_k2(), 1e12, 32e9, 0.03, 1026408232448},            // active 32.86B
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ModelSizes s = model_sizes(parse(c.config));
    EXPECT_EQ(s.params_total, c.exact);
    EXPECT_NEAR(s.params_total / c.total, 1.0, c.tolerance) << s.params_total;
    if (c.active > 0) {
      EXPECT_NEAR(s.params_active / c.active, 1.0, c.tolerance) << s.params_active;
    }
  }
  // Mixtral by hand: q and o are 4096 x 4096, k and v 4096 x 1024 (8 kv heads x 128).
  const int64_t attn = 4096LL * 4096 * 2 + 4096LL * 1024 * 2, expert = 3LL * 4096 * 14336;
  const int64_t layer_shared = attn + 2 * 4096 + 8 * 4096;  // + norms + router
  const int64_t edges = 2LL * 32000 * 4096 + 4096;
  ModelSizes m = model_sizes(parse(mixtral_8x7b()));
  EXPECT_EQ(m.params_total, edges + 32 * (layer_shared + 8 * expert));
  EXPECT_EQ(m.params_active, edges + 32 * (layer_shared + 2 * expert));
}

TEST(ModelSizes, KvBytesAndTiedEmbeddings) {
  ModelConfig q = parse(qwen3_30b());
  EXPECT_EQ(model_sizes(q).kv_bytes_per_token, 48 * 2 * 4 * 128 * 2);
  EXPECT_EQ(model_sizes(q, 1).kv_bytes_per_token, 48 * 2 * 4 * 128);
  ModelConfig d = parse(deepseek_v3());
  EXPECT_EQ(model_sizes(d).kv_bytes_per_token, 61 * (512 + 64) * 2);  // MLA, no indexer
  json tied = qwen3_30b();
  tied["tie_word_embeddings"] = true;
  ModelSizes a = model_sizes(q), b = model_sizes(parse(tied));
  EXPECT_EQ(a.params_total - b.params_total, 151936 * 2048);
  EXPECT_EQ(a.params_active - b.params_active, 151936 * 2048);
  EXPECT_THROW(model_sizes(q, 0), Error);
}

TEST(ModelSizes, SharedIndexerLayersHoldNoIndexer) {
  json j = glm5();
  ModelSizes full = model_sizes(parse(j));
  j["indexer_types"] = json::array();
  for (int i = 0; i < 78; ++i) j["indexer_types"].push_back(i % 2 == 0 ? "full" : "shared");
  ModelSizes half = model_sizes(parse(j));
  const int64_t indexer = 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32;
  EXPECT_EQ(full.params_total - half.params_total, 39 * indexer);
  EXPECT_EQ(full.kv_bytes_per_token - half.kv_bytes_per_token, 39 * 128 * 2);
}

TEST(ModelSizes, LargestBoundsFitInt64) {
  // Every dimension at its bound: the bounds are chosen so that sizes stay within int64.
  json j = {{"model_type", "qwen3_moe"}, {"hidden_size", 65536}, {"num_hidden_layers", 1024},
            {"num_attention_heads", 1024}, {"num_key_value_heads", 1024}, {"head_dim", 1024},
            {"vocab_size", 4194304}, {"intermediate_size", 1048576}, {"moe_intermediate_size", 1048576},
            {"num_experts", 4096}, {"num_experts_per_tok", 4096}, {"max_position_embeddings", 16777216}};
  ModelSizes s = model_sizes(parse(j));
  EXPECT_GT(s.params_total, int64_t{864} * 1000 * 1000 * 1000 * 1000 * 1000);  // 8.6e17 of experts
  EXPECT_EQ(s.params_active, s.params_total);
  EXPECT_EQ(s.kv_bytes_per_token, int64_t{1024} * 2 * 1024 * 1024 * 2);
}

// Each fixture's model.safetensors holds every parameter transformers built (and the F32
// e_score_correction_bias buffers, which model_sizes counts as router weights); its
// expected.json records what the loaded modules hold, which the parsed config must predict.
TEST(ModelSizes, FixtureCheckpointsMatchExactly) {
  const std::filesystem::path root = std::filesystem::path(TETRA_SOURCE_DIR) / "tests" / "fixtures";
  int n_fixtures = 0;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    // Config-only fixtures (glm5-config) have no weights to count, and quantized ones (the
    // *-nvfp4 copies) store packed codes and scales, not one element per parameter.
    if (!std::filesystem::exists(entry.path() / "model.safetensors") ||
        std::filesystem::exists(entry.path() / "hf_quant_config.json"))
      continue;
    SCOPED_TRACE(entry.path().filename().string());
    ++n_fixtures;
    ModelConfig c = load_model_config(entry.path());
    std::unique_ptr<SafetensorsFile> file = SafetensorsFile::open(entry.path() / "model.safetensors");
    int64_t stored = 0;
    for (const TensorInfo& t : file->header().tensors) stored += t.shape.numel();
    EXPECT_EQ(model_sizes(c).params_total, stored);

    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string layer = "model.layers." + std::to_string(l) + ".";
      bool router = file->find(layer + "mlp.gate.weight") || file->find(layer + "block_sparse_moe.gate.weight");
      EXPECT_EQ(router, c.layer_is_moe[l]) << "layer " << l;
      if (c.family == ModelFamily::GlmMoeDsa) {
        EXPECT_EQ(file->find(layer + "self_attn.indexer.wk.weight") != nullptr, c.layer_has_indexer[l]);
      }
    }
    EXPECT_EQ(file->find("lm_head.weight") == nullptr, c.tie_word_embeddings);

    json facts = json::parse(std::ifstream(entry.path() / "expected.json"))["module_facts"];
    EXPECT_EQ(static_cast<int64_t>(facts["rotary_emb.inv_freq"].size()), c.rope.rotary_dim / 2);
    EXPECT_NEAR(facts["rotary_emb.attention_scaling"].get<double>(), c.rope.yarn_attention_factor, 1e-12);
    EXPECT_DOUBLE_EQ(facts["model.norm.variance_epsilon"].get<double>(), c.rms_norm_eps);
    // The softmax scale a kernel must use: head_dim^-0.5, and for MLA with YaRN DeepSeek's
    // mscale(factor, mscale_all_dim)^2 on top.
    double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
    if (c.is_mla() && c.rope.yarn_factor > 1 && c.rope.yarn_mscale_all_dim != 0) {
      double m = 0.1 * c.rope.yarn_mscale_all_dim * std::log(c.rope.yarn_factor) + 1.0;
      scale *= m * m;
    }
    EXPECT_NEAR(facts["layer0.self_attn.scaling"].get<double>(), scale, 1e-12);
    EXPECT_EQ(facts["layer0.self_attn.num_key_value_groups"].get<int64_t>(), c.n_heads / c.n_kv_heads);
  }
  EXPECT_GE(n_fixtures, 6);
}

}  // namespace
}  // namespace tetra

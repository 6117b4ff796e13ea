// The MoE tuning cache needs no GPU: entries survive a restart through the file, a damaged
// file costs a re-tune rather than an error, and token counts share power-of-two buckets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "ops/cuda/moe_tune.h"

namespace tetra::ops::cuda {
namespace {

std::string temp_cache(const char* name) {
  return testing::TempDir() + "tetra_" + name + "_" + std::to_string(getpid()) + ".json";
}

TEST(MoeTune, BucketsArePowersOfTwo) {
  EXPECT_EQ(moe_token_bucket(1), 1);
  EXPECT_EQ(moe_token_bucket(3), 4);
  EXPECT_EQ(moe_token_bucket(64), 64);
  EXPECT_EQ(moe_token_bucket(65), 128);
  EXPECT_EQ(moe_token_bucket(16384), 16384);
}

TEST(MoeTune, EntriesSurviveARestart) {
  const std::string path = temp_cache("tune_restart");
  std::remove(path.c_str());
  {
    MoeTuner tuner(path);
    EXPECT_FALSE(tuner.find("gpu|nvfp4|H6144|I2048|E257|k8|T64"));
    MoeConfig c;
    c.tile_tokens = 16;
    c.why = "fastest";
    tuner.store("gpu|nvfp4|H6144|I2048|E257|k8|T64", c);
    tuner.store("gpu|nvfp4|H6144|I2048|E257|k8|T256", MoeConfig{.tile_tokens = 8, .hot_tokens = 32});
  }
  MoeTuner again(path);
  const auto c = again.find("gpu|nvfp4|H6144|I2048|E257|k8|T64");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->tile_tokens, 16);
  EXPECT_TRUE(c->tuned);
  EXPECT_NE(c->why.find("fastest"), std::string::npos);
  EXPECT_EQ(c->hot_tokens, 0);
  const auto hot = again.find("gpu|nvfp4|H6144|I2048|E257|k8|T256");
  ASSERT_TRUE(hot);
  EXPECT_EQ(hot->tile_tokens, 8);
  EXPECT_EQ(hot->hot_tokens, 32);
  EXPECT_FALSE(again.find("gpu|nvfp4|H6144|I2048|E257|k8|T128"));
  std::remove(path.c_str());
}

TEST(MoeTune, DamagedFileIsIgnored) {
  const std::string path = temp_cache("tune_damaged");
  std::ofstream(path) << "{ not json";
  MoeTuner tuner(path);
  EXPECT_FALSE(tuner.find("anything"));
  MoeConfig c;
  c.tile_tokens = 8;
  tuner.store("k", c);  // rewrites the file whole
  EXPECT_TRUE(MoeTuner(path).find("k"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tetra::ops::cuda

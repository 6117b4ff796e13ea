// Calibration records what transformers' forward feeds each MLP linear: checked against the
// qwen3_moe-tiny fixture's debug tensors (layer inputs and attention outputs from transformers)
// recomputed through the post-attention norm and the BF16 weights.
#include "runtime/calibrate.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/linear_tensors.h"
#include "formats/model_config.h"
#include "formats/quant_config.h"
#include "formats/quantize_checkpoint.h"
#include "formats/safetensors.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

const fs::path kFixture = fs::path(TETRA_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe-tiny";

std::vector<float> floats(TensorView t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[size_t(i)] = t.dtype == DType::F32 ? t.as<const float>()[i] : bf16_to_f32(t.as<const uint16_t>()[i]);
  return v;
}

// x W^T for x [T, K] and W [N, K] (row-major), in double.
std::vector<double> matmul_t(const std::vector<double>& x, const std::vector<float>& w, int64_t t,
                             int64_t k, int64_t n) {
  std::vector<double> y(static_cast<size_t>(t * n), 0.0);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) y[size_t(i * n + j)] += x[size_t(i * k + l)] * w[size_t(j * k + l)];
  return y;
}

double amax(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

struct Reference {
  std::vector<int32_t> prompt;
  // Per layer: the MLP input [T, H] as transformers computed it.
  std::vector<std::vector<double>> mlp_in;
};

Reference reference(const ModelConfig& c, const Checkpoint& ckpt) {
  auto dbg = SafetensorsFile::open(kFixture / "debug.safetensors");
  Reference r;
  const TensorView ids = dbg->view("input_ids");
  for (int64_t i = 0; i < ids.numel(); ++i) r.prompt.push_back(int32_t(ids.as<const int64_t>()[i]));
  const int64_t T = ids.numel(), H = c.hidden_size;
  const std::vector<float> hs = floats(dbg->view("hidden_states"));  // [L+1, T, H]
  const std::vector<float> attn = floats(dbg->view("attn_out"));     // [L, T, H]
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::vector<float> w =
        floats(ckpt.get("model.layers." + std::to_string(l) + ".post_attention_layernorm.weight"));
    std::vector<double> x(static_cast<size_t>(T * H));
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      std::vector<double> h(static_cast<size_t>(H));
      for (int64_t j = 0; j < H; ++j) {
        h[size_t(j)] = double(hs[size_t((l * T + t) * H + j)]) + attn[size_t((l * T + t) * H + j)];
        ss += h[size_t(j)] * h[size_t(j)];
      }
      const double inv = 1.0 / std::sqrt(ss / double(H) + c.rms_norm_eps);
      for (int64_t j = 0; j < H; ++j) x[size_t(t * H + j)] = h[size_t(j)] * inv * w[size_t(j)];
    }
    r.mlp_in.push_back(std::move(x));
  }
  return r;
}

// amax of silu(x Wg^T) * (x Wu^T) for the MLP under `prefix`.
double down_input_amax(const Checkpoint& ckpt, const std::string& prefix,
                       const std::vector<double>& x, int64_t T, int64_t H) {
  const TensorView g = ckpt.get(prefix + "gate_proj.weight");
  const int64_t I = g.dim(0);
  const auto gy = matmul_t(x, floats(g), T, H, I);
  const auto uy = matmul_t(x, floats(ckpt.get(prefix + "up_proj.weight")), T, H, I);
  std::vector<double> h(gy.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = gy[i] / (1.0 + std::exp(-gy[i])) * uy[i];
  return amax(h);
}

TEST(Calibrate, InputAmaxMatchesTransformersActivations) {
  ASSERT_TRUE(fs::exists(kFixture / "debug.safetensors")) << "the fixture is missing";
  const ModelConfig c = load_model_config(kFixture);
  auto ckpt = Checkpoint::open(kFixture);
  const Reference ref = reference(c, *ckpt);
  const int64_t T = int64_t(ref.prompt.size()), H = c.hidden_size;
  const auto got = runtime::calibrate_input_amax(kFixture, ref.prompt, {});
  auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-4 * std::max(1.0, std::fabs(b)); };
  int checked = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    const double x_amax = amax(ref.mlp_in[size_t(l)]);
    if (!c.layer_is_moe[size_t(l)]) {
      EXPECT_TRUE(near(got.at(p + "gate_proj"), x_amax)) << got.at(p + "gate_proj") << " vs " << x_amax;
      EXPECT_TRUE(near(got.at(p + "up_proj"), x_amax));
      const double d = down_input_amax(*ckpt, p, ref.mlp_in[size_t(l)], T, H);
      EXPECT_TRUE(near(got.at(p + "down_proj"), d)) << got.at(p + "down_proj") << " vs " << d;
      checked += 3;
      continue;
    }
    EXPECT_TRUE(near(got.at(p + "gate"), x_amax));  // the router reads the same input
    // Every expert saw every token, whatever the router chose.
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string ep = p + "experts." + std::to_string(e) + ".";
      EXPECT_TRUE(near(got.at(ep + "gate_proj"), x_amax)) << ep;
      EXPECT_TRUE(near(got.at(ep + "up_proj"), x_amax)) << ep;
      const double d = down_input_amax(*ckpt, ep, ref.mlp_in[size_t(l)], T, H);
      EXPECT_TRUE(near(got.at(ep + "down_proj"), d)) << ep << " " << got.at(ep + "down_proj") << " vs " << d;
      checked += 3;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Calibrate, CalibratedCheckpointCarriesInputScales) {
  ASSERT_TRUE(fs::exists(kFixture / "model.safetensors")) << "the fixture is missing";
  const std::vector<int32_t> tokens = {5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 300, 12, 13};
  runtime::CalibrateOptions opt;
  opt.window = 5;  // several fresh windows
  int64_t calls = 0;
  opt.on_progress = [&](int64_t, int64_t) { ++calls; };
  const auto amax = runtime::calibrate_input_amax(kFixture, tokens, opt);
  EXPECT_EQ(calls, 3);
  const fs::path out = fs::temp_directory_path() / ("tetra_calib_test_" + std::to_string(::getpid()));
  fs::remove_all(out);
  QuantizeOptions q;
  q.src = kFixture;
  q.dst = out;
  q.input_amax = amax;
  EXPECT_EQ(quantize_checkpoint(q).algo, "NVFP4");
  const auto qc = load_quant_config(out);
  ASSERT_TRUE(qc.has_value());
  auto ckpt = Checkpoint::open(out);
  const std::string m = "model.layers.0.mlp.experts.3.gate_proj";
  const LinearTensors w = load_linear(*ckpt, &*qc, m, ckpt->find(m + ".weight")->shape[0],
                                      ckpt->find(m + ".weight")->shape[1] * 2);
  const float a = std::max(amax.at(m), amax.at("model.layers.0.mlp.experts.3.up_proj"));
  EXPECT_EQ(w.input_scale, a / 2688.0f);
  fs::remove_all(out);
  EXPECT_THROW(runtime::calibrate_input_amax(kFixture, {}, {}), Error);
  EXPECT_THROW(runtime::calibrate_input_amax(kFixture, {1 << 30}, {}), Error);
}

}  // namespace
}  // namespace tetra

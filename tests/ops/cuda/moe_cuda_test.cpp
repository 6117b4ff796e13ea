// The CUDA MoE layer against a host reference on the dequantized weights it reads
// (W = e2m1 * f32(e4m3 scale) * global_scale, computed in double): the test measures the
// kernels, not the quantization. Awkward shapes: 1 token, counts off the tile grid, experts
// with no tokens, all tokens on one expert, top-k equal to the expert count.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_tune.h"
#include "cuda_test_util.h"

namespace tetra::ops::cuda {
namespace {

using testing_util::DevBuf;
using testing_util::have_gpu;

TensorView dev_view(void* p, DType dt, Shape s) { return TensorView{p, dt, s, Device::Cuda}; }

// One matrix with its host storage and its dequantized values.
struct HostLinear {
  std::vector<uint8_t> w, scale;
  std::vector<uint16_t> wbf16;
  std::vector<double> deq;  // [n_out, n_in]
  LinearWeight view;
};

void make_linear(HostLinear& m, WeightFormat f, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  m.deq.assign(size_t(n_out * n_in), 0.0);
  m.view.format = f;
  m.view.n_out = n_out;
  m.view.n_in = n_in;
  if (f == WeightFormat::Nvfp4) {
    std::uniform_int_distribution<int> byte(0, 255);
    // Mostly normal E4M3 scales around 1, some subnormal (bytes 1..7) to test that path.
    std::uniform_int_distribution<int> sc(0x28, 0x40), sub(1, 7), pick(0, 15);
    m.w.resize(size_t(n_out * n_in / 2));
    m.scale.resize(size_t(n_out * n_in / 16));
    for (auto& b : m.w) b = uint8_t(byte(rng));
    for (auto& s : m.scale) s = uint8_t(pick(rng) == 0 ? sub(rng) : sc(rng));
    const float gs = std::uniform_real_distribution<float>(0.004f, 0.02f)(rng);
    for (int64_t n = 0; n < n_out; ++n)
      for (int64_t k = 0; k < n_in; ++k) {
        const uint8_t b = m.w[size_t(n * n_in / 2 + k / 2)];
        const double v = e2m1_to_f32((k & 1) ? b >> 4 : b & 0xf);
        m.deq[size_t(n * n_in + k)] = v * e4m3_to_f32(m.scale[size_t(n * n_in / 16 + k / 16)]) * gs;
      }
    m.view.weight = TensorView{m.w.data(), DType::U8, {n_out, n_in / 2}, Device::Cpu};
    m.view.block_scale = TensorView{m.scale.data(), DType::F8_E4M3, {n_out, n_in / 16}, Device::Cpu};
    m.view.global_scale = gs;
  } else {
    std::normal_distribution<float> nd(0.0f, 0.05f);
    m.wbf16.resize(size_t(n_out * n_in));
    for (size_t i = 0; i < m.wbf16.size(); ++i) {
      m.wbf16[i] = f32_to_bf16(nd(rng));
      m.deq[i] = bf16_to_f32(m.wbf16[i]);
    }
    m.view.weight = TensorView{m.wbf16.data(), DType::BF16, {n_out, n_in}, Device::Cpu};
  }
}

struct HostExpert {
  HostLinear gate, up, down;
  MlpWeights view() const { return MlpWeights{gate.view, up.view, down.view}; }
};

// y[H] = down(silu(gate x) * up x), all in double.
std::vector<double> ref_expert(const HostExpert& e, const std::vector<double>& x, int64_t H, int64_t I) {
  std::vector<double> h(static_cast<size_t>(I)), y(static_cast<size_t>(H), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t k = 0; k < H; ++k) {
      g += e.gate.deq[size_t(i * H + k)] * x[size_t(k)];
      u += e.up.deq[size_t(i * H + k)] * x[size_t(k)];
    }
    h[size_t(i)] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t o = 0; o < H; ++o) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += e.down.deq[size_t(o * I + i)] * h[size_t(i)];
    y[size_t(o)] = s;
  }
  return y;
}

enum class Ids { Random, OneExpert, AllExperts };

struct MoeCase {
  const char* name;
  int64_t H, I;
  int E, k, T;
  Ids ids;
  bool shared;
  WeightFormat format;
  // Expert parallelism: the experts object holds ids [first, first + held) of the E the ids
  // are drawn from (held 0: all); the others' slots add nothing.
  int first = 0, held = 0;
  int n_held() const { return held > 0 ? held : E; }
  bool holds(int e) const { return e >= first && e < first + n_held(); }
};

void run_case(const MoeCase& c) {
  std::mt19937 rng(1234 + c.T * 7 + c.E);
  std::vector<HostExpert> experts(size_t(c.E));
  for (auto& e : experts) {
    make_linear(e.gate, c.format, c.I, c.H, rng);
    make_linear(e.up, c.format, c.I, c.H, rng);
    make_linear(e.down, c.format, c.H, c.I, rng);
  }
  HostExpert shared;
  if (c.shared) {
    make_linear(shared.gate, c.format, c.I, c.H, rng);
    make_linear(shared.up, c.format, c.I, c.H, rng);
    make_linear(shared.down, c.format, c.H, c.I, rng);
  }
  // Inputs: x bf16 around unit size, ids distinct per token, positive weights.
  std::vector<uint16_t> x(size_t(c.T * c.H));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  std::vector<int> ids(size_t(c.T * c.k));
  std::vector<float> w(size_t(c.T * c.k));
  std::vector<int> perm(size_t(c.E));
  for (int t = 0; t < c.T; ++t) {
    for (int e = 0; e < c.E; ++e) perm[size_t(e)] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < c.k; ++j) {
      int e = perm[size_t(j)];
      if (c.ids == Ids::OneExpert) e = (3 + j) % c.E;  // every token: experts 3, 4, ...
      if (c.ids == Ids::AllExperts) e = (t + j) % c.E;
      if (c.held > 0 && t == 0) e = (c.first + c.held + j) % c.E;  // none of this rank's
      ids[size_t(t * c.k + j)] = e;
      w[size_t(t * c.k + j)] = std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
    }
  }
  // Reference.
  std::vector<double> ref(size_t(c.T * c.H), 0.0);
  for (int t = 0; t < c.T; ++t) {
    std::vector<double> xt(size_t(c.H));
    for (int64_t k = 0; k < c.H; ++k) xt[size_t(k)] = bf16_to_f32(x[size_t(t * c.H + k)]);
    for (int j = 0; j < c.k + (c.shared ? 1 : 0); ++j) {
      const bool sh = j == c.k;
      if (!sh && !c.holds(ids[size_t(t * c.k + j)])) continue;
      const HostExpert& e = sh ? shared : experts[size_t(ids[size_t(t * c.k + j)])];
      const double wj = sh ? 1.0 : w[size_t(t * c.k + j)];
      const std::vector<double> y = ref_expert(e, xt, c.H, c.I);
      for (int64_t o = 0; o < c.H; ++o) ref[size_t(t * c.H + o)] += wj * y[size_t(o)];
    }
  }

  const std::string cache = testing::TempDir() + "tetra_moe_tune_" + std::to_string(getpid()) + ".json";
  MoeTuner tuner(cache);
  Context ctx;
  std::vector<MlpWeights> views;
  for (int e = c.first; e < c.first + c.n_held(); ++e) views.push_back(experts[size_t(e)].view());
  const MlpWeights shared_view = shared.view();
  auto prepared = prepare_experts(ctx, views, c.shared ? &shared_view : nullptr, &tuner);
  prepared->set_first_expert(c.first);
  const bool fast = moe_fast_path(*prepared);

  DevBuf dx(x.size() * 2), dids(ids.size() * 4), dw(w.size() * 4), dout(x.size() * 2);
  const int64_t ws_bytes = moe_workspace_bytes(*prepared, c.T, c.k);
  DevBuf ws{static_cast<size_t>(ws_bytes)};
  CK(cudaMemcpy(dx.p, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dids.p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw.p, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  ctx.workspace = Workspace{ws.p, ws_bytes};

  // The fused decode kernel takes NVFP4 experts on the fast grid (H and I multiples of 128) up
  // to 64 tokens and 512 (token, expert) rows; anything else must be refused, not misread.
  const int kk = c.k + (c.shared ? 1 : 0);
  const bool fused_takes = c.format == WeightFormat::Nvfp4 && c.H % 128 == 0 && c.I % 128 == 0 && c.T <= 64 &&
                           c.T * kk <= 512;
  std::vector<MoeConfig> configs;
  // 0: the tuner's choice (tune_moe times the candidates first, into a test-local cache).
  // Off the fast grid the general path runs, which takes no tile.
  for (int tile : {0, 8, 16, 32, 64, 128, 192, 256})
    if (fast || tile == 0) configs.push_back(MoeConfig{tile});
  if (fast) configs.push_back(MoeConfig{8, false, "", true});
  // Experts with more than 8 rows in wider items of their own list (Ids::OneExpert makes them).
  if (fast)
    for (int hot : {16, 32, 64, 128}) configs.push_back(MoeConfig{.tile_tokens = 8, .hot_tokens = hot});
  for (const MoeConfig& config : configs) {
    const int tile = config.tile_tokens;
    SCOPED_TRACE(testing::Message() << c.name << " " << config.str());
    const bool refused = (std::max(tile, config.hot_tokens) >= 128 && c.format == WeightFormat::Dense) ||
                         (config.fused && !fused_takes);
    if (refused) {
      // Tiles of 128 tokens and more are the NVFP4 wgmma path; BF16 experts must be refused, not misread.
      EXPECT_THROW(moe_experts(ctx, dev_view(dx.p, DType::BF16, {c.T, c.H}),
                               dev_view(dids.p, DType::I32, {c.T, c.k}), dev_view(dw.p, DType::F32, {c.T, c.k}),
                               *prepared, dev_view(dout.p, DType::BF16, {c.T, c.H}), config),
                   Error);
      continue;
    }
    CK(cudaMemset(dout.p, 0xff, x.size() * 2));  // NaN: every element must be written
    CK(cudaMemset(ws.p, 0xff, size_t(ws_bytes)));
    if (tile == 0)
      tune_moe(ctx, dev_view(dx.p, DType::BF16, {c.T, c.H}), dev_view(dids.p, DType::I32, {c.T, c.k}),
               dev_view(dw.p, DType::F32, {c.T, c.k}), *prepared, dev_view(dout.p, DType::BF16, {c.T, c.H}));
    CK(cudaMemset(dout.p, 0xff, x.size() * 2));
    moe_experts(ctx, dev_view(dx.p, DType::BF16, {c.T, c.H}), dev_view(dids.p, DType::I32, {c.T, c.k}),
                dev_view(dw.p, DType::F32, {c.T, c.k}), *prepared,
                dev_view(dout.p, DType::BF16, {c.T, c.H}), config);
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> out(x.size());
    CK(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));
    // bf16 operands and a bf16 intermediate h and output: relative L2 error ~3e-3; a wrong
    // row, block scale or token would be of order 1. Checked per token and overall.
    double err2 = 0, ref2 = 0;
    for (int t = 0; t < c.T; ++t) {
      double e2 = 0, r2 = 0;
      for (int64_t o = 0; o < c.H; ++o) {
        const double g = bf16_to_f32(out[size_t(t * c.H + o)]), r = ref[size_t(t * c.H + o)];
        ASSERT_TRUE(std::isfinite(g)) << "token " << t << " column " << o << " not written";
        e2 += (g - r) * (g - r);
        r2 += r * r;
      }
      if (r2 == 0) {
        ASSERT_EQ(e2, 0.0) << "token " << t << " has no expert here: its output must be zeros";
        continue;
      }
      ASSERT_LT(std::sqrt(e2 / r2), 2e-2) << "token " << t;
      err2 += e2;
      ref2 += r2;
    }
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-2);
    if (tile == 0 && fast) {
      // tune_moe recorded its choice; moe_experts found it.
      const MoeConfig picked = pick_moe_config(ctx, *prepared, c.T, c.k);
      EXPECT_TRUE(picked.tuned) << picked.why;
      EXPECT_TRUE(std::ifstream(cache).good()) << cache;
    }
  }
  std::remove(cache.c_str());
}

void PrintTo(const MoeCase& c, std::ostream* os) { *os << c.name; }

class MoeCudaTest : public testing::TestWithParam<MoeCase> {};

TEST_P(MoeCudaTest, MatchesDequantizedReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_case(GetParam());
}

constexpr auto F4 = WeightFormat::Nvfp4;
constexpr auto BF = WeightFormat::Dense;

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeCudaTest,
    testing::Values(MoeCase{"one_token", 256, 128, 8, 2, 1, Ids::Random, false, F4},
                    MoeCase{"off_grid", 256, 128, 16, 4, 37, Ids::Random, false, F4},
                    MoeCase{"empty_experts", 256, 128, 64, 2, 3, Ids::Random, false, F4},
                    MoeCase{"one_expert", 256, 128, 8, 1, 100, Ids::OneExpert, false, F4},
                    MoeCase{"topk_all", 256, 128, 8, 8, 20, Ids::Random, false, F4},
                    MoeCase{"spread", 384, 256, 16, 3, 70, Ids::AllExperts, false, F4},
                    MoeCase{"shared", 256, 128, 16, 4, 13, Ids::Random, true, F4},
                    MoeCase{"wide", 2048, 768, 8, 2, 5, Ids::Random, false, F4},
                    // Past one wgmma tile (128 to 256 tokens) per expert: full tiles plus partial ones.
                    MoeCase{"prefill", 256, 128, 8, 2, 300, Ids::Random, true, F4},
                    MoeCase{"one_expert_prefill", 384, 256, 8, 1, 300, Ids::OneExpert, false, F4},
                    // For the fused decode kernel: one token; a shared expert; more than 8 tokens on
                    // one expert (several items each); 512 rows, its limit; Qwen3-30B-A3B's I = 768
                    // (6 chunks of K, in halves); 65 tokens, one past its limit.
                    MoeCase{"fused_one_token", 512, 256, 16, 4, 1, Ids::Random, false, F4},
                    MoeCase{"fused_shared", 512, 256, 16, 4, 7, Ids::Random, true, F4},
                    MoeCase{"fused_one_expert", 512, 256, 8, 2, 40, Ids::OneExpert, true, F4},
                    MoeCase{"fused_max_rows", 256, 512, 64, 7, 64, Ids::Random, true, F4},
                    MoeCase{"fused_i768", 1024, 768, 32, 8, 3, Ids::Random, false, F4},
                    MoeCase{"fused_too_many", 256, 256, 16, 2, 65, Ids::Random, false, F4},
                    MoeCase{"bf16_off_grid", 256, 128, 16, 4, 37, Ids::Random, false, BF},
                    MoeCase{"bf16_shared_one", 256, 128, 8, 2, 1, Ids::Random, true, BF},
                    // Expert parallelism: this rank holds the upper half, a quarter (more slots
                    // than experts held, tokens with none of them: zeros), the general path's
                    // shapes, and BF16 experts.
                    MoeCase{"ep_upper_half", 256, 128, 16, 4, 37, Ids::Random, true, F4, 8, 8},
                    MoeCase{"ep_sparse", 512, 256, 16, 2, 5, Ids::Random, false, F4, 4, 4},
                    MoeCase{"ep_topk_over_held", 256, 128, 16, 8, 20, Ids::Random, false, F4, 12, 4},
                    MoeCase{"ep_prefill", 256, 128, 8, 2, 300, Ids::Random, true, F4, 2, 4},
                    MoeCase{"ep_general", 80, 48, 8, 3, 9, Ids::Random, true, F4, 4, 4},
                    MoeCase{"ep_bf16", 256, 128, 16, 4, 37, Ids::Random, false, BF, 0, 8}),
    [](const testing::TestParamInfo<MoeCase>& i) { return std::string(i.param.name); });

// ---- routing ----

struct RouteCase {
  const char* name;
  Scoring scoring;
  int E, k, T, n_group, topk_group;
  bool norm;
  float scaling;
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class MoeRouteTest : public testing::TestWithParam<RouteCase> {};

TEST_P(MoeRouteTest, MatchesFormatsSection22) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const RouteCase c = GetParam();
  std::mt19937 rng(99 + c.E);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(size_t(c.T * c.E)), bias(size_t(c.E));
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.1f * nd(rng);

  DevBuf dl(logits.size() * 4), db(bias.size() * 4), dids(size_t(c.T * c.k) * 4),
      dw(size_t(c.T * c.k) * 4);
  CK(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  RoutingSpec spec;
  spec.scoring = c.scoring;
  spec.top_k = c.k;
  spec.norm_topk_prob = c.norm;
  spec.routed_scaling_factor = c.scaling;
  spec.n_group = c.n_group;
  spec.topk_group = c.topk_group;
  if (c.scoring == Scoring::Sigmoid) spec.correction_bias = dev_view(db.p, DType::F32, {c.E});
  Context ctx;
  route(ctx, dev_view(dl.p, DType::F32, {c.T, c.E}), spec, dev_view(dids.p, DType::I32, {c.T, c.k}),
        dev_view(dw.p, DType::F32, {c.T, c.k}));
  CK(cudaDeviceSynchronize());
  std::vector<int> ids(size_t(c.T * c.k));
  std::vector<float> w(size_t(c.T * c.k));
  CK(cudaMemcpy(ids.data(), dids.p, ids.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost));

  for (int t = 0; t < c.T; ++t) {
    // Host reference, FORMATS.md §2.2, in double.
    const float* l = &logits[size_t(t * c.E)];
    std::vector<double> score(size_t(c.E)), sel(size_t(c.E));
    if (c.scoring == Scoring::Softmax) {
      double m = -INFINITY, sum = 0;
      for (int e = 0; e < c.E; ++e) m = std::max(m, double(l[e]));
      for (int e = 0; e < c.E; ++e) sum += std::exp(l[e] - m);
      for (int e = 0; e < c.E; ++e) score[size_t(e)] = sel[size_t(e)] = std::exp(l[e] - m) / sum;
    } else {
      for (int e = 0; e < c.E; ++e) {
        score[size_t(e)] = 1.0 / (1.0 + std::exp(-double(l[e])));
        sel[size_t(e)] = score[size_t(e)] + bias[size_t(e)];
      }
      if (c.n_group > 1) {
        const int per = c.E / c.n_group;
        std::vector<std::pair<double, int>> gs;
        for (int g = 0; g < c.n_group; ++g) {
          std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
          std::sort(v.rbegin(), v.rend());
          gs.push_back({v[0] + v[1], g});
        }
        std::sort(gs.begin(), gs.end(), [](auto a, auto b) { return a.first > b.first; });
        std::vector<bool> keep(size_t(c.n_group), false);
        for (int i = 0; i < c.topk_group; ++i) keep[size_t(gs[size_t(i)].second)] = true;
        for (int e = 0; e < c.E; ++e)
          if (!keep[size_t(e / per)]) sel[size_t(e)] = -INFINITY;  // transformers 5
      }
    }
    std::vector<int> order(size_t(c.E));
    for (int e = 0; e < c.E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return sel[size_t(a)] > sel[size_t(b)]; });
    double sum = 0;
    for (int j = 0; j < c.k; ++j) sum += score[size_t(order[size_t(j)])];
    for (int j = 0; j < c.k; ++j) {
      const int e = order[size_t(j)];
      double want = score[size_t(e)];
      if (c.norm) want = c.scoring == Scoring::Sigmoid ? want / (sum + 1e-20) : want / sum;
      want *= c.scaling;
      // The device returns the same experts; its order is by selection score too.
      ASSERT_EQ(ids[size_t(t * c.k + j)], e) << "token " << t << " choice " << j;
      // fp32 exp and sums against double: a few ulps.
      EXPECT_NEAR(w[size_t(t * c.k + j)], want, 1e-5 * std::max(1.0, std::abs(want)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routing, MoeRouteTest,
    testing::Values(RouteCase{"qwen3_softmax", Scoring::Softmax, 128, 8, 33, 1, 1, true, 1.0f},
                    RouteCase{"mixtral_softmax", Scoring::Softmax, 8, 2, 5, 1, 1, true, 1.0f},
                    RouteCase{"softmax_no_norm_topk_all", Scoring::Softmax, 8, 8, 3, 1, 1, false, 1.0f},
                    RouteCase{"glm5_sigmoid", Scoring::Sigmoid, 256, 8, 40, 1, 1, true, 2.5f},
                    RouteCase{"deepseek_groups", Scoring::Sigmoid, 256, 8, 40, 8, 4, true, 2.5f},
                    RouteCase{"sigmoid_no_norm", Scoring::Sigmoid, 64, 6, 7, 1, 1, false, 1.0f}),
    [](const testing::TestParamInfo<RouteCase>& i) { return std::string(i.param.name); });


// ---- against the CPU backend (ops/cpu), the engine's reference ----

// The same NVFP4 experts, router logits and BF16-representable activations through the CPU
// backend's route + moe_experts (F32) and through the CUDA ones. The CUDA side rounds h and the
// output to bf16, so the tolerance is the one of the dequantized-reference test.
TEST(MoeCudaVsCpu, RouteAndExpertsMatchTheCpuBackend) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t H = 256, I = 128;
  const int E = 32, k = 4, T = 29, n_group = 4, topk_group = 2;
  std::mt19937 rng(7);
  std::vector<HostExpert> experts(static_cast<size_t>(E));
  for (auto& e : experts) {
    make_linear(e.gate, F4, I, H, rng);
    make_linear(e.up, F4, I, H, rng);
    make_linear(e.down, F4, H, I, rng);
  }
  std::vector<MlpWeights> views;
  for (const auto& e : experts) views.push_back(e.view());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits(size_t(T * E)), bias(static_cast<size_t>(E)), x32(size_t(T * H));
  std::vector<uint16_t> x16(size_t(T * H));
  for (auto& v : logits) v = 2.0f * nd(rng);
  for (auto& v : bias) v = 0.1f * nd(rng);
  for (size_t i = 0; i < x16.size(); ++i) x16[i] = f32_to_bf16(nd(rng)), x32[i] = bf16_to_f32(x16[i]);

  RoutingSpec spec;
  spec.scoring = Scoring::Sigmoid;
  spec.top_k = k;
  spec.norm_topk_prob = true;
  spec.routed_scaling_factor = 2.5f;
  spec.n_group = n_group;
  spec.topk_group = topk_group;

  // CPU.
  auto cpu = make_cpu_backend(2);
  auto cpu_experts = cpu->prepare_experts(views, nullptr);
  std::vector<int> cpu_ids(size_t(T * k));
  std::vector<float> cpu_w(size_t(T * k)), cpu_out(size_t(T * H));
  RoutingSpec cpu_spec = spec;
  cpu_spec.correction_bias = TensorView{bias.data(), DType::F32, {E}, Device::Cpu};
  cpu->route(cpu->context(), TensorView{logits.data(), DType::F32, {T, E}, Device::Cpu}, cpu_spec,
             TensorView{cpu_ids.data(), DType::I32, {T, k}, Device::Cpu},
             TensorView{cpu_w.data(), DType::F32, {T, k}, Device::Cpu});
  cpu->moe_experts(cpu->context(), TensorView{x32.data(), DType::F32, {T, H}, Device::Cpu},
                   TensorView{cpu_ids.data(), DType::I32, {T, k}, Device::Cpu},
                   TensorView{cpu_w.data(), DType::F32, {T, k}, Device::Cpu}, *cpu_experts,
                   TensorView{cpu_out.data(), DType::F32, {T, H}, Device::Cpu});

  // CUDA.
  Context ctx;
  auto gpu_experts = prepare_experts(ctx, views);
  DevBuf dl(logits.size() * 4), db(bias.size() * 4), dx(x16.size() * 2), dids(cpu_ids.size() * 4),
      dw(cpu_w.size() * 4), dout(x16.size() * 2);
  const int64_t ws_bytes = moe_workspace_bytes(*gpu_experts, T, k);
  DevBuf ws{static_cast<size_t>(ws_bytes)};
  ctx.workspace = Workspace{ws.p, ws_bytes};
  CK(cudaMemcpy(dl.p, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db.p, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx.p, x16.data(), x16.size() * 2, cudaMemcpyHostToDevice));
  spec.correction_bias = dev_view(db.p, DType::F32, {E});
  route(ctx, dev_view(dl.p, DType::F32, {T, E}), spec, dev_view(dids.p, DType::I32, {T, k}),
        dev_view(dw.p, DType::F32, {T, k}));
  moe_experts(ctx, dev_view(dx.p, DType::BF16, {T, H}), dev_view(dids.p, DType::I32, {T, k}),
              dev_view(dw.p, DType::F32, {T, k}), *gpu_experts, dev_view(dout.p, DType::BF16, {T, H}),
              MoeConfig{8});
  CK(cudaDeviceSynchronize());
  std::vector<int> ids(cpu_ids.size());
  std::vector<float> w(cpu_w.size());
  std::vector<uint16_t> out(x16.size());
  CK(cudaMemcpy(ids.data(), dids.p, ids.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(w.data(), dw.p, w.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));

  // Both list a token's experts best first; group masking differs (CUDA 0.0 per FORMATS.md
  // §2.2, CPU -inf) only when a kept group has fewer than k positive scores, not here.
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i], cpu_ids[i]) << "routing slot " << i;
    EXPECT_NEAR(w[i], cpu_w[i], 1e-5f * std::max(1.0f, std::abs(cpu_w[i])));
  }
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = bf16_to_f32(out[i]) - cpu_out[i];
    e2 += d * d;
    r2 += double(cpu_out[i]) * cpu_out[i];
  }
  EXPECT_LT(std::sqrt(e2 / r2), 1e-2);
}

}  // namespace
}  // namespace tetra::ops::cuda

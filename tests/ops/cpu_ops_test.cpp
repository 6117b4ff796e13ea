// The CPU reference ops against naive double-precision loops written independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops {
namespace {

// A batch of sequences of `lens` tokens from position 0, their blocks of 4 tokens scattered
// over the cache as `tables` say (at most 2 blocks a sequence).
struct PagedBatch {
  AttentionBatch batch;
  std::vector<int32_t> slots, starts;
  int64_t n_tokens = 0, block = 4;
};

struct Fixture : ::testing::Test {
  std::unique_ptr<Backend> backend = make_cpu_backend(3);
  std::mt19937 rng{1234};
  std::vector<std::unique_ptr<Buffer>> keep;

  std::vector<float> randn(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  }
  TensorView f32(const std::vector<float>& host, Shape shape) {
    keep.push_back(backend->alloc(DType::F32, shape));
    backend->copy_from_host(keep.back()->view(), host.data());
    return keep.back()->view();
  }
  TensorView i32(const std::vector<int32_t>& host, Shape shape) {
    keep.push_back(backend->alloc(DType::I32, shape));
    if (!host.empty()) backend->copy_from_host(keep.back()->view(), host.data());
    return keep.back()->view();
  }
  TensorView out(Shape shape) {
    keep.push_back(backend->alloc(DType::F32, shape));
    return keep.back()->view();
  }
  template <typename T>
  TensorView raw(const std::vector<T>& host, DType dtype, Shape shape) {
    keep.push_back(backend->alloc(dtype, shape));
    backend->copy_from_host(keep.back()->view(), host.data());
    return keep.back()->view();
  }
  PagedBatch paged_batch(const std::vector<int64_t>& lens, const std::vector<std::vector<int32_t>>& tables);
  std::vector<float> host(TensorView t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    backend->copy_to_host(v.data(), t);
    return v;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(err / std::max(norm, 1e-30)), rel);
}

using CpuOps = Fixture;

PagedBatch Fixture::paged_batch(const std::vector<int64_t>& lens, const std::vector<std::vector<int32_t>>& tables) {
  PagedBatch pb;
  const int32_t block = int32_t(pb.block);
  std::vector<int32_t> positions, table_rows;
  pb.starts = {0};
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int64_t p = 0; p < lens[s]; ++p) {
      positions.push_back(int32_t(p));
      pb.slots.push_back(tables[s][size_t(p / block)] * block + int32_t(p % block));
    }
    pb.starts.push_back(int32_t(positions.size()));
    for (int b = 0; b < 2; ++b) table_rows.push_back(b < int(tables[s].size()) ? tables[s][size_t(b)] : 0);
  }
  pb.n_tokens = int64_t(positions.size());
  const int n_seqs = int(lens.size());
  pb.batch = AttentionBatch{.n_tokens = int(pb.n_tokens), .n_seqs = n_seqs, .block_size = block, .max_blocks_per_seq = 2};
  pb.batch.positions = i32(positions, {pb.n_tokens});
  pb.batch.slot_mapping = i32(pb.slots, {pb.n_tokens});
  pb.batch.seq_starts = i32(pb.starts, {n_seqs + 1});
  pb.batch.block_tables = i32(table_rows, {n_seqs, 2});
  return pb;
}

TEST_F(CpuOps, LinearBf16WithBiasOffTileSizes) {
  const int64_t t = 5, n_in = 37, n_out = 11;
  auto x = randn(t * n_in), w = randn(n_out * n_in), bias = randn(n_out);
  std::vector<uint16_t> w_bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w_bf16[i] = f32_to_bf16(w[i]);
  LinearWeight lw{.n_out = n_out, .n_in = n_in};
  lw.weight = raw(w_bf16, DType::BF16, {n_out, n_in});
  lw.bias = f32(bias, {n_out});
  auto y = out({t, n_out});
  backend->linear(backend->context(), f32(x, {t, n_in}), lw, y);
  std::vector<double> want(static_cast<size_t>(t * n_out));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t o = 0; o < n_out; ++o) {
      double s = bias[size_t(o)];
      for (int64_t k = 0; k < n_in; ++k)
        s += double(x[size_t(i * n_in + k)]) * bf16_to_f32(w_bf16[size_t(o * n_in + k)]);
      want[size_t(i * n_out + o)] = s;
    }
  expect_close(host(y), want, 1e-6);
}

TEST_F(CpuOps, LinearNvfp4MatchesDequantizedWeights) {
  const int64_t t = 3, n_in = 48, n_out = 7;
  std::uniform_int_distribution<int> byte(0, 255), scale_code(0x20, 0x50);
  std::vector<uint8_t> codes(static_cast<size_t>(n_out * n_in / 2)), scales(static_cast<size_t>(n_out * n_in / 16));
  for (auto& c : codes) c = uint8_t(byte(rng));
  for (auto& s : scales) s = uint8_t(scale_code(rng));
  const float global = 0.0123f;
  LinearWeight lw{.format = WeightFormat::Nvfp4, .n_out = n_out, .n_in = n_in};
  lw.weight = raw(codes, DType::U8, {n_out, n_in / 2});
  lw.block_scale = raw(scales, DType::F8_E4M3, {n_out, n_in / 16});
  lw.global_scale = global;
  auto x = randn(t * n_in);
  auto y = out({t, n_out});
  backend->linear(backend->context(), f32(x, {t, n_in}), lw, y);
  std::vector<double> want(static_cast<size_t>(t * n_out));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t o = 0; o < n_out; ++o) {
      double s = 0;
      for (int64_t k = 0; k < n_in; ++k) {
        const uint8_t b = codes[size_t(o * n_in / 2 + k / 2)];
        const uint8_t nib = (k % 2 == 0) ? (b & 0xf) : (b >> 4);  // low nibble = even index
        const double w = double(e2m1_to_f32(nib)) * e4m3_to_f32(scales[size_t(o * n_in / 16 + k / 16)]) * global;
        s += double(x[size_t(i * n_in + k)]) * w;
      }
      want[size_t(i * n_out + o)] = s;
    }
  expect_close(host(y), want, 1e-6);
}

TEST_F(CpuOps, LinearFp8PerTensor) {
  const int64_t n_in = 20, n_out = 3;
  std::vector<uint8_t> codes(static_cast<size_t>(n_in * n_out));
  for (auto& c : codes) c = uint8_t(std::uniform_int_distribution<int>(0, 0x7e)(rng)) | (rng() & 0x80);
  LinearWeight lw{.format = WeightFormat::Fp8, .n_out = n_out, .n_in = n_in};
  lw.weight = raw(codes, DType::F8_E4M3, {n_out, n_in});
  lw.global_scale = 0.5f;
  auto x = randn(n_in);
  auto y = out({1, n_out});
  backend->linear(backend->context(), f32(x, {1, n_in}), lw, y);
  std::vector<double> want(static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t k = 0; k < n_in; ++k)
      want[size_t(o)] += double(x[size_t(k)]) * e4m3_to_f32(codes[size_t(o * n_in + k)]) * 0.5;
  expect_close(host(y), want, 1e-6);
}

TEST_F(CpuOps, RopeHalfSplitAndInterleaved) {
  const int64_t t = 3, heads = 2, hd = 10;
  const int rot = 6;
  std::vector<float> inv = {1.0f, 0.1f, 0.01f};
  std::vector<int32_t> pos = {0, 5, 17};
  for (bool interleaved : {false, true}) {
    auto x = randn(t * heads * hd);
    TensorView xv = f32(x, {t, heads, hd});
    RopeSpec spec{.inv_freq = f32(inv, {3}), .attention_scaling = 1.5f, .rotary_dim = rot,
                  .interleaved = interleaved};
    backend->rope(backend->context(), xv, i32(pos, {t}), spec);
    std::vector<double> want(x.begin(), x.end());
    for (int64_t i = 0; i < t; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int f = 0; f < rot / 2; ++f) {
          const double a = double(pos[size_t(i)]) * inv[size_t(f)];
          const double c = std::cos(a) * 1.5, s = std::sin(a) * 1.5;
          const size_t base = size_t((i * heads + h) * hd);
          const size_t p1 = base + size_t(interleaved ? 2 * f : f);
          const size_t p2 = base + size_t(interleaved ? 2 * f + 1 : f + rot / 2);
          want[p1] = x[p1] * c - x[p2] * s;
          want[p2] = x[p2] * c + x[p1] * s;
        }
    expect_close(host(xv), want, 1e-6);
  }
}

// Causal GQA attention of each sequence [starts[s], starts[s + 1]) over its own tokens, in
// double: q [T, heads, d], k and v [T, kv_heads, d].
std::vector<double> causal_attention(const std::vector<float>& q, const std::vector<float>& k,
                                     const std::vector<float>& v, const std::vector<int32_t>& starts,
                                     int64_t heads, int64_t kv_heads, int64_t d, double scale) {
  std::vector<double> want(static_cast<size_t>(int64_t(starts.back()) * heads * d));
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    for (int64_t i = starts[s]; i < starts[s + 1]; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t kvh = h / (heads / kv_heads);
        std::vector<double> sc;
        for (int64_t j = starts[s]; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += double(q[size_t((i * heads + h) * d + e)]) * k[size_t((j * kv_heads + kvh) * d + e)];
          sc.push_back(dot * scale);
        }
        const double m = *std::max_element(sc.begin(), sc.end());
        double z = 0;
        for (auto& x : sc) z += (x = std::exp(x - m));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (size_t j = 0; j < sc.size(); ++j)
            acc += sc[j] / z * v[size_t(((starts[s] + int64_t(j)) * kv_heads + kvh) * d + e)];
          want[size_t((i * heads + h) * d + e)] = acc;
        }
      }
  return want;
}

// Two sequences of different lengths in one batch, their blocks scattered over the cache.
TEST_F(CpuOps, PagedAttentionMatchesContiguousGqa) {
  const int64_t heads = 4, kv_heads = 2, d = 8, n_blocks = 8;
  const PagedBatch pb = paged_batch({6, 3}, {{5, 2}, {7}});
  const AttentionBatch& batch = pb.batch;
  const int64_t t = pb.n_tokens, block = pb.block;
  auto q = randn(t * heads * d), k = randn(t * kv_heads * d), v = randn(t * kv_heads * d);
  KvCacheLayer cache{out({n_blocks, block, kv_heads, d}), out({n_blocks, block, kv_heads, d})};
  auto& ctx = backend->context();
  backend->kv_write(ctx, f32(k, {t, kv_heads, d}), f32(v, {t, kv_heads, d}), batch, cache);
  auto o = out({t, heads, d});
  const float scale = 0.3f;
  backend->attention(ctx, f32(q, {t, heads, d}), cache, batch, scale, o);
  const std::vector<double> want = causal_attention(q, k, v, pb.starts, heads, kv_heads, d, scale);
  expect_close(host(o), want, 1e-6);
}

// --kv-cache-dtype fp8_e4m3: kv_write stores e4m3(x / scale) bytes (round-to-nearest-even,
// saturating at 448) and attention reads f32(e4m3) * scale. The reference is a double loop over
// the dequantized values, so the check measures the cache's read and write, not FP8's error.
TEST_F(CpuOps, PagedAttentionOverAnFp8CacheMatchesItsDequantizedValues) {
  auto fp8_backend = make_cpu_backend(3, DType::F8_E4M3);
  ASSERT_EQ(fp8_backend->kv_dtype(), DType::F8_E4M3);
  const int64_t heads = 4, kv_heads = 2, d = 8, n_blocks = 8;
  const PagedBatch pb = paged_batch({7, 2}, {{3, 6}, {1}});
  const AttentionBatch& batch = pb.batch;
  const int64_t t = pb.n_tokens, block = pb.block;
  const std::vector<int32_t>& slots = pb.slots;
  // Keys of scale 0.25 and values of scale 3: some |k / k_scale| pass 448 and saturate.
  const float k_scale = 0.25f, v_scale = 3.0f;
  auto q = randn(t * heads * d, 0.05f), k = randn(t * kv_heads * d, 40.0f), v = randn(t * kv_heads * d, 2.0f);
  k[0] = 500.0f;   // 2000 / 448: saturates to +448 * k_scale
  k[1] = -130.0f;  // -520: saturates to -448 * k_scale
  v[0] = 3.0f * 1.0625f;  // a tie between 1 and 1.125: rounds to even, 1.0
  v[1] = 3.0f * 1.1875f;  // a tie between 1.125 and 1.25: rounds to even, 1.25
  const Shape cache_shape{n_blocks, block, kv_heads, d};
  std::vector<uint8_t> zeros(static_cast<size_t>(n_blocks * block * kv_heads * d), 0);
  KvCacheLayer cache{raw(zeros, DType::F8_E4M3, cache_shape), raw(zeros, DType::F8_E4M3, cache_shape), {},
                     k_scale, v_scale};
  auto& ctx = fp8_backend->context();
  fp8_backend->kv_write(ctx, f32(k, {t, kv_heads, d}), f32(v, {t, kv_heads, d}), batch, cache);

  // The bytes: exactly e4m3(x / scale) at each token's slot.
  std::vector<float> kd(k.size()), vd(v.size());  // what the cache holds, dequantized
  for (int64_t i = 0; i < t; ++i)
    for (int64_t e = 0; e < kv_heads * d; ++e) {
      const size_t x = size_t(i * kv_heads * d + e), at = size_t(slots[size_t(i)] * kv_heads * d + e);
      const uint8_t kb = cache.k.as<const uint8_t>()[at], vb = cache.v.as<const uint8_t>()[at];
      ASSERT_EQ(kb, f32_to_e4m3(k[x] / k_scale)) << x;
      ASSERT_EQ(vb, f32_to_e4m3(v[x] / v_scale)) << x;
      kd[x] = e4m3_to_f32(kb) * k_scale;
      vd[x] = e4m3_to_f32(vb) * v_scale;
    }
  EXPECT_EQ(kd[0], 448.0f * k_scale);
  EXPECT_EQ(kd[1], -448.0f * k_scale);
  EXPECT_EQ(vd[0], 1.0f * v_scale);
  EXPECT_EQ(vd[1], 1.25f * v_scale);

  auto o = out({t, heads, d});
  const float scale = 0.3f;
  fp8_backend->attention(ctx, f32(q, {t, heads, d}), cache, batch, scale, o);
  const std::vector<double> want = causal_attention(q, kd, vd, pb.starts, heads, kv_heads, d, scale);
  // F32 accumulation over 8-wide dots of dequantized values: the same 1e-6 as the F32 cache.
  expect_close(host(o), want, 1e-6);
}

TEST_F(CpuOps, KvCacheDtypeFlagValues) {
  EXPECT_FALSE(parse_auto_or_fp8("auto", "--kv-cache-dtype").has_value());
  EXPECT_EQ(parse_auto_or_fp8("fp8_e4m3", "--kv-cache-dtype"), DType::F8_E4M3);
  EXPECT_EQ(parse_auto_or_fp8("fp8", "--kv-cache-dtype"), DType::F8_E4M3);
  try {
    parse_auto_or_fp8("fp4", "--kv-cache-dtype");
    FAIL() << "fp4 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype must be auto or fp8_e4m3"), std::string::npos) << e.what();
  }
}

TEST_F(CpuOps, SoftmaxRoutingWithAndWithoutRenorm) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.5f};
  for (bool norm : {false, true}) {
    RoutingSpec spec{.scoring = Scoring::Softmax, .top_k = 2, .norm_topk_prob = norm};
    auto ids = i32({}, {1, 2});
    auto w = out({1, 2});
    backend->route(backend->context(), f32(logits, {1, 4}), spec, ids, w);
    const int32_t* id = ids.as<int32_t>();
    EXPECT_EQ(id[0], 1);
    EXPECT_EQ(id[1], 3);
    double z = 0;
    for (float l : logits) z += std::exp(double(l));
    const double p1 = std::exp(2.0) / z, p3 = std::exp(1.5) / z;
    EXPECT_NEAR(w.as<float>()[0], norm ? p1 / (p1 + p3) : p1, 1e-6);
    EXPECT_NEAR(w.as<float>()[1], norm ? p3 / (p1 + p3) : p3, 1e-6);
  }
}

// Bias steers selection only; groups keep the best topk_group by the sum of their top two.
TEST_F(CpuOps, SigmoidGroupedRouting) {
  // 8 experts, 4 groups of 2. Group scores (biased): g0 .6+.5, g1 .9+.1, g2 .8+.7, g3 .2+.2.
  std::vector<float> sig = {0.6f, 0.5f, 0.9f, 0.1f, 0.8f, 0.7f, 0.2f, 0.2f};
  std::vector<float> logits, bias(8, 0.0f);
  for (float s : sig) logits.push_back(std::log(s / (1 - s)));
  bias[1] = 0.3f;  // expert 1: biased 0.8, unbiased 0.5
  RoutingSpec spec{.scoring = Scoring::Sigmoid, .top_k = 3, .norm_topk_prob = true,
                   .routed_scaling_factor = 2.5f, .n_group = 4, .topk_group = 2};
  spec.correction_bias = f32(bias, {8});
  auto ids = i32({}, {1, 3});
  auto w = out({1, 3});
  backend->route(backend->context(), f32(logits, {1, 8}), spec, ids, w);
  // Groups kept: g2 (1.5) and g0 (1.4 with bias); g1 (1.0) is masked although it holds 0.9.
  std::vector<int32_t> got(ids.as<int32_t>(), ids.as<int32_t>() + 3);
  std::vector<int32_t> sorted = got;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{1, 4, 5}));
  const double sum = 0.5 + 0.8 + 0.7;
  for (int j = 0; j < 3; ++j) {
    const double s = got[size_t(j)] == 1 ? 0.5 : got[size_t(j)] == 4 ? 0.8 : 0.7;
    EXPECT_NEAR(w.as<float>()[j], s / sum * 2.5, 1e-5);
  }
}

struct MoeCase {
  int64_t tokens, experts, top_k;
  bool one_expert;  // route every token to expert 0 first
};

class CpuMoe : public Fixture, public ::testing::WithParamInterface<MoeCase> {};

TEST_P(CpuMoe, MatchesNaiveSum) {
  const auto p = GetParam();
  const int64_t hidden = 16, inter = 24;
  std::vector<MlpWeights> experts;
  std::vector<std::vector<float>> wg, wu, wd;
  for (int64_t e = 0; e < p.experts; ++e) {
    wg.push_back(randn(inter * hidden, 0.3f));
    wu.push_back(randn(inter * hidden, 0.3f));
    wd.push_back(randn(hidden * inter, 0.3f));
    MlpWeights m;
    m.gate = {.n_out = inter, .n_in = hidden, .weight = f32(wg.back(), {inter, hidden})};
    m.up = {.n_out = inter, .n_in = hidden, .weight = f32(wu.back(), {inter, hidden})};
    m.down = {.n_out = hidden, .n_in = inter, .weight = f32(wd.back(), {hidden, inter})};
    experts.push_back(m);
  }
  auto prepared = backend->prepare_experts(experts, nullptr);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int64_t t = 0; t < p.tokens; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(p.experts));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (p.one_expert) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), 0));
    for (int64_t j = 0; j < p.top_k; ++j) {
      ids.push_back(all[size_t(j)]);
      weights.push_back(std::uniform_real_distribution<float>(0.1f, 1.0f)(rng));
    }
  }
  auto x = randn(p.tokens * hidden);
  auto y = out({p.tokens, hidden});
  backend->moe_experts(backend->context(), f32(x, {p.tokens, hidden}), i32(ids, {p.tokens, p.top_k}),
                       f32(weights, {p.tokens, p.top_k}), *prepared, y);
  std::vector<double> want(size_t(p.tokens * hidden), 0.0);
  for (int64_t t = 0; t < p.tokens; ++t)
    for (int64_t j = 0; j < p.top_k; ++j) {
      const size_t e = size_t(ids[size_t(t * p.top_k + j)]);
      std::vector<double> act(static_cast<size_t>(inter));
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          g += double(wg[e][size_t(i * hidden + h)]) * x[size_t(t * hidden + h)];
          u += double(wu[e][size_t(i * hidden + h)]) * x[size_t(t * hidden + h)];
        }
        act[size_t(i)] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < hidden; ++h) {
        double s = 0;
        for (int64_t i = 0; i < inter; ++i) s += double(wd[e][size_t(h * inter + i)]) * act[size_t(i)];
        want[size_t(t * hidden + h)] += s * weights[size_t(t * p.top_k + j)];
      }
    }
  expect_close(host(y), want, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuMoe,
                         ::testing::Values(MoeCase{1, 8, 2, false},    // one token: most experts idle
                                           MoeCase{13, 8, 3, false},   // off any tile grid
                                           MoeCase{9, 6, 2, true},     // expert 0 takes every token
                                           MoeCase{5, 4, 4, false}));  // top-k = all experts

}  // namespace
}  // namespace tetra::ops

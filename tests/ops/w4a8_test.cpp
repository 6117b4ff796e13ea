// W4A8 expert linears on the CPU (ops/cpu/w4a8.cpp): the activations' E4M3 groups, the folded
// weights against a double-precision fold written here without frexp, exactness where both
// operands already lie on the E4M3 grid, and the experts' flag.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/nvfp4.h"
#include "ops/cpu/cpu_backend.h"

namespace tetra::ops::cpu {
namespace {

// An NVFP4 weight quantized from `w` [n_out, n_in] the way ModelOpt does, with its storage.
struct Nvfp4Weight {
  std::vector<uint8_t> packed, scales;
  LinearWeight w;
  Nvfp4Weight(const std::vector<float>& values, int64_t n_out, int64_t n_in) {
    packed.resize(size_t(n_out * n_in / 2));
    scales.resize(size_t(n_out * n_in / 16));
    float amax = 0;
    for (float v : values) amax = std::max(amax, std::abs(v));
    const float g = nvfp4::global_scale_from_amax(amax);
    for (int64_t r = 0; r < n_out; ++r)
      nvfp4::quantize_row(values.data() + r * n_in, n_in, g, packed.data() + r * n_in / 2,
                          scales.data() + r * n_in / 16);
    w.format = WeightFormat::Nvfp4;
    w.n_out = n_out;
    w.n_in = n_in;
    w.weight = TensorView{packed.data(), DType::U8, {n_out, n_in / 2}, Device::Cpu};
    w.block_scale = TensorView{scales.data(), DType::F8_E4M3, {n_out, n_in / 16}, Device::Cpu};
    w.global_scale = g;
  }
};

std::vector<float> randn(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

double e4m3(double x) { return e4m3_to_f32(f32_to_e4m3(float(x))); }

// sum |x_k w_k| of token t against row r: what a sum's rounding error is measured against.
double magnitude(const std::vector<float>& x, int64_t t, const LinearWeight& w, int64_t r) {
  std::vector<float> row(static_cast<size_t>(w.n_in));
  decode_weight_row(w, r, row.data());
  double mag = 0;
  for (int64_t k = 0; k < w.n_in; ++k) mag += std::abs(double(x[size_t(t * w.n_in + k)]) * row[size_t(k)]);
  return mag;
}

TEST(W4a8, ActivationsTakeOneScalePerTokenPer128Channels) {
  std::mt19937 rng(7);
  const int64_t T = 3, n_in = 200;  // groups of 128 and 72
  std::vector<float> x = randn(rng, T * n_in, 2.0f);
  for (int64_t k = 128; k < n_in; ++k) x[size_t(1 * n_in + k)] = 0;  // token 1's second group: zeros
  x[size_t(2 * n_in + 5)] = 1e4f;                                      // an outlier in token 2's first group
  const Fp8Activations a = quantize_activations_fp8(x.data(), T, n_in);
  ASSERT_EQ(a.groups, 2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < 2; ++g) {
      const int64_t k0 = g * 128, k1 = std::min<int64_t>(n_in, k0 + 128);
      double amax = 0;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, double(std::abs(x[size_t(t * n_in + k)])));
      const float s = a.scales[size_t(t * 2 + g)];
      EXPECT_EQ(s, amax > 0 ? float(amax) / 448.0f : 1.0f) << "token " << t << " group " << g;
      for (int64_t k = k0; k < k1; ++k) {
        const float q = a.values[size_t(t * n_in + k)], v = x[size_t(t * n_in + k)];
        EXPECT_EQ(q, e4m3(v / s)) << "token " << t << " channel " << k;  // on the grid, rounded once
        // E4M3's half step: 2^-4 of the value, or 2^-10 of the scale below the normal range.
        EXPECT_LE(std::abs(double(q) * s - v), std::abs(v) * 0x1p-4 + double(s) * 0x1p-10)
            << "token " << t << " channel " << k;
      }
    }
  EXPECT_EQ(a.values[size_t(2 * n_in + 5)], 448.0f);  // the group's amax lands on the top of the grid
}

// The fold by its definition, in doubles: the exponent found by doubling, not by frexp.
std::vector<double> reference_w4a8(const std::vector<float>& x, int64_t T, const LinearWeight& w) {
  const int64_t n_in = w.n_in, n_out = w.n_out, blocks = n_in / 16;
  const Fp8Activations a = quantize_activations_fp8(x.data(), T, n_in);  // checked above
  std::vector<double> out(size_t(T * n_out));
  for (int64_t r = 0; r < n_out; ++r) {
    const uint8_t* scales = w.block_scale.as<const uint8_t>() + r * blocks;
    double largest = 0;
    for (int64_t b = 0; b < blocks; ++b) largest = std::max(largest, double(e4m3_to_f32(scales[b])));
    int e = 0;
    while (largest > 0 && 6 * largest * std::pow(2.0, -e) >= 448) ++e;
    while (largest > 0 && 6 * largest * std::pow(2.0, -e) < 224) --e;
    std::vector<double> folded(static_cast<size_t>(n_in));
    for (int64_t k = 0; k < n_in; ++k) {
      const uint8_t byte = w.weight.as<const uint8_t>()[r * n_in / 2 + k / 2];
      const double code = e2m1_to_f32(k % 2 ? byte >> 4 : byte & 0xf);
      folded[size_t(k)] = e4m3(code * e4m3_to_f32(scales[k / 16]) * std::pow(2.0, -e));
    }
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t k = 0; k < n_in; ++k)
        acc += double(a.values[size_t(t * n_in + k)]) * a.scales[size_t(t * a.groups + k / 128)] * folded[size_t(k)];
      out[size_t(t * n_out + r)] = acc * std::pow(2.0, e) * w.global_scale;
    }
  }
  return out;
}

TEST(W4a8, LinearMatchesTheFoldByItsDefinition) {
  std::mt19937 rng(11);
  ThreadPool pool(2);
  const int64_t T = 4, n_out = 9, n_in = 272;  // 17 blocks; activation groups of 128, 128 and 16
  std::vector<float> wv = randn(rng, n_out * n_in, 0.05f);
  for (int64_t k = 0; k < n_in; ++k) wv[size_t(3 * n_in + k)] *= 1e-3f;  // a row far below the tensor's amax
  for (int64_t k = 0; k < n_in; ++k) wv[size_t(5 * n_in + k)] = 0;        // an all-zero row
  const Nvfp4Weight w(wv, n_out, n_in);
  const std::vector<float> x = randn(rng, T * n_in, 1.0f);
  std::vector<float> got(size_t(T * n_out));
  linear_w4a8(&pool, x.data(), T, w.w, got.data());
  const std::vector<double> want = reference_w4a8(x, T, w.w);
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t t = int64_t(i) / n_out, r = int64_t(i) % n_out;
    // f32 sums of 128 exact products against double ones.
    EXPECT_NEAR(got[i], want[i], 1e-5 * magnitude(x, t, w.w, r)) << "token " << t << " row " << r;
  }
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(got[size_t(t * n_out + 5)], 0.0f);
}

// Activations already E4M3 values times a power of two, block scales powers of two: nothing
// rounds, so W4A8 gives W4A16's sums (to f32 summation order). A scale applied twice, or an
// exponent with the wrong sign, is off by powers of two here.
TEST(W4a8, EqualsW4a16WhereBothOperandsLieOnTheE4m3Grid) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  const int64_t T = 3, n_out = 6, n_in = 256;
  std::vector<uint8_t> packed(size_t(n_out * n_in / 2)), scales(size_t(n_out * n_in / 16));
  std::uniform_int_distribution<int> byte(0, 255), pow2(-6, 6);
  for (auto& b : packed) b = uint8_t(byte(rng));
  for (auto& s : scales) s = f32_to_e4m3(std::ldexp(1.0f, pow2(rng)));
  LinearWeight w;
  w.format = WeightFormat::Nvfp4;
  w.n_out = n_out;
  w.n_in = n_in;
  w.weight = TensorView{packed.data(), DType::U8, {n_out, n_in / 2}, Device::Cpu};
  w.block_scale = TensorView{scales.data(), DType::F8_E4M3, {n_out, n_in / 16}, Device::Cpu};
  w.global_scale = 0.37f;
  std::vector<float> x(size_t(T * n_in));
  std::uniform_int_distribution<int> code(0, 0x7e);  // finite E4M3 codes, both signs below
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < n_in; ++k) {
      const float v = e4m3_to_f32(uint8_t(code(rng) | (byte(rng) & 0x80)));
      x[size_t(t * n_in + k)] = std::ldexp(v, -3 - int(t));
    }
  for (int64_t t = 0; t < T; ++t)  // each group's amax at 448: its scale is exactly 2^-3-t
    for (int64_t g = 0; g < 2; ++g) x[size_t(t * n_in + g * 128)] = std::ldexp(448.0f, -3 - int(t));
  std::vector<float> w4a8(size_t(T * n_out)), w4a16(size_t(T * n_out));
  linear_w4a8(&pool, x.data(), T, w, w4a8.data());
  linear_f32(&pool, x.data(), T, w, w4a16.data());
  for (size_t i = 0; i < w4a8.size(); ++i) {
    const int64_t t = int64_t(i) / n_out, r = int64_t(i) % n_out;
    EXPECT_NEAR(w4a8[i], w4a16[i], 1e-5 * magnitude(x, t, w, r)) << "token " << t << " row " << r;
  }
}

TEST(W4a8, ExpertsWithoutNvfp4WeightsRefuseTheFlag) {
  std::vector<uint16_t> bf16(16 * 16, 0);
  LinearWeight dense;
  dense.n_out = dense.n_in = 16;
  dense.weight = TensorView{bf16.data(), DType::BF16, {16, 16}, Device::Cpu};
  std::vector<MlpWeights> experts(2, MlpWeights{dense, dense, dense});
  EXPECT_NO_THROW(CpuExperts(experts, std::nullopt, false));
  try {
    CpuExperts e(experts, std::nullopt, true);
    FAIL() << "BF16 experts took --moe-activation-dtype fp8_e4m3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-activation-dtype fp8_e4m3 (W4A8) takes NVFP4 experts"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tetra::ops::cpu

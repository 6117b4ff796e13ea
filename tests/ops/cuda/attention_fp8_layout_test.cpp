// The FP8 decode tile's fragment layout (ops/cuda/attention_fp8_layout.h), checked on the CPU:
// a warp's loads and m16n8k16 MMAs are replayed lane by lane, exactly as attention_gqa.cu
// issues them, and must give Q K^T and P V; the loads must hit distinct shared-memory banks.
// The GPU tests check the kernel's numbers; this checks the index algebra they rest on.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "ops/cuda/attention_fp8_layout.h"

namespace tetra::ops::cuda::fp8_tile {
namespace {

constexpr int kTileKeys = 64;  // a decode tile: 4 warps of 16 keys (D = 256: 2 warps, 32 keys)
constexpr int kWarpKeys = 16;

struct Matrix {
  int rows, cols;
  std::vector<float> v;
  Matrix(int r, int c) : rows(r), cols(c), v(size_t(r) * c, 0.0f) {}
  float& at(int r, int c) { return v[size_t(r) * cols + c]; }
  float at(int r, int c) const { return v[size_t(r) * cols + c]; }
};

// Small integers: every product and sum is exact in float.
Matrix random_matrix(int rows, int cols, std::mt19937& rng) {
  std::uniform_int_distribution<int> value(-4, 4);
  Matrix m(rows, cols);
  for (float& x : m.v) x = float(value(rng));
  return m;
}

// A stage as the copy writes it: 16-value chunk c of row r at offset(d, r, 16 c), contiguous.
template <class Offset>
std::vector<float> stage_of(const Matrix& rows, int d, Offset offset) {
  std::vector<float> stage(size_t(rows.rows) * d, -1000.0f);
  for (int r = 0; r < rows.rows; ++r)
    for (int c = 0; c < d / 16; ++c)
      for (int b = 0; b < 16; ++b) stage[size_t(offset(d, r, 16 * c)) + b] = rows.at(r, 16 * c + b);
  return stage;
}

// One m16n8k16 MMA from per-lane fragments: a[lane][4 regs][2 halves], b[lane][2 regs][2].
// Lane (g, t) = (lane / 4, lane % 4): A regs (row g, k 2t..), (g + 8, 2t..), (g, 2t + 8..),
// (g + 8, 2t + 8..); B regs (k 2t.., col g), (k 2t + 8.., col g); C (rows g, g + 8; cols 2t, 2t + 1).
void mma(float (&c)[32][4], const float (&a)[32][4][2], const float (&b)[32][2][2]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 2; ++e) {
      A[g][2 * t + e] = a[lane][0][e];
      A[g + 8][2 * t + e] = a[lane][1][e];
      A[g][2 * t + 8 + e] = a[lane][2][e];
      A[g + 8][2 * t + 8 + e] = a[lane][3][e];
      B[2 * t + e][g] = b[lane][0][e];
      B[2 * t + 8 + e][g] = b[lane][1][e];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      for (int k = 0; k < 16; ++k) c[lane][i] += A[row][k] * B[k][col];
    }
  }
}

class Fp8TileLayout : public testing::TestWithParam<int> {};

TEST_P(Fp8TileLayout, QColumnsInvertTheKeyFragments) {
  const int d = GetParam();
  std::set<int> columns;
  for (int dim = 0; dim < d; ++dim) {
    ASSERT_GE(q_column(dim), 0);
    ASSERT_LT(q_column(dim), d);
    columns.insert(q_column(dim));
  }
  EXPECT_EQ(int(columns.size()), d) << "q_column is not a permutation";
  for (int kk = 0; kk < d / 16; ++kk)
    for (int t = 0; t < 4; ++t)
      for (int half = 0; half < 2; ++half)
        for (int e = 0; e < 2; ++e)
          ASSERT_EQ(q_column(k_dim(kk, t, half) + e), 16 * kk + 8 * half + 2 * t + e) << kk << " " << t;
}

// warp_scores_fp8: Q from its permuted shared-memory rows by ldmatrix, K's 16-byte loads.
TEST_P(Fp8TileLayout, ScoresEqualQTimesKTransposed) {
  const int d = GetParam();
  std::mt19937 rng(d);
  const Matrix q = random_matrix(16, d, rng), k = random_matrix(kTileKeys, d, rng);
  Matrix q_smem(16, d);
  for (int r = 0; r < 16; ++r)
    for (int dim = 0; dim < d; ++dim) q_smem.at(r, q_column(dim)) = q.at(r, dim);
  const std::vector<float> stage = stage_of(k, d, k_offset);
  for (int warp_key0 = 0; warp_key0 < kTileKeys; warp_key0 += kWarpKeys) {
    float s[kWarpKeys / 8][32][4] = {};
    for (int h = 0; h < d / 64; ++h) {
      float loaded[kWarpKeys / 8][32][16];
      for (int n = 0; n < kWarpKeys / 8; ++n)
        for (int lane = 0; lane < 32; ++lane) {
          const int row = warp_key0 + 8 * n + lane / 4, byte = 64 * h + 16 * (lane % 4);
          for (int b = 0; b < 16; ++b) loaded[n][lane][b] = stage[size_t(k_offset(d, row, byte)) + b];
        }
      for (int j = 0; j < 4; ++j) {
        const int kk = 4 * h + j;
        float a[32][4][2];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4;
          for (int e = 0; e < 2; ++e) {
            a[lane][0][e] = q_smem.at(g, 16 * kk + 2 * t + e);
            a[lane][1][e] = q_smem.at(g + 8, 16 * kk + 2 * t + e);
            a[lane][2][e] = q_smem.at(g, 16 * kk + 2 * t + 8 + e);
            a[lane][3][e] = q_smem.at(g + 8, 16 * kk + 2 * t + 8 + e);
          }
        }
        for (int n = 0; n < kWarpKeys / 8; ++n) {
          float b[32][2][2];
          for (int lane = 0; lane < 32; ++lane)
            for (int half = 0; half < 2; ++half)
              for (int e = 0; e < 2; ++e) b[lane][half][e] = loaded[n][lane][4 * j + 2 * half + e];
          mma(s[n], a, b);
        }
      }
    }
    for (int n = 0; n < kWarpKeys / 8; ++n)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int row = lane / 4 + 8 * (i / 2), key = warp_key0 + 8 * n + 2 * (lane % 4) + i % 2;
          float want = 0.0f;
          for (int dim = 0; dim < d; ++dim) want += q.at(row, dim) * k.at(key, dim);
          ASSERT_EQ(s[n][lane][i], want) << "row " << row << " key " << key;
        }
  }
}

// accumulate_pv_fp8: P from the score accumulators, V's 4-byte loads of four key rows.
TEST_P(Fp8TileLayout, OutputEqualsPTimesV) {
  const int d = GetParam();
  std::mt19937 rng(d + 1);
  const Matrix p = random_matrix(16, kTileKeys, rng), v = random_matrix(kTileKeys, d, rng);
  const std::vector<float> stage = stage_of(v, d, v_offset);
  for (int warp_key0 = 0; warp_key0 < kTileKeys; warp_key0 += kWarpKeys) {
    std::vector<float> acc(size_t(d / 8) * 32 * 4, 0.0f);
    for (int kk = 0; kk < kWarpKeys / 16; ++kk) {
      const int kr0 = warp_key0 + 16 * kk;
      float a[32][4][2];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int e = 0; e < 2; ++e) {
          a[lane][0][e] = p.at(g, kr0 + 2 * t + e);
          a[lane][1][e] = p.at(g + 8, kr0 + 2 * t + e);
          a[lane][2][e] = p.at(g, kr0 + 2 * t + 8 + e);
          a[lane][3][e] = p.at(g + 8, kr0 + 2 * t + 8 + e);
        }
      }
      for (int group = 0; group < d / 32; ++group) {
        float words[32][4][4];  // lane, key row 2t, 2t + 1, 2t + 8, 2t + 9, byte
        for (int lane = 0; lane < 32; ++lane)
          for (int w = 0; w < 4; ++w) {
            const int row = kr0 + 2 * (lane % 4) + w % 2 + 8 * (w / 2);
            for (int byte = 0; byte < 4; ++byte)
              words[lane][w][byte] = stage[size_t(v_offset(d, row, 32 * group + 4 * (lane / 4))) + byte];
          }
        for (int j = 0; j < 4; ++j) {
          float b[32][2][2];
          for (int lane = 0; lane < 32; ++lane)
            for (int half = 0; half < 2; ++half)
              for (int e = 0; e < 2; ++e) b[lane][half][e] = words[lane][2 * half + e][j];
          float c[32][4];
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) c[lane][i] = acc[(size_t(4 * group + j) * 32 + lane) * 4 + i];
          mma(c, a, b);
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < 4; ++i) acc[(size_t(4 * group + j) * 32 + lane) * 4 + i] = c[lane][i];
        }
      }
    }
    std::map<std::pair<int, int>, int> seen;
    for (int n = 0; n < d / 8; ++n)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 4; ++i) {
          const int row = lane / 4 + 8 * (i / 2), dim = out_dim(n, lane % 4, i);
          ASSERT_LT(dim, d);
          ++seen[{row, dim}];
          float want = 0.0f;
          for (int key = warp_key0; key < warp_key0 + kWarpKeys; ++key) want += p.at(row, key) * v.at(key, dim);
          ASSERT_EQ(acc[(size_t(n) * 32 + lane) * 4 + i], want) << "row " << row << " dim " << dim;
        }
    EXPECT_EQ(int(seen.size()), 16 * d) << "some output (row, dim) is held by no lane, or by two";
  }
}

// A lane's 8 output dims of each 32-dim group are contiguous: store_rows writes them as one
// 16-byte row piece.
TEST_P(Fp8TileLayout, ALaneHoldsEightContiguousDimsAGroup) {
  const int d = GetParam();
  for (int group = 0; group < d / 32; ++group)
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 4; ++j) {
        EXPECT_EQ(out_dim(4 * group + j, t, 0), 32 * group + 8 * t + j);
        EXPECT_EQ(out_dim(4 * group + j, t, 1), 32 * group + 8 * t + 4 + j);
        EXPECT_EQ(out_dim(4 * group + j, t, 2), out_dim(4 * group + j, t, 0));  // row g + 8
      }
}

// The most lanes of one load that share a bank (16-byte loads: per phase of 8 lanes, over the 8
// 16-byte bank groups; 4-byte loads: over the 32 banks). Distinct addresses throughout.
int worst_conflict(const std::vector<int>& offsets, int bytes) {
  const int lanes_a_phase = bytes == 16 ? 8 : 32, banks = bytes == 16 ? 8 : 32;
  int worst = 0;
  for (int phase = 0; phase < 32 / lanes_a_phase; ++phase) {
    std::map<int, int> per_bank;
    for (int lane = phase * lanes_a_phase; lane < (phase + 1) * lanes_a_phase; ++lane)
      worst = std::max(worst, ++per_bank[offsets[lane] / bytes % banks]);
  }
  return worst;
}

TEST_P(Fp8TileLayout, LoadsHitDistinctBanks) {
  const int d = GetParam();
  for (int warp_key0 = 0; warp_key0 < kTileKeys; warp_key0 += kWarpKeys) {
    for (int h = 0; h < d / 64; ++h)
      for (int n = 0; n < kWarpKeys / 8; ++n) {
        std::vector<int> offsets(32);
        for (int lane = 0; lane < 32; ++lane)
          offsets[lane] = k_offset(d, warp_key0 + 8 * n + lane / 4, 64 * h + 16 * (lane % 4));
        EXPECT_EQ(worst_conflict(offsets, 16), 1) << "K, d " << d << " h " << h;
      }
    for (int group = 0; group < d / 32; ++group)
      for (int w = 0; w < 4; ++w) {
        std::vector<int> offsets(32);
        for (int lane = 0; lane < 32; ++lane)
          offsets[lane] = v_offset(d, warp_key0 + 2 * (lane % 4) + w % 2 + 8 * (w / 2), 32 * group + 4 * (lane / 4));
        EXPECT_EQ(worst_conflict(offsets, 4), d >= 128 ? 1 : 2) << "V, d " << d << " group " << group;
      }
  }
}

TEST_P(Fp8TileLayout, SwizzlesKeepEveryRowInPlace) {
  const int d = GetParam();
  for (int row = 0; row < kTileKeys; ++row) {
    std::set<int> k_chunks, v_chunks;
    for (int c = 0; c < d / 16; ++c) {
      k_chunks.insert((k_offset(d, row, 16 * c) - row * d) / 16);
      v_chunks.insert((v_offset(d, row, 16 * c) - row * d) / 16);
    }
    ASSERT_EQ(int(k_chunks.size()), d / 16);
    ASSERT_EQ(*k_chunks.rbegin(), d / 16 - 1);
    ASSERT_EQ(int(v_chunks.size()), d / 16);
    ASSERT_EQ(*v_chunks.rbegin(), d / 16 - 1);
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDimTiles, Fp8TileLayout, testing::Values(64, 128, 256));

}  // namespace
}  // namespace tetra::ops::cuda::fp8_tile

// The tiled layout of the fast path's NVFP4 experts (ops/cuda/nvfp4_tile.h), checked on the
// CPU: every byte and scale has one place, and the reads the kernels make from it (a
// streaming lane's 16 bytes and scale word, a wgmma lane's row and scale piece, the
// interleaved gate/up rows) find the checkpoint's values. The GPU tests run the kernels
// against the dequantized weights; this checks the index algebra they rest on.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "ops/cuda/nvfp4_tile.h"

namespace tetra::ops::cuda {
namespace {

constexpr int64_t kRows = 48, kK = 384;  // 3 tiles x 3 chunks
constexpr int64_t kRowBytes = kK / 2, kGroups = kK / 16;

// Distinct, recognisable checkpoint bytes.
uint8_t code_at(int64_t row, int64_t byte) { return uint8_t(row * 31 + byte * 7 + 1); }
uint8_t scale_at(int64_t row, int64_t group) { return uint8_t(row * 13 + group * 5 + 3); }

struct Tiled {
  std::vector<uint8_t> codes, scales;
};

Tiled tile_matrix() {
  Tiled t{std::vector<uint8_t>(kRows * kRowBytes), std::vector<uint8_t>(kRows * kGroups)};
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kRowBytes; ++b) t.codes[nvfp4_tiled_code_offset(r, b, kK)] = code_at(r, b);
    for (int64_t j = 0; j < kGroups; ++j) t.scales[nvfp4_tiled_scale_offset(r, j, kK)] = scale_at(r, j);
  }
  return t;
}

TEST(Nvfp4Tile, EveryCodeByteAndScaleHasItsOwnPlace) {
  std::set<int64_t> codes, scales;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kRowBytes; ++b) {
      const int64_t at = nvfp4_tiled_code_offset(r, b, kK);
      ASSERT_TRUE(at >= 0 && at < kRows * kRowBytes) << r << " " << b;
      ASSERT_TRUE(codes.insert(at).second) << r << " " << b;
      // A 32-bit word of 8 values stays whole and aligned (the device bit order is per word).
      ASSERT_EQ(at, nvfp4_tiled_code_offset(r, b & ~int64_t(3), kK) + b % 4);
      ASSERT_EQ(nvfp4_tiled_code_offset(r, b & ~int64_t(3), kK) % 4, 0);
    }
    for (int64_t j = 0; j < kGroups; ++j) {
      const int64_t at = nvfp4_tiled_scale_offset(r, j, kK);
      ASSERT_TRUE(at >= 0 && at < kRows * kGroups) << r << " " << j;
      ASSERT_TRUE(scales.insert(at).second) << r << " " << j;
    }
  }
}

TEST(Nvfp4Tile, AStreamingLaneReadsItsRowsAndScales) {
  const Tiled t = tile_matrix();
  for (int64_t tile = 0; tile < kRows / kNvfp4TileRows; ++tile)
    for (int64_t c = 0; c < kK / kNvfp4TileK; ++c) {
      const int64_t block = nvfp4_tile_block(16 * tile, c, kK);
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, q = lane % 4;
        for (int half = 0; half < 2; ++half) {
          const int64_t row = 16 * tile + g + 8 * half;
          const int64_t at = block * kNvfp4TileCodeBytes + nvfp4_lane_code_offset(lane) + half * kNvfp4TileHalfBytes;
          for (int b = 0; b < 16; ++b)  // values 32q .. 32q + 31 of the chunk
            ASSERT_EQ(t.codes[at + b], code_at(row, 64 * c + 16 * q + b)) << tile << " " << c << " " << lane;
        }
        const int64_t s = block * kNvfp4TileScaleBytes + nvfp4_lane_scale_offset(lane);
        for (int i = 0; i < 4; ++i)  // scales 2q, 2q + 1 of row g, then of row g + 8
          ASSERT_EQ(t.scales[s + i], scale_at(16 * tile + g + 8 * (i / 2), 8 * c + 2 * q + i % 2)) << lane << " " << i;
      }
    }
  // A warp's loads are contiguous: rows 0..7 of a block, then rows 8..15, then its scales.
  EXPECT_EQ(nvfp4_lane_code_offset(31) + 16, kNvfp4TileHalfBytes);
  EXPECT_EQ(nvfp4_lane_scale_offset(31) + 4, kNvfp4TileScaleBytes);
}

TEST(Nvfp4Tile, AWgmmaLaneReadsARowAndItsScalePiece) {
  const Tiled t = tile_matrix();
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kK / kNvfp4TileK; ++c) {
      const int64_t at = nvfp4_tiled_code_offset(r, 0, kK) + c * kNvfp4TileCodeBytes;
      for (int b = 0; b < 64; ++b) ASSERT_EQ(t.codes[at + b], code_at(r, 64 * c + b)) << r << " " << c;
      if (r % 16 >= 8) continue;
      const int64_t piece = (nvfp4_tile_block(r, 0, kK) + c) * kNvfp4TileScaleBytes + nvfp4_row_scales_offset(r);
      for (int p = 0; p < 4; ++p)
        for (int i = 0; i < 4; ++i)  // word p: pair p of row r, then of row r + 8
          ASSERT_EQ(t.scales[piece + 4 * p + i], scale_at(r + 8 * (i / 2), 8 * c + 2 * p + i % 2)) << r << " " << p;
    }
}

TEST(Nvfp4Tile, GateAndUpInterleaveByEightRows) {
  constexpr int64_t kInter = 256;
  std::set<int64_t> rows;
  for (int64_t col = 0; col < kInter; ++col) {
    const int64_t gate = nvfp4_gate_up_row(col, false), up = nvfp4_gate_up_row(col, true);
    ASSERT_TRUE(rows.insert(gate).second && rows.insert(up).second) << col;
    ASSERT_TRUE(gate >= 0 && up < 2 * kInter) << col;
    // One MMA thread's rows g and g + 8 of one tile: the gate and the up of one column.
    ASSERT_EQ(up, gate + 8);
    ASSERT_EQ(gate / 16, up / 16);
    ASSERT_LT(gate % 16, 8);
  }
  // The streaming warp that owns columns n0 .. n0 + 15 takes tiles from rows 2 n0 and 2 n0 + 16.
  for (int64_t n0 = 0; n0 < kInter; n0 += 16)
    for (int m = 0; m < 2; ++m)
      for (int g = 0; g < 8; ++g) ASSERT_EQ(nvfp4_gate_up_row(n0 + 8 * m + g, false), 2 * n0 + 16 * m + g);
}

}  // namespace
}  // namespace tetra::ops::cuda

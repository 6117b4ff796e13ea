// Where the FP8 decode tile of attention_gqa.cu keeps and reads its values. Its MMAs take
// their B operands straight from the cache's E4M3 bytes in shared memory (one cvt turns a
// pair of bytes into the f16 pair a fragment register holds), so the reduction index of each
// MMA is relabelled to match bytes a lane can load whole, and Q and the output follow:
//
// - Q K^T, k-step kk: lane (g, t) loads 16 bytes of key row g at dims 64h + 16t (h = kk / 4)
//   and takes word kk % 4 of them: its low byte pair is the fragment's keys-side k = 2t, 2t + 1,
//   its high pair k = 2t + 8, 2t + 9. Q's columns are stored in the same order (q_column), so
//   one ldmatrix still reads the A operand.
// - P V, n-tile n: lane (g, t) loads 4 bytes at dims 32 (n / 4) + 4g of key rows 2t, 2t + 1,
//   2t + 8, 2t + 9; byte n % 4 of each is the value at column g, so column c of n-tile n is dim
//   v_dim(n, c), and a lane's accumulators hold 8 contiguous output dims (out_dim).
// - Shared memory rows are D bytes apart with no skew; 16-byte chunks are XOR-swizzled by row
//   so the 8 lanes of a 16-byte load phase, or the 32 lanes of a 4-byte load, hit distinct
//   banks (D = 64 leaves the V loads 2-way: a 64-byte row has too few chunks).
// Host and device share these functions: tests/ops/cuda/attention_fp8_layout_test.cpp runs a
// warp's fragments through them on the CPU against plain matrix products.
#pragma once

#include "core/host_device.h"

namespace tetra::ops::cuda::fp8_tile {

// The first dim of the pair that half (0: k = 2t, 2t + 1; 1: k = 2t + 8, 2t + 9) of lane
// quad-index t's B fragment holds in the Q K^T k-step kk.
TETRA_HOST_DEVICE constexpr int k_dim(int kk, int t, int half) {
  return 64 * (kk / 4) + 16 * t + 4 * (kk % 4) + 2 * half;
}

// Q's dim `dim` as the reduction index 16 kk + k of the Q K^T MMAs: the inverse of k_dim.
TETRA_HOST_DEVICE constexpr int q_column(int dim) {
  const int h = dim / 64, t = dim % 64 / 16, j = dim % 16 / 4, half = dim % 4 / 2, e = dim % 2;
  return 16 * (4 * h + j) + 8 * half + 2 * t + e;
}

// The output dim of column c (0..7) of P V's n-tile n.
TETRA_HOST_DEVICE constexpr int v_dim(int n, int c) { return 32 * (n / 4) + 4 * c + n % 4; }

// The output dim of accumulator i (0..3: rows g, g, g + 8, g + 8 at columns 2t, 2t + 1) of
// n-tile n in the lane of quad index t.
TETRA_HOST_DEVICE constexpr int out_dim(int n, int t, int i) { return v_dim(n, 2 * t + i % 2); }

// Byte offset in a K stage (rows of d bytes) of byte `byte` of row `row`.
TETRA_HOST_DEVICE constexpr int k_offset(int d, int row, int byte) {
  const int swizzle = d >= 128 ? 4 * (row & 1) : 0;
  return row * d + 16 * ((byte / 16) ^ swizzle) + byte % 16;
}

// Byte offset in a V stage (rows of d bytes) of byte `byte` of row `row`.
TETRA_HOST_DEVICE constexpr int v_offset(int d, int row, int byte) {
  const int swizzle = 2 * ((row >> 1) & (d >= 128 ? 3 : 1));
  return row * d + 16 * ((byte / 16) ^ swizzle) + byte % 16;
}

}  // namespace tetra::ops::cuda::fp8_tile

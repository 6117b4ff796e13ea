// The tiled layout of the fast path's NVFP4 expert matrices (moe_internal.h): where each
// checkpoint byte of codes and each block scale of an [n_out, n_in] matrix is stored. Host
// and device code alike: the upload, the dummy fill, the kernels and the CPU tests share it.
//
// A matrix is cut into blocks of 16 rows (one MMA row tile) x 128 values (one k-chunk),
// stored tile after tile, and within a tile chunk after chunk along K: a warp that walks its
// tile's K reads one contiguous stream, not 16 rows n_in / 2 bytes apart.
// - Codes: a block is 1,024 bytes, its 16 rows of 64 bytes in order. The streaming warps'
//   lane (g, t) takes the 16 bytes of row g at 16 lane, so a warp's load reads 512 contiguous
//   bytes (rows 0..7), and another 512 at 512 + 16 lane (rows 8..15).
// - Words: within a row's 64 bytes, lane t's 16 hold the chunk's 32-bit words (8 values each)
//   t, t + 4, t + 8 and t + 12. Its word w is then values 8 (t + 4w) .. + 7, and the 4 lanes
//   of a token read the activations of one word as 64 contiguous bytes: every sector once
//   (with words 4t .. 4t + 3 they read 16 bytes at each of 4 sectors, every sector twice).
//   The row's 64 bytes are the chunk's 16 words with their 4 x 4 arrangement transposed
//   (nvfp4_tile_word_slot); wgmma's lanes read all of them, at 64 (row % 16).
// - Scales: a word's 8 values share block scale (t + 4w) / 2 = t / 2 + 2w, so lanes t and
//   t ^ 1 need the same four. A block's 128 E4M3 scales hold, at 16 r + 8 p (r < 8, p = 0 or
//   1), the scales p, p + 2, p + 4, p + 6 of row r, then those of row r + 8: lane (g, t) reads
//   its rows' 8 with one 8-byte load at 16 g + 8 (t / 2), and a warp's load is 128 contiguous
//   bytes. wgmma's lanes read rows r and r + 8's 16 scales as the 16 bytes at 16 r.
// - Gate and up: the [2I, H] gate/up matrix interleaves them by 8 rows, so a 16-row tile is 8
//   columns of h, gate rows over up rows. An MMA thread's rows g and g+8 are then the gate and
//   up of one column (SiLU x up meets in its registers), and their scales share one load.
// Rows and K must be multiples of 16 and 128 (the fast path's grid); the words themselves
// keep the device bit order of nvfp4_word.h.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace tetra::ops::cuda {

inline constexpr int kNvfp4TileRows = 16;
inline constexpr int kNvfp4TileK = 128;
inline constexpr int kNvfp4TileCodeBytes = kNvfp4TileRows * kNvfp4TileK / 2;    // 1,024
inline constexpr int kNvfp4TileScaleBytes = kNvfp4TileRows * kNvfp4TileK / 16;  // 128
inline constexpr int kNvfp4TileHalfBytes = kNvfp4TileCodeBytes / 2;  // rows 8..15 of a block

// The row of the tiled gate/up matrix that holds column `col` of gate (or of up).
TETRA_HOST_DEVICE constexpr int64_t nvfp4_gate_up_row(int64_t col, bool up) {
  return 16 * (col / 8) + (up ? 8 : 0) + col % 8;
}

// Block (tile of row, chunk) of a matrix n_in values wide.
TETRA_HOST_DEVICE constexpr int64_t nvfp4_tile_block(int64_t row, int64_t chunk, int64_t n_in) {
  return (row / kNvfp4TileRows) * (n_in / kNvfp4TileK) + chunk;
}

// Where word q (0..15) of a row's chunk sits among the row's 16 stored words: lane t's four
// (q = t + 4w) at 4t + w. The arrangement is its own inverse: stored word s holds word
// nvfp4_tile_word_slot(s).
TETRA_HOST_DEVICE constexpr int nvfp4_tile_word_slot(int q) { return 4 * (q % 4) + q / 4; }

// Where byte `byte` of row `row` of the checkpoint's [n_out, n_in / 2] codes is stored.
TETRA_HOST_DEVICE constexpr int64_t nvfp4_tiled_code_offset(int64_t row, int64_t byte, int64_t n_in) {
  constexpr int kRowBytes = kNvfp4TileK / 2;
  const int in_chunk = int(byte % kRowBytes);
  return nvfp4_tile_block(row, byte / kRowBytes, n_in) * kNvfp4TileCodeBytes + (row % kNvfp4TileRows) * kRowBytes +
         4 * nvfp4_tile_word_slot(in_chunk / 4) + in_chunk % 4;
}

// Where block scale `group` of row `row` of the checkpoint's [n_out, n_in / 16] scales is stored.
TETRA_HOST_DEVICE constexpr int64_t nvfp4_tiled_scale_offset(int64_t row, int64_t group, int64_t n_in) {
  constexpr int kRowScales = kNvfp4TileK / 16;
  const int r = int(row % kNvfp4TileRows), j = int(group % kRowScales);
  return nvfp4_tile_block(row, group / kRowScales, n_in) * kNvfp4TileScaleBytes + 16 * (r % 8) + 8 * (j % 2) +
         4 * (r / 8) + j / 2;
}

// The first of the 8 values (within its chunk) of a streaming lane t's word w: the lane's
// activations of that word are values nvfp4_lane_word_values(t, w) .. + 7.
TETRA_HOST_DEVICE constexpr int nvfp4_lane_word_values(int t, int w) { return 8 * (t + 4 * w); }

// A streaming lane's bytes within a block: its codes of row g (those of row g + 8 are
// kNvfp4TileHalfBytes further), and its 8 scales (row g's 4, then row g + 8's; byte w of
// each is the scale of its word w).
TETRA_HOST_DEVICE constexpr int nvfp4_lane_code_offset(int lane) { return 16 * lane; }
TETRA_HOST_DEVICE constexpr int nvfp4_lane_scale_offset(int lane) { return 16 * (lane / 4) + 8 * (lane % 4 / 2); }

// The 16 bytes of a block's scales that hold the 8 of row `row` and of the row 8 apart
// (wgmma's lanes read them whole): the 4-byte word 2p + h holds scales p, p + 2, p + 4, p + 6
// of rows 0..7 (h = 0) or 8..15 (h = 1).
TETRA_HOST_DEVICE constexpr int nvfp4_row_scales_offset(int64_t row) { return 16 * int(row % 8); }

}  // namespace tetra::ops::cuda

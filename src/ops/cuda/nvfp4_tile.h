// The tiled layout of the fast path's NVFP4 expert matrices (moe_internal.h): where each
// checkpoint byte of codes and each block scale of an [n_out, n_in] matrix is stored. Host
// and device code alike: the upload, the dummy fill, the kernels and the CPU tests share it.
//
// A matrix is cut into blocks of 16 rows (one MMA row tile) x 128 values (one k-chunk),
// stored tile after tile, and within a tile chunk after chunk along K: a warp that walks its
// tile's K reads one contiguous stream, not 16 rows n_in / 2 bytes apart.
// - Codes: a block is 1,024 bytes, its 16 rows of 64 bytes in order. The streaming warps'
//   lane (g, t) takes the 16 bytes of row g at 16 lane (values 32t..32t+31), so a warp's load
//   reads 512 contiguous bytes (rows 0..7), and another 512 at 512 + 16 lane (rows 8..15).
//   wgmma's lanes read a row's whole 64 bytes at 64 (row % 16).
// - Scales: a block's 128 E4M3 scales (8 a row) in the streaming warps' lane order: lane
//   (g, t) finds scales 2t and 2t+1 of row g, then those of row g+8, in the 4 bytes at
//   4 lane. One 4-byte load serves both of its rows; a warp's load is 128 contiguous bytes.
//   Rows r and r + 8's 16 scales are then the 16 bytes at 16 r (r < 8), in alternate pairs.
// - Gate and up: the [2I, H] gate/up matrix interleaves them by 8 rows, so a 16-row tile is 8
//   columns of h, gate rows over up rows. An MMA thread's rows g and g+8 are then the gate and
//   up of one column (SiLU x up meets in its registers), and their scales one 4-byte word.
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

// Where byte `byte` of row `row` of the checkpoint's [n_out, n_in / 2] codes is stored.
TETRA_HOST_DEVICE constexpr int64_t nvfp4_tiled_code_offset(int64_t row, int64_t byte, int64_t n_in) {
  constexpr int kRowBytes = kNvfp4TileK / 2;
  return nvfp4_tile_block(row, byte / kRowBytes, n_in) * kNvfp4TileCodeBytes + (row % kNvfp4TileRows) * kRowBytes +
         byte % kRowBytes;
}

// Where block scale `group` of row `row` of the checkpoint's [n_out, n_in / 16] scales is stored.
TETRA_HOST_DEVICE constexpr int64_t nvfp4_tiled_scale_offset(int64_t row, int64_t group, int64_t n_in) {
  constexpr int kRowScales = kNvfp4TileK / 16;
  const int r = int(row % kNvfp4TileRows), j = int(group % kRowScales);
  const int lane = 4 * (r % 8) + j / 2;
  return nvfp4_tile_block(row, group / kRowScales, n_in) * kNvfp4TileScaleBytes + 4 * lane + 2 * (r / 8) + j % 2;
}

// A streaming lane's bytes within a block: its codes of row g (those of row g + 8 are
// kNvfp4TileHalfBytes further) and its scale word.
TETRA_HOST_DEVICE constexpr int nvfp4_lane_code_offset(int lane) { return 16 * lane; }
TETRA_HOST_DEVICE constexpr int nvfp4_lane_scale_offset(int lane) { return 4 * lane; }

// The 16 bytes of a block's scales that hold the 8 of row `row` and of the row 8 apart
// (wgmma's lanes read them whole): word p holds pair p of rows 0..7 in its low half, of rows
// 8..15 in its high half.
TETRA_HOST_DEVICE constexpr int nvfp4_row_scales_offset(int64_t row) { return 16 * int(row % 8); }

}  // namespace tetra::ops::cuda

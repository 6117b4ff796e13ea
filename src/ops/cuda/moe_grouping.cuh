// Device side of grouping a step's (token, slot) rows by expert, shared by the permute kernel
// (sm90_moe_route.cu) and the fused decode kernel (sm90_moe_decode.cu).
#pragma once

namespace tetra::ops::cuda {

// Called by one whole warp: exclusive prefix sums over experts [0, n) of their row counts
// (cnt) and of their work items (items_of(cnt[e])), into off and item_off. Each lane owns a run
// of experts. Returns the number of items, in every lane.
template <typename ItemsOf>
__device__ __forceinline__ int warp_scan_expert_items(const int* cnt, int n, ItemsOf items_of, int* off,
                                                      int* item_off) {
  const int lane = threadIdx.x & 31, per = (n + 31) / 32;
  const int e0 = min(lane * per, n), e1 = min(e0 + per, n);
  int rows = 0, items = 0;
  for (int e = e0; e < e1; ++e) rows += cnt[e], items += items_of(cnt[e]);
  int rows_incl = rows, items_incl = items;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int ro = __shfl_up_sync(0xffffffffu, rows_incl, o);
    const int io = __shfl_up_sync(0xffffffffu, items_incl, o);
    if (lane >= o) rows_incl += ro, items_incl += io;
  }
  int r = rows_incl - rows, it = items_incl - items;
  for (int e = e0; e < e1; ++e) {
    off[e] = r;
    item_off[e] = it;
    r += cnt[e];
    it += items_of(cnt[e]);
  }
  return __shfl_sync(0xffffffffu, items_incl, 31);
}

// Work items of at most `tile` rows: ceil(cnt / tile) an expert.
__device__ __forceinline__ int warp_scan_expert_rows(const int* cnt, int n, int tile, int* off, int* item_off) {
  return warp_scan_expert_items(cnt, n, [tile](int c) { return (c + tile - 1) / tile; }, off, item_off);
}

}  // namespace tetra::ops::cuda

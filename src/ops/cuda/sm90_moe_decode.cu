// The MoE layer of a decode step in one persistent kernel (sm_90a): grouping, gate/up with
// SiLU, down, and the weighted combine, with no other launch and no grid barrier.
//
// A decode step reads each touched expert's weights once for a few tokens, so the layer is a
// weight stream, and at batch 1 its five launches (route, permute, gate/up, down, combine) and
// the wave tails of short grids cost as much as the stream. Here every block first groups the
// step's (token, slot) rows by expert itself, in the same deterministic order as every other
// block (a stable counting sort in shared memory: no permute kernel), cutting each expert's rows
// into items of at most 8 tokens (one MMA column tile). Blocks then take units from a global
// counter, gate/up units first:
//   - gate/up unit (item, 16 columns of h): the 16 gate rows and 16 up rows, K = H split 4 ways
//     over the block's warps;
//   - down unit (item, 64 columns of out): 2 tiles of 32 rows of W_down, K = I split 2 ways.
// The warps stream weights exactly as sm90_moe_gemm.cu's tiles of 8 do (sm90_moe_stream.cuh),
// so a unit costs what a block of those kernels costs; what goes is the permute and combine
// launches and the tails. A block that takes a down unit of an item only ever waits for gate/up
// units that running blocks have already taken, so there is no deadlock, whatever the number
// of resident blocks.
//
// Cross-block hand-offs go through counters in CudaMoeExperts::decode_ctl, left zero by the
// block that uses them last: a gate/up unit counts itself done per item with a release-add
// (down units of the item acquire-wait for all of them and read h through L2), and a down unit
// counts (token, 32-column tile) slots; the warp that completes a token's tile sums its slots'
// y in slot order into out, as launch_combine does, so results are deterministic.
//
// (An earlier form fed 16 warps from a TMA ring of whole-K row pieces with an epilogue warp;
// it streamed at 1.1-1.5 TB/s, docs/PERF.md says why.)
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gpu_sync.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe_grouping.cuh"
#include "ops/cuda/moe_internal.h"
#include "ops/cuda/sm90_moe_stream.cuh"

namespace tetra::ops::cuda {
namespace {

using namespace moe_stream;

constexpr int kItemTokens = 8;        // one MMA column tile
constexpr int kMaxStored = 1024;      // routed experts + the shared one
constexpr int kSplitGateUp = 4;       // K split over the block's 4 warps, one 16-column tile
constexpr int kSplitDown = 2;         // 2 tiles of 32 rows, K split 2 ways
// The register pipeline of the tiles of 8. The shared-memory ring the grouped tiles use was
// 8-14% slower here at T = 1 with 3 or 4 slots, and 4 or 5 blocks an SM (docs/PERF.md).
constexpr int kStages = 3;
constexpr int kDownCols = 32 * kWarps / kSplitDown;
static_assert(kMoeDecodeMaxItems >= kMoeDecodeMaxRows + kMoeDecodeMaxRows / kItemTokens, "items of 8 rows");

struct DecodeItem {
  int expert, begin, n;  // rows [begin, begin + n) of the grouped order
};

struct DecodeParams {
  const uint16_t* x;     // bf16 [T, H]
  const int* ids;        // [T, k]
  const float* weights;  // [T, k]
  uint16_t* out;         // bf16 [T, H]
  MoeGemmParams gate_up, down;  // their item fields unused: the items are the block's own
  const float* global_scale;    // [E', 3]
  uint16_t* h;  // bf16 [R, I]: silu(gate) * up, grouped rows
  float* y;     // f32 [R, H]: down projection, grouped rows
  MoeDecodeControl ctl;
  int n_tokens, top_k, first_expert, n_experts, hidden, inter;
  bool shared;
};

struct DecodeShared {
  DecodeItem items[kMoeDecodeMaxItems];
  int row_token[kMoeDecodeMaxRows];  // token of each grouped row
  int pos[kMoeDecodeMaxRows];        // grouped row of each (token, slot); -1: another rank's expert
  int n_slots[kMoeDecodeMaxTokens];  // slots of each token this rank computes, where not all_local
  bool all_local;                    // every slot's expert is this rank's (one rank: always)
  int n_items;
  int next_unit;
};

// Only while grouping: counting-sort arrays.
struct GroupScratch {
  int cnt[kMaxStored], off[kMaxStored], item_off[kMaxStored];
};

__device__ __forceinline__ int stored_expert(const DecodeParams& p, int r, int kk) {
  const int t = r / kk;
  return moe_stored_expert(p.ids, t, r - t * kk, p.top_k, p.first_expert, p.n_experts);
}

// Warp 0: rows (t, j) grouped by expert, in (t, j) order within an expert; the same result in
// every block.
__device__ void group_rows(const DecodeParams& p, DecodeShared& sm, GroupScratch& g) {
  const int lane = threadIdx.x & 31;
  const int kk = p.top_k + (p.shared ? 1 : 0), n_rows = p.n_tokens * kk;
  const int n_stored = p.n_experts + (p.shared ? 1 : 0);
  for (int e = lane; e < n_stored; e += 32) g.cnt[e] = 0;
  __syncwarp();
  bool foreign = false;
  for (int base = 0; base < n_rows; base += 32) {
    const int r = base + lane;
    const int e = r < n_rows ? stored_expert(p, r, kk) : -1;
    foreign |= r < n_rows && e < 0;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int before = __popc(same & ((1u << lane) - 1u));
    const int c = e >= 0 ? g.cnt[e] : 0;
    __syncwarp();
    if (e >= 0) {
      sm.pos[r] = c + before;  // rank within the expert; the offset is added below
      if (before == __popc(same) - 1) g.cnt[e] = c + __popc(same);
    } else if (r < n_rows) {
      sm.pos[r] = -1;
    }
    __syncwarp();
  }
  const int n_items = warp_scan_expert_rows(g.cnt, n_stored, kItemTokens, g.off, g.item_off);
  if (lane == 0) sm.n_items = n_items;
  __syncwarp();
  for (int e = lane; e < n_stored; e += 32)
    for (int q = 0; q * kItemTokens < g.cnt[e]; ++q)
      sm.items[g.item_off[e] + q] = DecodeItem{e, g.off[e] + q * kItemTokens, min(kItemTokens, g.cnt[e] - q * kItemTokens)};
  for (int i = lane; i < n_rows; i += 32) {
    const int e = stored_expert(p, i, kk);
    if (e < 0) continue;
    const int row = g.off[e] + sm.pos[i];
    sm.pos[i] = row;
    sm.row_token[row] = i / kk;
  }
  const bool all_local = !__any_sync(0xffffffffu, foreign);
  if (lane == 0) sm.all_local = all_local;
  if (all_local) return;
  __syncwarp();
  for (int t = lane; t < p.n_tokens; t += 32) {
    int n = 0;
    for (int j = 0; j < kk; ++j) n += sm.pos[t * kk + j] >= 0;
    sm.n_slots[t] = n;
  }
}

// Block 0: the tokens none of whose slots this rank computes (expert parallelism) are zeros;
// no down unit will combine them.
__device__ void zero_tokens_without_slots(const DecodeParams& p, const DecodeShared& sm) {
  if (sm.all_local) return;
  for (int t = 0; t < p.n_tokens; ++t)
    if (sm.n_slots[t] == 0)
      for (int c = threadIdx.x; c < p.hidden; c += blockDim.x) p.out[int64_t(t) * p.hidden + c] = 0;
}

// A warp after writing y for one 32-column tile of an item: counts the item's tokens' tile done
// and, where this was a token's last slot, sums the slots' y in slot order into out.
__device__ void combine_tile(const DecodeParams& p, const DecodeShared& sm, int item_index, int col_tile,
                             const DecodeItem& item) {
  const int lane = threadIdx.x & 31;
  const int kk = p.top_k + (p.shared ? 1 : 0), n_tiles = p.hidden / 32;
  int token = 0;
  bool last = false;
  if (lane < item.n) {
    token = sm.row_token[item.begin + lane];
    const int slots = sm.all_local ? kk : sm.n_slots[token];
    last = atomic_add_acq_rel_gpu(p.ctl.tile_count + token * n_tiles + col_tile, 1) == slots - 1;
  }
  unsigned todo = __ballot_sync(0xffffffffu, last);
  const int col = col_tile * 32 + lane;
  while (todo) {
    const int s = __ffs(todo) - 1;
    todo &= todo - 1;
    const int t = __shfl_sync(0xffffffffu, token, s);
    float acc = 0.0f;
#pragma unroll 3
    for (int j = 0; j < kk; ++j) {
      // Another rank's slot (row -1) loads row 0 and adds nothing: no branch, so the slots'
      // loads stay in flight together (this sum ends the layer at one token).
      const int row = sm.pos[t * kk + j];
      const float wj = j < p.top_k ? p.weights[int64_t(t) * p.top_k + j] : 1.0f;
      const float v = __ldcg(p.y + int64_t(max(row, 0)) * p.hidden + col);
      acc += wj * (row < 0 ? 0.0f : v);
    }
    __nv_bfloat16 o = __float2bfloat16_rn(acc);
    p.out[int64_t(t) * p.hidden + col] = *reinterpret_cast<uint16_t*>(&o);
    if (lane == s) p.ctl.tile_count[t * n_tiles + col_tile] = 0;  // every slot has counted: reset for the next launch
  }
  if (lane == 0 && atomicAdd(p.ctl.item_down + item_index, 1) == n_tiles - 1) {
    // Every down unit of the item has passed its wait: its counters are free for the next launch.
    p.ctl.item_gate_up[item_index] = 0;
    p.ctl.item_down[item_index] = 0;
  }
}

// One gate/up unit: h[rows of the item, 16 columns] = silu(x W_gate^T) * (x W_up^T).
__device__ void gate_up_unit(const DecodeParams& p, const DecodeShared& sm, int item_index, int tile) {
  const DecodeItem item = sm.items[item_index];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kSplitGateUp> role(p.hidden / kMoeChunkK);
  const int n0 = tile * 16;
  const int rows[2] = {2 * n0, 2 * n0 + 16};  // columns n0.., n0 + 8..: gate rows over up rows (nvfp4_tile.h)
  MoeGemmParams gp = p.gate_up;
  gp.b_rows = sm.row_token;
  WarpOperands<2, 1> op;
  warp_operands<true, 2, 1>(gp, MoeWorkItem{item.expert, item.begin, item.n, 0}, rows, op);
  float acc[2][1][4];
  gemm_warp<true, 2, 1, kStages>(op, role.c_begin, role.c_end, acc);
  reduce_split_k<2, 1, kSplitGateUp>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;
  const float gs_gate = p.global_scale[item.expert * 3 + 0] * 256.0f;  // the 2^-8 left in the decoded weights
  const float gs_up = p.global_scale[item.expert * 3 + 1] * 256.0f;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int slot = 2 * t + e;
      if (slot >= item.n) continue;
      const float gate = acc[m][0][e] * gs_gate, up = acc[m][0][2 + e] * gs_up;  // rows g, g + 8 of tile m
      const float hv = gate / (1.0f + __expf(-gate)) * up;
      __nv_bfloat16 hb = __float2bfloat16_rn(hv);
      __stcg(p.h + int64_t(item.begin + slot) * p.inter + n0 + 8 * m + g, *reinterpret_cast<uint16_t*>(&hb));
    }
  __syncwarp();
  if (lane == 0) red_add_release_gpu(p.ctl.item_gate_up + item_index, 1);  // this tile of h is visible first
}

// One down unit: y[rows of the item, 64 columns] = h W_down^T, then the combine of the
// tokens whose last slot this was.
__device__ void down_unit(const DecodeParams& p, const DecodeShared& sm, int item_index, int unit_tile) {
  const DecodeItem item = sm.items[item_index];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const BlockRole<kSplitDown> role(p.inter / kMoeChunkK);
  const int n0 = unit_tile * kDownCols + role.tile * 32;
  const int rows[2] = {n0, n0 + 16};
  WarpOperands<2, 1> op;
  warp_operands<true, 2, 1>(p.down, MoeWorkItem{item.expert, item.begin, item.n, 0}, rows, op);
  float acc[2][1][4];
  // The weights do not depend on h: their first stages load while the block waits for it. h
  // of the item is complete once all its gate/up units have counted (each released its part).
  gemm_warp<true, 2, 1, kStages, true>(op, role.c_begin, role.c_end, acc, [&] {
    if (threadIdx.x == 0)
      while (ld_acquire_gpu(p.ctl.item_gate_up + item_index) < p.inter / 16) __nanosleep(32);
    __syncthreads();
  });
  reduce_split_k<2, 1, kSplitDown>(acc, role.kpart, role.tile);
  if (role.kpart != 0) return;
  const float gs = p.global_scale[item.expert * 3 + 2] * 256.0f;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int slot = 2 * t + (i & 1);
      if (slot >= item.n) continue;
      __stcg(p.y + int64_t(item.begin + slot) * p.hidden + n0 + 16 * m + g + (i >= 2 ? 8 : 0), acc[m][0][i] * gs);
    }
  __syncwarp();  // the y stores come before the counts (the counting atomics release them)
  combine_tile(p, sm, item_index, n0 / 32, item);
}

__global__ void __launch_bounds__(kWarps * 32, min_blocks(1)) moe_decode_kernel(DecodeParams p) {
  __shared__ DecodeShared sm;
  __shared__ GroupScratch group;
  // With PDL the router may still run: wait for its ids. Blocks of the next kernel may start
  // early once every block here has started; these blocks never wait for one that has not
  // (units are taken in order), so they cannot be starved by them.
  pdl_wait();
  pdl_launch_dependents();
  if (threadIdx.x < 32) group_rows(p, sm, group);
  if (threadIdx.x == 0) sm.next_unit = atomicAdd(p.ctl.next_unit, 1);
  __syncthreads();
  if (blockIdx.x == 0) zero_tokens_without_slots(p, sm);
  const int n_gate_up = sm.n_items * (p.inter / 16);
  const int n_units = n_gate_up + sm.n_items * (p.hidden / kDownCols);
  for (;;) {
    const int u = sm.next_unit;
    if (u >= n_units) break;
    // The next claim travels while this unit streams (a block's claims are in order, so one
    // held ahead is a gate/up unit only while this one is too: nothing waits on it).
    int claimed = 0;
    if (threadIdx.x == 0) claimed = atomicAdd(p.ctl.next_unit, 1);
    if (u < n_gate_up)
      gate_up_unit(p, sm, u / (p.inter / 16), u % (p.inter / 16));
    else
      down_unit(p, sm, (u - n_gate_up) / (p.hidden / kDownCols), (u - n_gate_up) % (p.hidden / kDownCols));
    __syncthreads();  // every warp is done with this unit (and sm.next_unit) before it moves on
    if (threadIdx.x == 0) sm.next_unit = claimed;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    // The last block out leaves the unit counter at zero for the next launch.
    __threadfence();
    if (atomicAdd(p.ctl.exited, 1) == int(gridDim.x) - 1) {
      *p.ctl.next_unit = 0;
      *p.ctl.exited = 0;
    }
  }
}

}  // namespace

bool moe_decode_takes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k) {
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  // Down units are 64 columns of H; the fast grid gives H and I in 128s.
  return ex.format == WeightFormat::Nvfp4 && ex.fast && ex.decode_ctl.next_unit != nullptr &&
         ex.shape.hidden % kDownCols == 0 && n_tokens >= 1 && n_tokens <= kMoeDecodeMaxTokens &&
         rows <= kMoeDecodeMaxRows && ex.n_stored() <= kMaxStored;
}

void launch_moe_decode(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x, const int* ids,
                       const float* weights, int n_tokens, int top_k, const MoeScratch& s, uint16_t* out) {
  TETRA_CHECK(moe_decode_takes(ex, n_tokens, top_k), "moe: the fused decode kernel does not take this call (",
              n_tokens, " tokens, top-k ", top_k, "): moe_experts checks moe_decode_takes first");
  DecodeParams p{};
  p.x = x;
  p.ids = ids;
  p.weights = weights;
  p.out = out;
  p.gate_up = moe_gemm_params(ex, s, true);
  p.gate_up.b = x;
  p.down = moe_gemm_params(ex, s, false);
  p.down.b = s.h;
  p.down.b_rows = nullptr;
  p.global_scale = ex.global_scale;
  p.h = s.h;
  p.y = s.y;
  p.ctl = ex.decode_ctl;
  p.n_tokens = n_tokens;
  p.top_k = top_k;
  p.first_expert = int(ex.first_expert());
  p.n_experts = ex.shape.n_experts;
  p.hidden = int(ex.shape.hidden);
  p.inter = int(ex.shape.intermediate);
  p.shared = ex.shape.shared_expert;
  int device = 0, sms = 0, per_sm = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&device));
  TETRA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TETRA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_decode_kernel, kWarps * 32, 0));
  TETRA_CHECK(per_sm >= 1, "moe: the fused decode kernel does not fit on an SM");
  launch_kernel(launch, moe_decode_kernel, sms * per_sm, kWarps * 32, 0, p);
}

}  // namespace tetra::ops::cuda

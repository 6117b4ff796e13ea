// Internal to the MoE implementation: the packed expert layout and the kernel launchers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "core/host_device.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_tune.h"

namespace tetra::ops::cuda {

// The most experts a token picks (the router's warp keeps one a lane).
inline constexpr int kMaxTopK = 32;

// Rows of the weight matrices each k-chunk of the GEMM kernels covers: 4 lanes x 32 values.
inline constexpr int kMoeChunkK = 128;

// The fused decode kernel's bounds (sm90_moe_decode.cu): tokens, (token, expert) rows, and
// the work items those rows can make (one per expert touched, plus one per 8 rows).
inline constexpr int kMoeDecodeMaxTokens = 64;
inline constexpr int kMoeDecodeMaxRows = 512;
inline constexpr int kMoeDecodeMaxItems = kMoeDecodeMaxRows + kMoeDecodeMaxRows / 8;

// Device counters through which the blocks of the fused decode kernel hand work to each
// other. Every launch leaves them zero (the block that uses a counter last resets it), so
// they are zeroed once, when the experts are made; and two launches on the same experts must
// not run at once (one stream per experts object, as the engine has).
struct MoeDecodeControl {
  int* next_unit = nullptr;     // [1] the next unit to take
  int* exited = nullptr;        // [1] blocks that have finished
  int* item_gate_up = nullptr;  // [kMoeDecodeMaxItems] gate/up units done per item
  int* item_down = nullptr;     // [kMoeDecodeMaxItems] down units done per item
  int* tile_count = nullptr;    // [kMoeDecodeMaxTokens, H/32] slots done per (token, column tile)
};

// Device weights of all experts, expert-major. E' = n_experts (+1 for the shared expert,
// stored last). NVFP4 data holds the checkpoint's [n_out, n_in/2] bytes and [n_out, n_in/16]
// E4M3 scales with the bits of every 32-bit word of 8 values in the device order of
// nvfp4_word.h, which the kernels decode in fewer instructions. On the fast grid (tiled())
// codes and scales are stored in the 16-row x 128-value blocks of nvfp4_tile.h, which a
// warp reads as contiguous streams; elsewhere (the general path) they stay row-major.
class CudaMoeExperts final : public MoeExperts {
 public:
  // down_format differs from format only where a checkpoint leaves the down projections
  // unquantized (an intermediate size that is no multiple of 16); only the general path
  // takes such experts.
  CudaMoeExperts(const MoeShape& shape, WeightFormat format, MoeTuner* tuner,
                 std::optional<WeightFormat> down_format = std::nullopt);
  ~CudaMoeExperts() override;
  CudaMoeExperts(const CudaMoeExperts&) = delete;
  CudaMoeExperts& operator=(const CudaMoeExperts&) = delete;

  int64_t n_experts() const override { return shape.n_experts; }
  int n_stored() const { return shape.n_experts + (shape.shared_expert ? 1 : 0); }

  MoeShape shape;
  WeightFormat format;       // gate/up: Nvfp4 or Dense (BF16)
  WeightFormat down_format;  // down: the same, but for mixed checkpoints
  // w13: per expert [2I, H] (gate rows, then up rows); w2: per expert [H, I].
  // Nvfp4: uint8 [E', 2I, H/2] and [E', H, I/2] (tiled: the same bytes in blocks, gate
  // and up rows interleaved by 8);
  // Dense: bf16 [E', 2I, H] and [E', H, I].
  void* w13 = nullptr;
  void* w2 = nullptr;
  uint8_t* w13_scale = nullptr;  // Nvfp4: E4M3 [E', 2I, H/16]
  uint8_t* w2_scale = nullptr;   // Nvfp4: E4M3 [E', H, I/16]
  float* global_scale = nullptr; // [E', 3]: gate, up, down (1 for Dense)
  // Tuned configurations, the backend's (one for every layer); null: the heuristic decides.
  MoeTuner* tuner = nullptr;
  // Hidden and intermediate sizes on the fast kernels' grid (multiples of 128); else the
  // general kernels (moe_general.cu) run these experts.
  bool fast = false;
  bool tiled() const { return fast && format == WeightFormat::Nvfp4; }
  // NVFP4 experts on the fast grid: the fused decode kernel's counters (one allocation).
  MoeDecodeControl decode_ctl;

  int64_t w13_expert_bytes() const;
  int64_t w2_expert_bytes() const;
  int64_t w13_scale_expert_bytes() const;
  int64_t w2_scale_expert_bytes() const;
};

// The stored expert (0 .. E'-1) of slot j of token t: a routed id less first_expert, or
// E for slot top_k (the shared expert, stored last). -1 for an id outside [first_expert,
// first_expert + E): under expert parallelism another rank's expert (or a bad id), which adds
// nothing, as on the CPU.
TETRA_HOST_DEVICE inline int moe_stored_expert(const int* ids, int t, int j, int top_k, int first_expert,
                                               int n_experts) {
  if (j >= top_k) return n_experts;
  const int e = ids[int64_t(t) * top_k + j] - first_expert;
  return unsigned(e) < unsigned(n_experts) ? e : -1;
}

// One work item of the grouped GEMMs: up to tile_tokens rows of one expert.
struct MoeWorkItem {
  int expert;
  int row_begin;  // first row in the permuted order
  int n_rows;
  int pad;
};
static_assert(sizeof(MoeWorkItem) == 16, "work items are read as one 16-byte load");

// Scratch of one moe_experts call, carved from ctx.workspace.
// Hot items are at least this wide, which bounds the size of their list.
constexpr int kMinHotTokens = 16;

struct MoeScratch {
  int* n_items;           // [1]
  MoeWorkItem* items;     // [max_items]
  // With MoeConfig::hot_tokens: the items of the experts that have more rows than tile_tokens,
  // cut at hot_tokens, which their own GEMM launches take (hot()).
  int* n_hot_items;       // [1]
  MoeWorkItem* hot_items; // [max_hot_items]
  int* row_token;         // [T*k']: token of each permuted row
  int* pos;               // [T*k']: permuted row of each (token, slot)
  uint16_t* h;            // bf16 [T*k', I]: silu(gate) * up, permuted rows
  float* y;               // f32 [T*k', H]: down projection, permuted rows
  int max_items, max_hot_items;  // the hot list is sized for items of kMinHotTokens
  // The same rows, with the hot list as the items a GEMM launch reads.
  MoeScratch hot() const {
    MoeScratch s = *this;
    s.n_items = n_hot_items;
    s.items = hot_items;
    s.max_items = max_hot_items;
    return s;
  }
};

int64_t moe_scratch_bytes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k, int tile_tokens);
MoeScratch moe_scratch_carve(const CudaMoeExperts& ex, void* base, int64_t n_tokens, int top_k,
                             int tile_tokens);

// ---- launchers (sm90_moe_route.cu). The launchers that take a KernelLaunch launch kernels
// that pdl_wait first (launch.cuh), so they may run with PDL. ----
void launch_route(const KernelLaunch& launch, const float* logits, int n_tokens, int n_experts,
                  const RoutingSpec& spec, const float* bias, int* ids, float* weights);
// pos of a slot whose expert another rank holds is -1; the combine skips it.
void launch_permute(const KernelLaunch& launch, const int* ids, int n_tokens, int top_k, int first_expert,
                    int n_experts, bool shared, int tile_tokens, int hot_tokens, const MoeScratch& s);
void launch_combine(const KernelLaunch& launch, const float* y, const int* pos, const float* weights,
                    int n_tokens, int top_k, bool shared, int hidden, uint16_t* out);

// What both GEMM kernel families read: the work items, one weight matrix of every expert,
// the activations and where the results go.
struct MoeGemmParams {
  const int* n_items;
  const MoeWorkItem* items;
  const uint8_t* w;        // w13 or w2, all experts
  const uint8_t* w_scale;  // Nvfp4 only
  const float* global_scale;
  int64_t w_expert_bytes, w_row_bytes, s_expert_bytes;  // w_row_bytes: read by BF16 tiles only (NVFP4 is tiled)
  const uint16_t* b;   // x [T, H] (gate/up) or h [T*k', I] (down)
  const int* b_rows;   // gate/up: token of each permuted row; down: null (rows are permuted)
  int k;               // H (gate/up) or I (down)
  int n;               // I (gate/up) or H (down)
  uint16_t* h;         // gate/up output
  float* y;            // down output
};

// The parameters of the gate/up (or down) GEMM for these experts and scratch; b and b_rows
// are left for the caller.
MoeGemmParams moe_gemm_params(const CudaMoeExperts& ex, const MoeScratch& s, bool gate_up);

// Tiles of 64 to 256 tokens of NVFP4 experts run on the wgmma kernels (sm90_moe_wgmma.cu);
// the rest on the weight-streaming mma.sync kernels (sm90_moe_gemm.cu).
inline bool moe_uses_wgmma(WeightFormat format, int tile_tokens) {
  return format == WeightFormat::Nvfp4 && tile_tokens >= 64;
}

// ---- launchers (sm90_moe_gemm.cu; they hand wgmma tiles on) ----
void launch_gate_up(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x,
                    const MoeScratch& s, int tile_tokens);
void launch_down(const KernelLaunch& launch, const CudaMoeExperts& ex, const MoeScratch& s,
                 int tile_tokens);

// ---- the fused decode kernel (sm90_moe_decode.cu): grouping, gate/up, down and combine in
// one launch, for a few tokens ----
bool moe_decode_takes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k);
// s: a scratch carved for tile 8 (only its h and y are used).
void launch_moe_decode(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x, const int* ids,
                       const float* weights, int n_tokens, int top_k, const MoeScratch& s, uint16_t* out);

// ---- launchers (sm90_moe_wgmma.cu) ----
void launch_gate_up_wgmma(const KernelLaunch& launch, const CudaMoeExperts& ex, const uint16_t* x,
                          const MoeScratch& s, int tile_tokens);
void launch_down_wgmma(const KernelLaunch& launch, const CudaMoeExperts& ex, const MoeScratch& s,
                       int tile_tokens);

// ---- the general path (moe_general.cu): any hidden and intermediate size (multiples of 16
// for NVFP4), f32 intermediates, the routed outputs summed in expert order as the CPU sums
// them, then the shared expert ----
int64_t moe_general_scratch_bytes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k);
void launch_moe_general(cudaStream_t stream, const CudaMoeExperts& ex, const uint16_t* x, const int* ids,
                        const float* weights, int n_tokens, int top_k, void* scratch, uint16_t* out);

// ---- dummy experts (moe_general.cu): the CPU's random_experts, value for value ----
void launch_fill_dummy_experts(cudaStream_t stream, const CudaMoeExperts& ex, uint64_t seed);

}  // namespace tetra::ops::cuda

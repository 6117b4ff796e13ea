// The MoE layer on CUDA (sm_90a): routing, permutation of tokens by expert, the grouped
// expert GEMMs (NVFP4 weights decoded in registers, or BF16) and the weighted combine.
// Implements the semantics of ops::Backend::route, moe_experts and prepare_experts; the CUDA
// backend wraps these functions. Nothing here synchronizes with the host, so a whole layer
// can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops::cuda {

// The sizes of one MoE layer's routed experts.
struct MoeShape {
  int64_t hidden = 0;        // H: input and output width
  int64_t intermediate = 0;  // I: width of gate, up and the down projection's input
  int n_experts = 0;         // routed experts
  bool shared_expert = false;  // one more expert of the same shape that every token uses
};

// Routed experts (and the optional shared expert) packed for the MoE kernels.
class CudaMoeExperts;

class MoeTuner;
class Uploader;

// Packs experts (host views, read straight from the checkpoint's mapping; all NVFP4 or all
// dense BF16/F32, all of one shape) into device memory through `uploader` (pinned staging,
// queued copies: finish() it before the host memory goes away), or with plain copies when it
// is null. The shared expert, if given, must have the routed experts' shape; it is applied to
// every token with weight 1, after the routed experts (FORMATS.md §2.2). `tuner` (may be
// null: the heuristic decides) holds the tile choices moe_experts reads.
std::unique_ptr<MoeExperts> prepare_experts(const Context& ctx, const std::vector<MlpWeights>& experts,
                                            const MlpWeights* shared = nullptr, MoeTuner* tuner = nullptr,
                                            Uploader* uploader = nullptr);

// Experts with random weights drawn on the device: for benchmarks (no host copy of 5 GB) and
// --load-format dummy. The values are those the CPU backend's random_experts draws from the
// same seed (core/dummy_random.h), so a dummy model is one model on both backends.
std::unique_ptr<MoeExperts> random_experts(const Context& ctx, const MoeShape& shape,
                                           WeightFormat format, uint64_t seed, MoeTuner* tuner = nullptr,
                                           std::optional<WeightFormat> down_format = std::nullopt);

const MoeShape& experts_shape(const MoeExperts& experts);
WeightFormat experts_format(const MoeExperts& experts);
int64_t experts_bytes_per_expert(const MoeExperts& experts);

// logits F32 [T, E] -> ids I32 [T, top_k], weights F32 [T, top_k] (FORMATS.md §2.2).
void route(const Context& ctx, TensorView logits, const RoutingSpec& spec, TensorView ids,
           TensorView weights);

// How the expert GEMMs run; chosen per (shape, token bucket) unless forced.
struct MoeConfig {
  // Tokens per work item: 8, 16, 32 (mma.sync, weights streamed once per item), 64 (NVFP4:
  // wgmma; BF16: mma.sync), 128, 192 or 256 (NVFP4 only: wgmma).
  int tile_tokens = 0;
  bool tuned = false;   // chosen by timing (else by the heuristic or forced)
  std::string why;      // what chose it, for --verbose
  // The whole layer in one persistent kernel (NVFP4, up to 64 tokens: moe_decode_takes); its
  // work items are 8 tokens of one expert, so tile_tokens is 8. Chosen only by tuning.
  bool fused = false;
  // 0, or a wider tile (16 to 256, one the format takes) for the experts with more rows than
  // tile_tokens: each is then read once per hot_tokens rows, not once per tile_tokens, while
  // the many experts with few rows keep the narrow tile. Skewed routing and the shared expert
  // make such experts. Their items run in GEMM launches of their own, after the others'.
  int hot_tokens = 0;
  std::string str() const;
};

// The tile widths moe_experts takes for experts of this format, smallest first.
std::span<const int> moe_tile_choices(WeightFormat format);

// Scratch bytes moe_experts needs in ctx.workspace for T tokens of top_k experts each.
int64_t moe_workspace_bytes(const MoeExperts& experts, int64_t n_tokens, int top_k);

// out BF16 [T, H] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) (+ shared(x[t])).
// x BF16 [T, H]; ids I32 [T, k]; weights F32 [T, k]. config.tile_tokens = 0 picks one.
void moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                 const MoeExperts& experts, TensorView out, MoeConfig config = {});

// The configuration moe_experts picks for T tokens (config.tile_tokens = 0): the tuner's
// choice for this GPU, shape and token bucket if it has one, else the heuristic. moe_experts
// never tunes: tune_moe does, at warm-up.
MoeConfig pick_moe_config(const Context& ctx, const MoeExperts& experts, int64_t n_tokens, int top_k);
// Whether the experts' tuner already holds a choice for T tokens (from this run or its cache file).
bool moe_tuned(const Context& ctx, const MoeExperts& experts, int64_t n_tokens, int top_k);

// Times the heuristic's tile and its neighbours on these inputs (one warm-up, best of three),
// records the fastest in the experts' tuner and returns it; `out` is left holding the chosen
// tile's result. Synchronizes the stream: never under stream capture. Experts without a tuner,
// or off the fast kernels' grid, return the heuristic's choice untimed.
MoeConfig tune_moe(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                   const MoeExperts& experts, TensorView out);

// Whether the fast kernels take these experts (hidden and intermediate sizes multiples of
// 128); other shapes run on a general path that is exact but slow.
bool moe_fast_path(const MoeExperts& experts);

}  // namespace tetra::ops::cuda

// Host side of the CUDA MoE layer: argument checks, scratch layout, and the launch sequence
// route -> permute -> gate/up (+SiLU) -> down -> combine. No host synchronization.
#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_internal.h"

namespace tetra::ops::cuda {

namespace {

constexpr int64_t kAlign = 256;

int64_t align_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

const CudaMoeExperts& as_cuda(const MoeExperts& experts) {
  const auto* ex = dynamic_cast<const CudaMoeExperts*>(&experts);
  TETRA_CHECK(ex != nullptr, "moe: experts were not prepared by the CUDA backend");
  return *ex;
}

int max_work_items(const CudaMoeExperts& ex, int64_t n_rows, int tile_tokens) {
  // Each non-empty expert has one partial item at most; the rest are full.
  return int(std::min<int64_t>(ex.n_stored(), n_rows) + (n_rows + tile_tokens - 1) / tile_tokens);
}

void check_view(TensorView v, DType dtype, int64_t rows, int64_t cols, const char* what) {
  TETRA_CHECK(v.device == Device::Cuda, "moe: ", what, " must be on the CUDA device");
  TETRA_CHECK(v.dtype == dtype, "moe: ", what, " has dtype ", dtype_name(v.dtype), ", expected ",
              dtype_name(dtype));
  TETRA_CHECK(v.shape.rank == 2 && v.dim(0) == rows && v.dim(1) == cols, "moe: ", what, " is ",
              v.shape.str(), ", expected [", rows, ", ", cols, "]");
}

}  // namespace

std::string MoeConfig::str() const {
  if (fused) return "fused decode";
  return hot_tokens ? str_cat("tile_tokens=", tile_tokens, "+hot ", hot_tokens) : str_cat("tile_tokens=", tile_tokens);
}

std::span<const int> moe_tile_choices(WeightFormat format) {
  static constexpr int kNvfp4[] = {8, 16, 32, 64, 128, 192, 256};  // 64 and up: wgmma
  static constexpr int kDense[] = {8, 16, 32, 64};
  if (format == WeightFormat::Nvfp4) return kNvfp4;
  return kDense;
}

int64_t moe_scratch_bytes(const CudaMoeExperts& ex, int64_t n_tokens, int top_k, int tile_tokens) {
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  return 2 * kAlign + align_up(int64_t(max_work_items(ex, rows, tile_tokens)) * sizeof(MoeWorkItem)) +
         align_up(int64_t(max_work_items(ex, rows, kMinHotTokens)) * sizeof(MoeWorkItem)) +
         2 * align_up(rows * 4) + align_up(rows * ex.shape.intermediate * 2) +
         align_up(rows * ex.shape.hidden * 4);
}

MoeScratch moe_scratch_carve(const CudaMoeExperts& ex, void* base, int64_t n_tokens, int top_k,
                             int tile_tokens) {
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  auto* p = static_cast<char*>(base);
  MoeScratch s{};
  s.max_items = max_work_items(ex, rows, tile_tokens);
  s.n_items = reinterpret_cast<int*>(p);
  p += kAlign;
  s.items = reinterpret_cast<MoeWorkItem*>(p);
  p += align_up(int64_t(s.max_items) * sizeof(MoeWorkItem));
  s.max_hot_items = max_work_items(ex, rows, kMinHotTokens);
  s.n_hot_items = reinterpret_cast<int*>(p);
  p += kAlign;
  s.hot_items = reinterpret_cast<MoeWorkItem*>(p);
  p += align_up(int64_t(s.max_hot_items) * sizeof(MoeWorkItem));
  s.row_token = reinterpret_cast<int*>(p);
  p += align_up(rows * 4);
  s.pos = reinterpret_cast<int*>(p);
  p += align_up(rows * 4);
  s.h = reinterpret_cast<uint16_t*>(p);
  p += align_up(rows * ex.shape.intermediate * 2);
  s.y = reinterpret_cast<float*>(p);
  return s;
}

int64_t moe_workspace_bytes(const MoeExperts& experts, int64_t n_tokens, int top_k) {
  const CudaMoeExperts& ex = as_cuda(experts);
  if (!ex.fast) return moe_general_scratch_bytes(ex, n_tokens, top_k);
  // The smallest tile gives the most work items, so it bounds every configuration.
  return moe_scratch_bytes(ex, n_tokens, top_k, 8);
}

bool moe_fast_path(const MoeExperts& experts) { return as_cuda(experts).fast; }

void route(const Context& ctx, TensorView logits, const RoutingSpec& spec, TensorView ids,
           TensorView weights) {
  TETRA_CHECK(logits.shape.rank == 2, "moe route: logits must be [T, E]");
  const int64_t T = logits.dim(0), E = logits.dim(1);
  check_view(logits, DType::F32, T, E, "router logits");
  check_view(ids, DType::I32, T, spec.top_k, "expert ids");
  check_view(weights, DType::F32, T, spec.top_k, "expert weights");
  const float* bias = nullptr;
  if (spec.scoring == Scoring::Sigmoid && !spec.correction_bias.empty()) {
    TETRA_CHECK(spec.correction_bias.device == Device::Cuda &&
                    spec.correction_bias.dtype == DType::F32 && spec.correction_bias.numel() == E,
                "moe route: the correction bias must be F32 [E] on the CUDA device");
    bias = spec.correction_bias.as<const float>();
  }
  launch_route(kernel_launch(ctx), logits.as<const float>(), int(T), int(E),
               spec, bias, ids.as<int>(), weights.as<float>());
}

namespace {

MoeConfig heuristic_config(const CudaMoeExperts& ex, int64_t n_tokens, int top_k) {
  // Tokens an active expert sees on average under uniform routing. A wider tile decodes each
  // weight once for more tokens; a narrower one wastes fewer MMA columns on empty slots and
  // splits K inside the block (tiles 8 and 16). Thresholds from the H200 sweep in docs/PERF.md.
  const int64_t rows = n_tokens * (top_k + (ex.shape.shared_expert ? 1 : 0));
  const double per_expert = double(rows) / double(std::min<int64_t>(ex.n_stored(), rows));
  MoeConfig c;
  c.tile_tokens = per_expert <= 6 ? 8 : per_expert <= 12 ? 16 : per_expert <= 48 ? 32 : 64;
  if (ex.format == WeightFormat::Nvfp4 && per_expert > 96)
    c.tile_tokens = per_expert <= 128 ? 128 : per_expert <= 192 ? 192 : 256;
  c.why = str_cat("heuristic: ", per_expert, " tokens per active expert");
  return c;
}

std::string tune_key(const Context& ctx, const CudaMoeExperts& ex, int64_t n_tokens, int top_k) {
  const std::string gpu = ctx.props && !ctx.props->name.empty() ? ctx.props->name : "unnamed GPU";
  // v2: the fused decode kernel joined the candidates; v3: the hot tiles. Older entries are retuned.
  return str_cat("v3|", gpu, "|", ex.format == WeightFormat::Nvfp4 ? "nvfp4" : "bf16", "|H", ex.shape.hidden,
                 "|I", ex.shape.intermediate, "|E", ex.n_stored(), "|k", top_k, "|T",
                 moe_token_bucket(n_tokens));
}

void enqueue_layer(const KernelLaunch& launch, const CudaMoeExperts& ex, TensorView x, TensorView ids,
                   TensorView weights, TensorView out, const MoeScratch& s, const MoeConfig& config) {
  const int64_t T = x.dim(0);
  const int top_k = int(ids.dim(1));
  if (config.fused)
    return launch_moe_decode(launch, ex, x.as<const uint16_t>(), ids.as<const int>(), weights.as<const float>(),
                             int(T), top_k, s, out.as<uint16_t>());
  const int tile_tokens = config.tile_tokens, hot = config.hot_tokens;
  launch_permute(launch, ids.as<const int>(), int(T), top_k, int(ex.first_expert()), ex.shape.n_experts,
                 ex.shape.shared_expert, tile_tokens, hot, s);
  launch_gate_up(launch, ex, x.as<const uint16_t>(), s, tile_tokens);
  if (hot) launch_gate_up(launch, ex, x.as<const uint16_t>(), s.hot(), hot);
  launch_down(launch, ex, s, tile_tokens);
  if (hot) launch_down(launch, ex, s.hot(), hot);
  launch_combine(launch, s.y, s.pos, weights.as<const float>(), int(T), top_k,
                 ex.shape.shared_expert, int(ex.shape.hidden), out.as<uint16_t>());
}

// Times the heuristic's tile and its neighbours on this call's inputs (one warm-up, best of
// three) and records the fastest. Leaves `out` holding a correct result.
MoeConfig tune(const Context& ctx, const CudaMoeExperts& ex, TensorView x, TensorView ids,
               TensorView weights, TensorView out, const std::string& key) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TETRA_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(ctx.stream), &capturing));
  TETRA_CHECK(capturing == cudaStreamCaptureStatusNone, "moe: tuning times the stream; it cannot run under capture");
  const int64_t T = x.dim(0);
  const int top_k = int(ids.dim(1));
  const std::span<const int> tiles = moe_tile_choices(ex.format);
  const int h = heuristic_config(ex, T, top_k).tile_tokens;
  const int hi = int(std::find(tiles.begin(), tiles.end(), h) - tiles.begin());
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  cudaEvent_t e0, e1;
  TETRA_CUDA_CHECK(cudaEventCreate(&e0));
  TETRA_CUDA_CHECK(cudaEventCreate(&e1));
  // The heuristic's tile and its neighbours, and the fused kernel where it takes the call (never
  // the heuristic's own pick: on the H200 it streams at about half the rate of the tiles of 8,
  // docs/PERF.md).
  std::vector<MoeConfig> candidates;
  for (int i = std::max(hi - 1, 0); i <= std::min(hi + 1, int(tiles.size()) - 1); ++i)
    candidates.push_back(MoeConfig{tiles[i]});
  // Where the narrow tiles run, the same with a wider one for the experts they would read
  // several times (up to 64: beyond, the heuristic has already left the narrow tiles). Up to 8
  // tokens no expert has more rows than a tile of 8, so there is nothing to time.
  if (h <= 16 && T > 8)
    for (int hot : tiles)
      if (hot > 8 && hot <= 64) candidates.push_back(MoeConfig{.tile_tokens = 8, .hot_tokens = hot});
  if (moe_decode_takes(ex, T, top_k)) candidates.push_back(MoeConfig{8, false, "", true});
  MoeConfig best;
  float best_ms = 0;
  std::string report;
  for (const MoeConfig& c : candidates) {
    const MoeScratch s = moe_scratch_carve(ex, ctx.workspace.data, T, top_k, c.tile_tokens);
    enqueue_layer(kernel_launch(ctx), ex, x, ids, weights, out, s, c);
    float ms = 1e30f;
    for (int r = 0; r < 3; ++r) {
      TETRA_CUDA_CHECK(cudaEventRecord(e0, stream));
      enqueue_layer(kernel_launch(ctx), ex, x, ids, weights, out, s, c);
      TETRA_CUDA_CHECK(cudaEventRecord(e1, stream));
      TETRA_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      TETRA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms = std::min(ms, t);
    }
    report += str_cat(report.empty() ? "" : ", ", c.str(), " ", int(ms * 1000), " us");
    if (best.tile_tokens == 0 || ms < best_ms) best = c, best_ms = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  best.why = str_cat("fastest at T=", T, " of ", report);
  ex.tuner->store(key, best);
  // Leave the chosen configuration's result in `out` (the last run was another's).
  const MoeScratch s = moe_scratch_carve(ex, ctx.workspace.data, T, top_k, best.tile_tokens);
  enqueue_layer(kernel_launch(ctx), ex, x, ids, weights, out, s, best);
  return *ex.tuner->find(key);
}

}  // namespace

MoeConfig pick_moe_config(const Context& ctx, const MoeExperts& experts, int64_t n_tokens, int top_k) {
  const auto& ex = as_cuda(experts);
  if (ex.tuner)
    if (auto c = ex.tuner->find(tune_key(ctx, ex, n_tokens, top_k))) return *c;
  return heuristic_config(ex, n_tokens, top_k);
}

bool moe_tuned(const Context& ctx, const MoeExperts& experts, int64_t n_tokens, int top_k) {
  const auto& ex = as_cuda(experts);
  return ex.tuner && ex.tuner->find(tune_key(ctx, ex, n_tokens, top_k)).has_value();
}

namespace {

// The checks moe_experts and tune_moe share; the number of tokens.
int64_t check_moe_call(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                       const CudaMoeExperts& ex, TensorView out) {
  const int64_t H = ex.shape.hidden;
  TETRA_CHECK(x.shape.rank == 2 && ids.shape.rank == 2, "moe: x must be [T, H], ids [T, k]");
  const int64_t T = x.dim(0);
  const int top_k = int(ids.dim(1));
  check_view(x, DType::BF16, T, H, "x");
  check_view(ids, DType::I32, T, top_k, "expert ids");
  check_view(weights, DType::F32, T, top_k, "expert weights");
  check_view(out, DType::BF16, T, H, "out");
  // Not bounded by this object's experts: under expert parallelism a rank may hold fewer
  // experts than a token picks.
  TETRA_CHECK(top_k >= 1 && top_k <= kMaxTopK, "moe: top_k must be in 1..", kMaxTopK, ", not ", top_k);
  TETRA_CHECK(T * (top_k + 1) < (int64_t(1) << 31), "moe: too many tokens for one call");
  const int64_t need = moe_workspace_bytes(ex, T, top_k);
  TETRA_CHECK(T == 0 || (ctx.workspace.data && ctx.workspace.bytes >= need), "moe: the workspace holds ",
              ctx.workspace.bytes, " bytes, ", need, " are needed (moe_workspace_bytes)");
  return T;
}

}  // namespace

MoeConfig tune_moe(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                   const MoeExperts& experts, TensorView out) {
  const auto& ex = as_cuda(experts);
  const int64_t T = check_moe_call(ctx, x, ids, weights, ex, out);
  const int top_k = int(ids.dim(1));
  if (!ex.tuner || !ex.fast || T == 0) return pick_moe_config(ctx, experts, T, top_k);
  return tune(ctx, ex, x, ids, weights, out, tune_key(ctx, ex, T, top_k));
}

void moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                 const MoeExperts& experts, TensorView out, MoeConfig config) {
  const auto& ex = as_cuda(experts);
  const int64_t T = check_moe_call(ctx, x, ids, weights, ex, out);
  const int top_k = int(ids.dim(1));
  if (T == 0) return;
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (!ex.fast) {
    TETRA_CHECK(config.tile_tokens == 0, "moe: experts of hidden size ", ex.shape.hidden, " and intermediate size ",
                ex.shape.intermediate, " run on the general path, which takes no tile");
    launch_moe_general(stream, ex, x.as<const uint16_t>(), ids.as<const int>(), weights.as<const float>(), int(T),
                       top_k, ctx.workspace.data, out.as<uint16_t>());
    return;
  }
  if (config.tile_tokens == 0) config = pick_moe_config(ctx, experts, T, top_k);
  const std::span<const int> tiles = moe_tile_choices(ex.format);
  TETRA_CHECK(std::find(tiles.begin(), tiles.end(), config.tile_tokens) != tiles.end(), "moe: tile_tokens ",
              config.tile_tokens, " is not one the kernels take for ",
              ex.format == WeightFormat::Nvfp4 ? "NVFP4" : "BF16", " experts");
  TETRA_CHECK(config.hot_tokens == 0 || (!config.fused && config.hot_tokens > config.tile_tokens &&
                                          std::find(tiles.begin(), tiles.end(), config.hot_tokens) != tiles.end()),
              "moe: hot_tokens ", config.hot_tokens, " must be a tile the kernels take, wider than tile_tokens ",
              config.tile_tokens, ", and not with the fused kernel");
  TETRA_CHECK(!config.fused || (config.tile_tokens == 8 && moe_decode_takes(ex, T, top_k)),
              "moe: the fused decode kernel takes NVFP4 experts with hidden and intermediate sizes that are ",
              "multiples of 256 and at most ", kMoeDecodeMaxTokens, " tokens (", kMoeDecodeMaxRows,
              " token-expert rows), in items of 8 tokens; not H ", ex.shape.hidden, ", I ", ex.shape.intermediate,
              ", T ", T, ", top-k ", top_k, ", tile_tokens ", config.tile_tokens);
  const MoeScratch s = moe_scratch_carve(ex, ctx.workspace.data, T, top_k, config.tile_tokens);
  enqueue_layer(kernel_launch(ctx), ex, x, ids, weights, out, s, config);
}

}  // namespace tetra::ops::cuda

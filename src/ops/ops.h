// The backend interface: every op a model's forward pass needs, over ragged batches of tokens
// drawn from many sequences at once. Models are written once against this header; the CPU
// backend (ops/cpu) is the fp32 reference and the CUDA backend (ops/cuda) the fast path.
//
// Conventions
// - Activations are row-major [T, ...] with one row per token of the batch (T = sum of the
//   tokens every sequence contributes this step).
// - Dtype contracts: activations are in the backend's activation_dtype() (F32 on the CPU,
//   BF16 on CUDA). `linear` may also write F32 (router logits, lm_head). Router logits and
//   route's weights are F32; ids are I32. Norms, rope and softmax compute in F32 inside
//   whatever they store. The KV cache has a dtype of its own, kv_dtype().
// - Weights stay in their stored dtype (BF16, F16, F32, NVFP4, FP8) and are decoded inside
//   the op; a backend never expands a whole layer to a wider type.
// - Tensors passed to an op live on the backend's device. Nothing inside an op waits on the
//   host: metadata (positions, slots, block tables) is uploaded once per step by the caller.
// - Every op takes an explicit Context (stream, thread pool, step arena, device properties,
//   the rank's communicator, whether CUDA kernels launch with PDL), passed down by the caller;
//   ops never read the environment or query the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace tetra::ops {

struct DeviceProps {
  std::string name;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t max_smem_per_block = 0;
  int cc_major = 0, cc_minor = 0;
};

// Scratch memory an op may use for the duration of one call.
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
};

class Arena;
class Communicator;

// What an op may use besides its arguments. Passed explicitly; there are no globals.
struct Context {
  void* stream = nullptr;          // cudaStream_t on the CUDA backend, null on the CPU
  ThreadPool* pool = nullptr;      // worker threads of the CPU backend
  Arena* arena = nullptr;          // this step's scratch: models and ops take buffers here
  Workspace workspace;             // raw kernel entry points only (benchmarks); ops use arena
  const DeviceProps* props = nullptr;
  Communicator* comm = nullptr;    // this rank's collectives (ops/communicator.h); null: one rank
  // CUDA: the backend's own kernels launch with programmatic dependent launch (each may start
  // while the one before it drains; ops/cuda/launch.cuh). Set by the backend where the device
  // has it (compute capability 9.0 and up) unless --disable-pdl; results are the same either way.
  bool pdl = false;
};

enum class WeightFormat : uint8_t {
  Dense,  // weight BF16/F16/F32 [n_out, n_in]
  Nvfp4,  // weight U8 [n_out, n_in/2], 2 e2m1 codes a byte, low nibble = even index;
          // block_scale F8_E4M3 [n_out, n_in/16]; W = e2m1 * f32(block_scale) * global_scale
  Fp8,    // weight F8_E4M3 [n_out, n_in]; W = f32(e4m3) * global_scale (per-tensor scale)
};

// A linear layer y = x W^T (+ bias), W of shape [n_out, n_in], kept as it is stored.
struct LinearWeight {
  WeightFormat format = WeightFormat::Dense;
  int64_t n_out = 0, n_in = 0;
  TensorView weight;
  TensorView block_scale;    // Nvfp4 only
  float global_scale = 1.0f; // Nvfp4: weight_scale_2; Fp8: weight_scale
  float input_scale = 0.0f;  // static activation scale of W4A4 checkpoints; 0 when absent
  TensorView bias;           // optional [n_out]
};

// One gated MLP: down(silu(gate(x)) * up(x)).
// One linear of a Backend::linears call.
struct LinearPart {
  const LinearWeight* weight;
  TensorView out;
};

struct MlpWeights {
  LinearWeight gate, up, down;
};

enum class Scoring : uint8_t { Softmax, Sigmoid };

// How router logits become each token's experts and weights (FORMATS.md §2.2).
struct RoutingSpec {
  Scoring scoring = Scoring::Softmax;
  int top_k = 0;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  int n_group = 1, topk_group = 1;  // sigmoid routing: keep the best topk_group of n_group groups
  TensorView correction_bias;       // F32 [E], sigmoid routing only; used for selection alone
};

// Routed experts prepared by a backend for its MoE kernels (the CPU keeps views of the
// checkpoint; the CUDA backend packs them into its own layout).
class MoeExperts {
 public:
  virtual ~MoeExperts() = default;
  virtual int64_t n_experts() const = 0;
  // Under expert parallelism a rank holds the layer's experts [first_expert, first_expert +
  // n_experts()); moe_experts takes the router's ids, and an id outside that range adds nothing.
  int64_t first_expert() const { return first_expert_; }
  // Virtual for a backend whose experts object wraps the one its kernels read.
  virtual void set_first_expert(int64_t e) { first_expert_ = e; }

 private:
  int64_t first_expert_ = 0;
};

// Where a batch's tokens sit and which cache slots they read and write. Token t of sequence
// s attends to the cached keys at positions 0 .. positions[t] of s (the step's own keys are
// written first, so prefix-cached context, prompt chunks and decodes read one layout).
struct AttentionBatch {
  int n_tokens = 0;
  int n_seqs = 0;
  int block_size = 0;           // tokens per KV block
  int max_blocks_per_seq = 0;   // row length of block_tables (fixed: the longest context)
  int max_query_len = 0;        // host copies of the batch's extremes, for planning grids
  int max_seq_len = 0;
  TensorView positions;         // I32 [T]: position of each token in its sequence
  TensorView slot_mapping;      // I32 [T]: cache slot (block * block_size + offset) it writes;
                                // -1 for padding tokens, which write nothing
  TensorView seq_starts;        // I32 [S+1]: tokens [seq_starts[s], seq_starts[s+1]) are sequence s
  TensorView seq_lens;          // I32 [S]: tokens of s in the cache once this step is written
  TensorView block_tables;      // I32 [S, max_blocks_per_seq]: the KV blocks of each sequence
};

// One layer of a paged KV cache, each tensor [n_blocks, block_size, n_kv_heads, dim].
// GQA: k and v per KV head. MLA: k holds each token's compressed latent and its rope key
// ([.., 1, kv_lora_rank + qk_rope_head_dim]), v is empty, and index_k holds the DSA
// indexer's key ([.., 1, index_head_dim]) where the layer has an indexer.
// The tensors are in the backend's kv_dtype(). With an F8_E4M3 cache (--kv-cache-dtype
// fp8_e4m3) a GQA value x is stored as e4m3(x / k_scale) (keys) or e4m3(x / v_scale) (values),
// round-to-nearest-even saturating at 448, and read back as f32(e4m3) * scale: vLLM's per-tensor
// k_scale / v_scale (model::KvLayerShape: a GQA checkpoint's, else 1.0). MLA's latent rows and the DSA index
// keys (written by cache_write, which takes no scale) are stored at scale 1.
struct KvCacheLayer {
  TensorView k, v;
  TensorView index_k;
  float k_scale = 1.0f, v_scale = 1.0f;
};

struct RopeSpec {
  TensorView inv_freq;            // F32 [rotary_dim / 2]
  float attention_scaling = 1.0f; // YaRN multiplies cos and sin by this
  int rotary_dim = 0;             // the first rotary_dim of each head are rotated
  bool interleaved = false;       // pairs (2i, 2i+1) (GPT-J) instead of (i, i + rotary_dim/2)
};

// How one row of logits becomes a token (Backend::sample). Every backend draws the same way
// (the rule is written out in ops/cpu/sampling.h, the reference): penalties, then greedy or
// temperature over the tokens that survive top-k and top-p, with one uniform from
// Philox4x32-10 keyed by `seed` at counter `position`, so a token depends on its sequence
// alone, never on the batch around it or on earlier draws.
struct SamplingRow {
  float temperature = 0.0f;    // 0: greedy (the first maximum)
  float top_p = 1.0f;          // (0, 1]
  int32_t top_k = 0;           // 0: every token
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 0; 1: off
  int32_t n_top_logprobs = 0;  // 0 .. kMaxTopLogprobs alternatives reported
  int32_t penalty_begin = 0;   // this row's entries of the penalty lists
  int32_t penalty_count = 0;
  int32_t pad = 0;             // seed starts 8-byte aligned, and no byte uploaded is unset
  uint64_t seed = 0;
  int64_t position = 0;        // the index in its sequence of the token being drawn
};
static_assert(sizeof(SamplingRow) == 56 && offsetof(SamplingRow, seed) % 8 == 0,
              "SamplingRow is uploaded as raw bytes");

inline constexpr int kMaxTopLogprobs = 20;

// What Backend::sample writes per row. Log-probs are natural logs under the model's own
// distribution (log_softmax of the raw logits, before penalties and temperature).
struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t n_top = 0;                   // entries of top_* in use, best first
  int32_t pad = 0;
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};
static_assert(sizeof(SampledToken) == 176, "SampledToken is downloaded as raw bytes");

// Memory of the backend's device: free and total bytes (0 when unknown, as on the CPU).
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// How a dummy weight is drawn (--load-format dummy): never zeros.
struct RandomFill {
  enum Kind : uint8_t {
    Normal,      // N(0, scale^2): weights
    NearOne,     // 1 + N(0, scale^2): norm weights
    Bytes,       // bytes uniform in [lo, lo + span): NVFP4 codes and E4M3 scales
  } kind = Normal;
  float scale = 0.02f;
  int lo = 0, span = 256;
};

// Dummy NVFP4 weights: random codes, E4M3 block scales in [0.5, 0.94] (bytes 0x30..0x37) and
// this global scale give weights of standard deviation about 0.02, as a trained layer has.
inline constexpr int kDummyNvfp4ScaleLo = 0x30, kDummyNvfp4ScaleSpan = 8;
inline constexpr float kDummyNvfp4GlobalScale = 0.0095f;

// The routed experts of one MoE layer, described without their weights (dummy loading).
struct ExpertsSpec {
  int64_t hidden = 0, intermediate = 0;
  int n_experts = 0;
  WeightFormat format = WeightFormat::Dense;
  bool shared_expert = false;  // one more expert of the same shape that every token uses
};

// An owning device buffer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual TensorView view() const = 0;
};

// Device work recorded once and replayed with one launch (a CUDA graph). It replays the same
// kernels with the same arguments: what it reads must sit at the addresses it was recorded
// with (the step builder's buffers, the step arena, the KV cache, the weights).
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay(const Context& ctx) = 0;
  virtual int64_t n_nodes() const = 0;  // kernels and copies one replay runs
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;
  // The backend's default context (its stream, pool and properties; no arena). Callers copy
  // it, set the arena and pass the copy down.
  virtual Context& context() = 0;
  // The element type the backend keeps activations in, and the one of its KV cache.
  virtual DType activation_dtype() const = 0;
  virtual DType kv_dtype() const = 0;

  // ---- memory ----
  virtual std::unique_ptr<Buffer> alloc(DType dtype, Shape shape) = 0;
  // Host memory the device copies from and to without staging (pinned on CUDA).
  virtual std::unique_ptr<Buffer> alloc_host(int64_t bytes) = 0;
  virtual void copy_from_host(TensorView dst, const void* src) = 0;
  // Ordered on ctx's stream; `src` must stay unchanged until the stream has passed the copy.
  virtual void copy_from_host_async(const Context& ctx, TensorView dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, TensorView src) = 0;
  virtual void fill_zero(TensorView dst) = 0;
  virtual MemoryInfo memory_info() const = 0;
  // Makes a checkpoint weight (host view, usually mmap'd) usable by this backend's ops. The
  // result stays valid while the backend and the source mapping live. Uploads may be queued:
  // synchronize() before the host memory goes away.
  virtual LinearWeight upload(const LinearWeight& host) = 0;
  virtual TensorView upload(TensorView host) = 0;
  // Packs one layer's routed experts (host views of the checkpoint: read straight from the
  // mapping, never uploaded first) and its optional shared expert for moe_experts.
  virtual std::unique_ptr<MoeExperts> prepare_experts(const std::vector<MlpWeights>& experts,
                                                      const MlpWeights* shared) = 0;
  // Dummy weights (--load-format dummy), drawn on the device from `seed`.
  virtual std::unique_ptr<Buffer> random_tensor(DType dtype, Shape shape, const RandomFill& fill,
                                                uint64_t seed) = 0;
  virtual std::unique_ptr<MoeExperts> random_experts(const ExpertsSpec& spec, uint64_t seed) = 0;
  // Before serving (after the weights, before the measuring pass): tunes what the backend
  // tunes, e.g. the MoE tiles of every expert shape for token counts up to max_tokens. Ops
  // never tune inside a forward.
  virtual void warm_up(const Context& ctx, const std::vector<const MoeExperts*>& experts, int top_k,
                       int64_t max_tokens) = 0;
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() = 0;
  // Makes this backend's device the calling thread's current one (CUDA: cudaSetDevice), for
  // the thread of a rank (--tp/--ep) that drives it; a no-op on the CPU.
  virtual void make_current() {}
  // Records what `body` enqueues on ctx's stream, without running it, into a Graph; null
  // where the backend has no graphs (the CPU). `body` must not synchronize or allocate.
  virtual std::unique_ptr<Graph> capture(const Context& ctx, const std::function<void()>& body) {
    (void)ctx, (void)body;
    return nullptr;
  }

  // ---- ops ----
  // Norm weights and biases, and rope's inverse frequencies, are the model's: fixed since load.
  // A CUDA kernel reads them while the kernel before it may still be running (launch.cuh), so
  // they must not be the output of the op just before.
  // out[t] = table[ids[t]]; table [V, H] in its stored dtype, ids I32 [T].
  virtual void embedding(const Context& ctx, TensorView table, TensorView ids, TensorView out) = 0;
  // Over the last dimension of x [R, D]: out = weight * x / sqrt(mean(x^2) + eps).
  virtual void rms_norm(const Context& ctx, TensorView x, TensorView weight, float eps,
                        TensorView out) = 0;
  // The residual step of a decoder layer in one pass: h += delta (rounded to h's dtype, as
  // add rounds it), then out = rms_norm(h). Equal to add then rms_norm, which is the default.
  virtual void add_rms_norm(const Context& ctx, TensorView h, TensorView delta, TensorView weight, float eps,
                            TensorView out) {
    add(ctx, h, delta, h);
    rms_norm(ctx, h, weight, eps, out);
  }
  // Over the last dimension: out = (x - mean) / sqrt(var + eps) * weight + bias.
  virtual void layer_norm(const Context& ctx, TensorView x, TensorView weight, TensorView bias,
                          float eps, TensorView out) = 0;
  // out [T, n_out] = x [T, n_in] W^T (+ bias).
  virtual void linear(const Context& ctx, TensorView x, const LinearWeight& w, TensorView out) = 0;
  // Several linears of one input (q, k and v; gate and up): out_i = x W_i^T (+ bias_i), each
  // exactly as linear computes it, in one launch where the backend can. The default runs them
  // one by one.
  virtual void linears(const Context& ctx, TensorView x, std::span<const LinearPart> parts) {
    for (const LinearPart& p : parts) linear(ctx, x, *p.weight, p.out);
  }
  // Rotates the first rotary_dim of every head of x [T, n_heads, head_dim] in place.
  virtual void rope(const Context& ctx, TensorView x, TensorView positions, const RopeSpec& rope) = 0;
  // Writes k [T, n_kv_heads, d_k] and v [T, n_kv_heads, d_v] to their slots of the cache.
  virtual void kv_write(const Context& ctx, TensorView k, TensorView v, const AttentionBatch& batch,
                        const KvCacheLayer& cache) = 0;
  // Writes rows [T, ...] to their slots of one cache tensor [n_blocks, block_size, ...].
  virtual void cache_write(const Context& ctx, TensorView rows, const AttentionBatch& batch,
                           TensorView cache) = 0;
  // MLA's attention inputs in one pass (FORMATS.md §2): q [T, H, dn + dr] splits into q_nope
  // [T, H, dn] and q_rope [T, H, dr], the latter rotated at the batch's positions; the cache
  // entry ckv [T, rank + dr] takes the RMSNorm of its latent (weight kv_norm [rank]) and the
  // rotation of its last dr values, in place, and goes to `cache` at the batch's slots. Equal
  // to copy_columns, rms_norm, rope and cache_write in turn, which is the default (backend.cpp).
  // kv_norm and rope's frequencies are fixed since load.
  virtual void mla_rope_cache_write(const Context& ctx, TensorView q, TensorView q_nope, TensorView q_rope,
                                    TensorView ckv, TensorView kv_norm, float eps, const RopeSpec& rope_spec,
                                    const AttentionBatch& batch, TensorView cache);
  // The attention inputs' last step in one pass: each head of q [T, H, D] and k [T, KV, D]
  // takes its RMSNorm where q_norm and k_norm are given (the qk-norm families), then rope at
  // the batch's positions, in place; then k and v go to the cache at the batch's slots. Equal
  // to rms_norm, rope and kv_write in turn, which is the default.
  virtual void qk_norm_rope_kv_write(const Context& ctx, TensorView q, TensorView k, TensorView v,
                                     TensorView q_norm, TensorView k_norm, float eps, const RopeSpec& rope_spec,
                                     const AttentionBatch& batch, const KvCacheLayer& cache) {
    if (!q_norm.empty()) {
      rms_norm(ctx, q, q_norm, eps, q);
      rms_norm(ctx, k, k_norm, eps, k);
    }
    rope(ctx, q, batch.positions, rope_spec);
    rope(ctx, k, batch.positions, rope_spec);
    kv_write(ctx, k, v, batch, cache);
  }
  // Causal attention of q [T, n_heads, d_k] over the cached keys of each token's sequence up
  // to its own position; heads share KV heads in groups (GQA). out [T, n_heads, d_v].
  virtual void attention(const Context& ctx, TensorView q, const KvCacheLayer& cache,
                         const AttentionBatch& batch, float scale, TensorView out) = 0;
  // MLA attention in the latent space (weights absorbed): for each token t and head h,
  //   score_j = scale * (q_latent[t,h] . c_j + q_rope[t,h] . r_j)
  // over the cached latents c_j and rope keys r_j of t's sequence up to t's position (only
  // the positions in `selected` [T, k] (I32, -1 = unused) when given: the DSA top-k), and
  // out[t,h] = sum_j softmax(score)_j c_j. q_latent/out [T, H, kv_lora_rank], q_rope [T, H, d_rope].
  virtual void mla_attention(const Context& ctx, TensorView q_latent, TensorView q_rope,
                             const KvCacheLayer& cache, const AttentionBatch& batch, float scale,
                             TensorView selected, TensorView out) = 0;
  // The DSA indexer's choice of keys: for token t, over the cached index keys k_j of its
  // sequence up to its position,
  //   score_j = sum_h weights[t,h] * weight_scale * relu(q_scale * q[t,h] . k_j),
  // and `selected` [T, top_k] (I32) gets the positions of the top_k best, -1 past the keys there are.
  virtual void dsa_select(const Context& ctx, TensorView q, TensorView weights,
                          const KvCacheLayer& cache, const AttentionBatch& batch, float q_scale,
                          float weight_scale, TensorView selected) = 0;
  // Per head h of x [T, H, n]: a block of rows of W [H * head_stride, k] starting at
  // h * head_stride + row0, n_rows long: out[t,h] = rows @ x[t,h] (x width k, out width n_rows)
  // or, transposed, rows^T @ x[t,h] (x width n_rows, out width k). MLA absorbs kv_b_proj so.
  virtual void head_linear(const Context& ctx, TensorView x, const LinearWeight& w,
                           int64_t head_stride, int64_t row0, int64_t n_rows, bool transposed,
                           TensorView out) = 0;
  // dst[:, dst_col0 : dst_col0 + n] = src[:, src_col0 : src_col0 + n]; both 2-D with equal rows.
  virtual void copy_columns(const Context& ctx, TensorView src, int64_t src_col0, TensorView dst,
                            int64_t dst_col0, int64_t n) = 0;
  // out = silu(gate) * up, all [T, I].
  virtual void silu_mul(const Context& ctx, TensorView gate, TensorView up, TensorView out) = 0;
  // out = a + b (same shapes; out may alias a).
  virtual void add(const Context& ctx, TensorView a, TensorView b, TensorView out) = 0;
  // Chooses top_k experts per token from router logits [T, E] (F32):
  // ids I32 [T, top_k], weights F32 [T, top_k].
  virtual void route(const Context& ctx, TensorView logits, const RoutingSpec& spec, TensorView ids,
                     TensorView weights) = 0;
  // out [T, H] = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) (+ shared(x[t]) when the
  // experts were prepared with a shared expert), over the ids `experts` holds (first_expert).
  virtual void moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                           const MoeExperts& experts, TensorView out) = 0;
  // out [R, D] = x[rows[r]] for rows I32 [R].
  virtual void gather_rows(const Context& ctx, TensorView x, TensorView rows, TensorView out) = 0;
  // One token per row of logits F32 [R, V]: rows U8 [R * sizeof(SamplingRow)] (SamplingRow
  // records), penalty_ids / penalty_counts I32 [P] (for each row, at [penalty_begin,
  // penalty_begin + penalty_count), the distinct tokens its penalties touch, each with how
  // often it was generated: 0 for a token of the prompt alone, which only the repetition
  // penalty reads), out U8 [R * sizeof(SampledToken)].
  virtual void sample(const Context& ctx, TensorView logits, TensorView rows,
                      TensorView penalty_ids, TensorView penalty_counts, TensorView out) = 0;
};

// Scratch for one step: a bump allocator over the backend's memory. The caller resets it
// before each forward; everything handed out is then free again. Until frozen it grows (a new
// chunk when the current one is full; at the next reset one chunk of the peak replaces them),
// so a measuring pass at the largest step sizes it; frozen, its buffer never moves and a step
// that needs more is an error.
class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  TensorView alloc(DType dtype, Shape shape);
  // What is allocated after mark() is free again at rewind(mark): a model's layer loop frees
  // each layer's scratch, so a step holds one layer's, not every layer's. Reuse within a step
  // is safe in stream order: each kernel waits for the one before it before it writes.
  int64_t mark() const { return used_; }
  void rewind(int64_t mark);
  void reset();
  void freeze();
  bool frozen() const { return frozen_; }
  int64_t used_bytes() const { return used_; }
  int64_t peak_bytes() const { return peak_; }
  int64_t capacity_bytes() const;

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<Buffer>> chunks_;
  int64_t offset_ = 0;  // in the last chunk
  int64_t used_ = 0;    // this step, over all chunks
  int64_t peak_ = 0;
  bool frozen_ = false;
};

// kv_dtype: F32 (the default, `auto`) or F8_E4M3. moe_activation_dtype: F32 (`auto`) or
// F8_E4M3 (W4A8: NVFP4 experts take E4M3 activations; ops/cpu/w4a8.cpp).
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0, DType kv_dtype = DType::F32,
                                          DType moe_activation_dtype = DType::F32);

// The backend a command runs on (--device): "cpu", "cuda", or "auto" (cuda where a GPU
// answers, else cpu).
struct BackendOptions {
  std::string device = "auto";
  int n_threads = 0;             // CPU worker threads (0: every core)
  int device_index = 0;          // CUDA device
  std::string moe_tune_cache;    // the MoE tuning cache file ("" keeps tunings in memory)
  bool moe_autotune = true;      // time the MoE tiles at warm-up (else the heuristic decides)
  bool pdl = true;               // CUDA: programmatic dependent launch where the device has it
  // --kv-cache-dtype: none is `auto` (the backend's own: F32 on the CPU, BF16 on CUDA);
  // F8_E4M3 is `fp8_e4m3`.
  std::optional<DType> kv_cache_dtype;
  // --moe-activation-dtype: none is `auto` (the activations' own dtype, W4A16 for NVFP4
  // experts); F8_E4M3 runs NVFP4 experts as W4A8 (the CPU reference only so far).
  std::optional<DType> moe_activation_dtype;
};
// The value of a flag that takes auto or fp8_e4m3 (--kv-cache-dtype, --moe-activation-dtype):
// "auto" -> none, "fp8_e4m3" or vLLM's alias "fp8" -> F8_E4M3; any other text is one sentence
// naming `flag`.
std::optional<DType> parse_auto_or_fp8(const std::string& text, const std::string& flag);
// Throws one sentence when the device asked for is not there (e.g. cuda without a GPU or
// in a build without CUDA).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
// True when this build has the CUDA backend and a CUDA device answers.
bool cuda_device_available();
// The CUDA devices that answer (0 without them, or in a build without CUDA).
int cuda_device_count();

}  // namespace tetra::ops

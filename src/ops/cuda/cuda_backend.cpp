// ops::Backend on one GPU: argument checks and dispatch to the op families (elementwise,
// norm, rope, kv_write, linear / gemm_dense, attention_gqa, attention_mla, moe, sampling). Scratch comes
// from the caller's step arena; weights from the weight arena; no op synchronizes.
#include "ops/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "core/log.h"
#include "ops/cuda/attention_gqa.h"
#include "ops/cuda/attention_mla.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_memory.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/gemm_dense.h"
#include "ops/cuda/gemm_skinny.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kv_write.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/linear.h"
#include "ops/cuda/linear_path.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_tune.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/qk_rope_kv.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/sampling.h"

namespace tetra::ops::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

TensorView scratch(const Context& ctx, int64_t bytes, const char* op) {
  TETRA_CHECK(ctx.arena, op, " on CUDA takes its scratch from the step arena; the context has none");
  return ctx.arena->alloc(DType::U8, {std::max<int64_t>(bytes, 1)});
}

void check_device(const TensorView& t, const char* op, const char* what) {
  TETRA_CHECK(t.empty() || t.device == Device::Cuda, op, ": ", what, " is not on the CUDA device");
}

// One MoE layer's experts on the device: the routed experts (with the shared expert fused in
// when it has their width), or a shared expert of another width run as a plain MLP after.
// Under --tp a rank's share of the routed experts' width may be empty (experts narrower than
// the ranks' NVFP4 granules): then there are none to run, and they add nothing.
class LayerExperts final : public MoeExperts {
 public:
  LayerExperts(std::unique_ptr<MoeExperts> routed, int64_t n_experts, std::optional<MlpWeights> separate_shared)
      : routed_(std::move(routed)), n_experts_(n_experts), shared_(std::move(separate_shared)) {}
  int64_t n_experts() const override { return n_experts_; }
  void set_first_expert(int64_t e) override {
    MoeExperts::set_first_expert(e);
    if (routed_) routed_->set_first_expert(e);  // the kernels read the routed experts' own
  }
  const MoeExperts* routed() const { return routed_.get(); }
  const MlpWeights* separate_shared() const { return shared_ ? &*shared_ : nullptr; }

 private:
  std::unique_ptr<MoeExperts> routed_;  // null: this rank's share of their width is empty
  int64_t n_experts_;
  std::optional<MlpWeights> shared_;
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, int64_t n_nodes) : exec_(exec), n_nodes_(n_nodes) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  void replay(const Context& ctx) override { TETRA_CUDA_CHECK(cudaGraphLaunch(exec_, stream_of(ctx))); }
  int64_t n_nodes() const override { return n_nodes_; }

 private:
  cudaGraphExec_t exec_;
  int64_t n_nodes_;
};

// Thread-local capture: a call on this thread that would synchronize or allocate (which a
// replay could not repeat) fails the capture instead of slipping into it.
std::unique_ptr<Graph> capture_graph(cudaStream_t stream, const std::function<void()>& body) {
  TETRA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);  // leaves the stream usable again
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  TETRA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t n_nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &n_nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TETRA_CUDA_CHECK(err);
  auto out = std::make_unique<CudaGraph>(exec, int64_t(n_nodes));
  // Uploaded now, at startup, rather than by its first launch: that launch may come while
  // another rank's graph waits in a collective for this one, and the upload is work the driver
  // does for the device, which a spinning kernel may hold up (a precaution: parallel/ has the
  // hazards of spinning collectives).
  TETRA_CUDA_CHECK(cudaGraphUpload(exec, stream));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : device_(o.device_index), kv_dtype_(o.kv_dtype), tuner_(o.moe_tune_cache), autotune_(o.moe_autotune) {
    TETRA_CHECK(kv_dtype_ == DType::BF16 || kv_dtype_ == DType::F8_E4M3, "the CUDA backend's KV cache is BF16 or ",
                "F8_E4M3, not ", dtype_name(kv_dtype_));
    TETRA_CUDA_CHECK(cudaSetDevice(device_));
    props_ = device_props(device_);
    TETRA_CHECK(props_.cc_major == 9 && props_.cc_minor == 0, "the CUDA backend is built for Hopper (sm_90a); ",
                props_.name, " is compute capability ", props_.cc_major, ".", props_.cc_minor);
    TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ctx_.stream = stream_;
    ctx_.props = &props_;
    ctx_.pdl = o.pdl && props_.cc_major >= 9;  // griddepcontrol is sm_90's
    gemm_ = std::make_unique<DenseGemm>();
  }
  // Any thread may destroy a rank's backend (the ranks' owner, on rank 0's): its stream and
  // memory are released with its own device current, which stays current after.
  ~CudaBackend() override {
    cudaSetDevice(device_);
    uploader_.reset();
    gemm_.reset();
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::Cuda; }
  std::string name() const override {
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    return str_cat("cuda:", device_, " (", props_.name, ", ", props_.sm_count, " SMs, ",
                   std::round(double(total) / (1 << 30) * 10) / 10, " GiB, PDL ", ctx_.pdl ? "on" : "off", ")");
  }
  Context& context() override { return ctx_; }
  DType activation_dtype() const override { return DType::BF16; }
  DType kv_dtype() const override { return kv_dtype_; }

  // ---- memory ----
  std::unique_ptr<Buffer> alloc(DType dtype, Shape shape) override {
    return std::make_unique<DeviceBuffer>(dtype, shape);
  }
  std::unique_ptr<Buffer> alloc_host(int64_t bytes) override { return std::make_unique<PinnedBuffer>(bytes); }
  void copy_from_host(TensorView dst, const void* src) override {
    copy_and_wait(stream_, dst.data, src, size_t(dst.nbytes()), cudaMemcpyHostToDevice);
  }
  void copy_from_host_async(const Context& ctx, TensorView dst, const void* src) override {
    TETRA_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, size_t(dst.nbytes()), cudaMemcpyHostToDevice, stream_of(ctx)));
  }
  void copy_to_host(void* dst, TensorView src) override {
    copy_and_wait(stream_, dst, src.data, size_t(src.nbytes()), cudaMemcpyDeviceToHost);
  }
  void fill_zero(TensorView dst) override {
    TETRA_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, size_t(dst.nbytes()), stream_));
  }
  MemoryInfo memory_info() const override {
    // cudaMemGetInfo reads the calling thread's device, which may be another rank's.
    int current = 0;
    TETRA_CUDA_CHECK(cudaGetDevice(&current));
    TETRA_CUDA_CHECK(cudaSetDevice(device_));
    size_t free = 0, total = 0;
    const cudaError_t err = cudaMemGetInfo(&free, &total);
    TETRA_CUDA_CHECK(cudaSetDevice(current));
    TETRA_CUDA_CHECK(err);
    return {int64_t(free), int64_t(total)};
  }
  TensorView upload(TensorView host) override {
    if (host.empty() || host.device == Device::Cuda) return host;
    TensorView d = host;
    d.data = weights_.alloc(host.nbytes());
    d.device = Device::Cuda;
    uploader().copy(d.data, host.data, host.nbytes());
    return d;
  }
  LinearWeight upload(const LinearWeight& host) override {
    LinearWeight w = host;
    w.weight = upload(host.weight);
    w.block_scale = upload(host.block_scale);
    w.bias = upload(host.bias);
    return w;
  }
  std::unique_ptr<MoeExperts> prepare_experts(const std::vector<MlpWeights>& experts,
                                              const MlpWeights* shared) override {
    if (shared && shared->gate.n_out == 0) shared = nullptr;  // an empty share adds nothing
    const bool empty = experts.at(0).gate.n_out == 0;
    const bool fuse = shared && !empty && shared->gate.n_out == experts[0].gate.n_out;
    std::unique_ptr<MoeExperts> routed;
    if (!empty) routed = cuda::prepare_experts(ctx_, experts, fuse ? shared : nullptr, &tuner_, &uploader());
    std::optional<MlpWeights> separate;
    if (shared && !fuse) separate = MlpWeights{upload(shared->gate), upload(shared->up), upload(shared->down)};
    return std::make_unique<LayerExperts>(std::move(routed), int64_t(experts.size()), std::move(separate));
  }
  std::unique_ptr<Buffer> random_tensor(DType dtype, Shape shape, const RandomFill& fill, uint64_t seed) override {
    auto b = alloc(dtype, shape);
    cuda::fill_random(kernel_launch(ctx_), b->view(), fill, seed);
    return b;
  }
  std::unique_ptr<MoeExperts> random_experts(const ExpertsSpec& spec, uint64_t seed) override {
    const MoeShape shape{spec.hidden, spec.intermediate, spec.n_experts, spec.shared_expert};
    std::unique_ptr<MoeExperts> routed;
    if (spec.intermediate > 0) routed = cuda::random_experts(ctx_, shape, spec.format, seed, &tuner_);
    return std::make_unique<LayerExperts>(std::move(routed), spec.n_experts, std::nullopt);
  }
  void warm_up(const Context& ctx, const std::vector<const MoeExperts*>& experts, int top_k,
               int64_t max_tokens) override;
  void make_current() override { TETRA_CUDA_CHECK(cudaSetDevice(device_)); }
  void synchronize() override {
    if (uploader_) uploader_->finish();
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::unique_ptr<Graph> capture(const Context& ctx, const std::function<void()>& body) override {
    return capture_graph(stream_of(ctx), body);
  }

  // ---- ops ----
  void embedding(const Context& ctx, TensorView table, TensorView ids, TensorView out) override {
    cuda::embedding(kernel_launch(ctx), table, ids, out);
  }
  void rms_norm(const Context& ctx, TensorView x, TensorView weight, float eps, TensorView out) override {
    check_device(x, "rms_norm", "x");
    cuda::rms_norm(kernel_launch(ctx), x, weight, eps, out);
  }
  void add_rms_norm(const Context& ctx, TensorView h, TensorView delta, TensorView weight, float eps,
                    TensorView out) override {
    check_device(h, "add_rms_norm", "h");
    cuda::add_rms_norm(kernel_launch(ctx), h, delta, weight, eps, out);
  }
  void layer_norm(const Context& ctx, TensorView x, TensorView weight, TensorView bias, float eps,
                  TensorView out) override {
    cuda::layer_norm(kernel_launch(ctx), x, weight, bias, eps, out);
  }
  void linear(const Context& ctx, TensorView x, const LinearWeight& w, TensorView out) override {
    const LinearPart part{&w, out};
    check_linear(x, part);
    if (dense_kernel(ctx, x, {&part, 1})) return;
    if (gemm_->linear(stream_of(ctx), x, w, out)) {
      if (!w.bias.empty()) cuda::add_bias(kernel_launch(ctx), out, w.bias);
      return;
    }
    linear_general(kernel_launch(ctx), x, w, out);
  }
  void linears(const Context& ctx, TensorView x, std::span<const LinearPart> parts) override {
    for (const LinearPart& p : parts) check_linear(x, p);
    if (dense_kernel(ctx, x, parts)) return;
    for (const LinearPart& p : parts) linear(ctx, x, *p.weight, p.out);
  }
  void rope(const Context& ctx, TensorView x, TensorView positions, const RopeSpec& spec) override {
    cuda::rope(kernel_launch(ctx), x, positions, spec);
  }
  void kv_write(const Context& ctx, TensorView k, TensorView v, const AttentionBatch& batch,
                const KvCacheLayer& cache) override {
    cuda::cache_write(kernel_launch(ctx), k, batch.slot_mapping, cache.k, cache.k_scale);
    cuda::cache_write(kernel_launch(ctx), v, batch.slot_mapping, cache.v, cache.v_scale);
  }
  void qk_norm_rope_kv_write(const Context& ctx, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                             TensorView k_norm, float eps, const RopeSpec& rope_spec, const AttentionBatch& batch,
                             const KvCacheLayer& cache) override {
    check_device(q, "qk_norm_rope_kv_write", "q");
    cuda::qk_norm_rope_kv_write(kernel_launch(ctx), q, k, v, q_norm, k_norm, eps, batch.positions, rope_spec,
                                batch.slot_mapping, cache.k, cache.v, cache.k_scale, cache.v_scale);
  }
  void cache_write(const Context& ctx, TensorView rows, const AttentionBatch& batch, TensorView cache) override {
    cuda::cache_write(kernel_launch(ctx), rows, batch.slot_mapping, cache);
  }
  void mla_rope_cache_write(const Context& ctx, TensorView q, TensorView q_nope, TensorView q_rope, TensorView ckv,
                            TensorView kv_norm, float eps, const RopeSpec& rope_spec, const AttentionBatch& batch,
                            TensorView cache) override {
    check_device(q, "mla_rope_cache_write", "q");
    cuda::mla_rope_cache_write(kernel_launch(ctx), q, q_nope, q_rope, ckv, kv_norm, eps, batch.positions, rope_spec,
                               batch.slot_mapping, cache);
  }
  void attention(const Context& ctx, TensorView q, const KvCacheLayer& cache, const AttentionBatch& batch,
                 float scale, TensorView out) override;
  void mla_attention(const Context& ctx, TensorView q_latent, TensorView q_rope, const KvCacheLayer& cache,
                     const AttentionBatch& batch, float scale, TensorView selected, TensorView out) override;
  void dsa_select(const Context& ctx, TensorView q, TensorView weights, const KvCacheLayer& cache,
                  const AttentionBatch& batch, float q_scale, float weight_scale, TensorView selected) override;
  void head_linear(const Context& ctx, TensorView x, const LinearWeight& w, int64_t head_stride, int64_t row0,
                   int64_t n_rows, bool transposed, TensorView out) override {
    TETRA_CHECK(x.shape.rank == 3 && out.shape.rank == 3 && x.dim(0) == out.dim(0) && x.dim(1) == out.dim(1),
                "head_linear: x ", x.shape.str(), " and out ", out.shape.str(), " must be [T, heads, width]");
    const int64_t heads = x.dim(1);
    TETRA_CHECK(head_stride >= 1 && row0 >= 0 && n_rows >= 1 && row0 + n_rows <= head_stride &&
                    heads * head_stride <= w.n_out,
                "head_linear: ", heads, " heads of ", head_stride, " rows do not fit a weight of ", w.n_out, " rows");
    const int64_t x_width = transposed ? n_rows : w.n_in, out_width = transposed ? w.n_in : n_rows;
    TETRA_CHECK(x.dim(2) == x_width && out.dim(2) == out_width, "head_linear: widths ", x.dim(2), " -> ",
                out.dim(2), " do not match the weight block");
    check_device(x, "head_linear", "x");
    check_device(w.weight, "head_linear", "the weight");
    if (gemm_->head_linear(stream_of(ctx), x, w, head_stride, row0, n_rows, transposed, out)) return;
    head_linear_general(kernel_launch(ctx), x, w, head_stride, row0, n_rows, transposed, out);
  }
  void copy_columns(const Context& ctx, TensorView src, int64_t src_col0, TensorView dst, int64_t dst_col0,
                    int64_t n) override {
    cuda::copy_columns(kernel_launch(ctx), src, src_col0, dst, dst_col0, n);
  }
  void silu_mul(const Context& ctx, TensorView gate, TensorView up, TensorView out) override {
    cuda::silu_mul(kernel_launch(ctx), gate, up, out);
  }
  void add(const Context& ctx, TensorView a, TensorView b, TensorView out) override {
    cuda::add(kernel_launch(ctx), a, b, out);
  }
  void route(const Context& ctx, TensorView logits, const RoutingSpec& spec, TensorView ids,
             TensorView weights) override {
    cuda::route(ctx, logits, spec, ids, weights);
  }
  void moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights, const MoeExperts& experts,
                   TensorView out) override;
  void gather_rows(const Context& ctx, TensorView x, TensorView rows, TensorView out) override {
    cuda::gather_rows(kernel_launch(ctx), x, rows, out);
  }
  void sample(const Context& ctx, TensorView logits, TensorView rows, TensorView penalty_ids,
              TensorView penalty_counts, TensorView out) override;

 private:
  // Before any kernel of linear or linears touches memory.
  static void check_linear(TensorView x, const LinearPart& p) {
    const LinearWeight& w = *p.weight;
    check_device(x, "linear", "x");
    check_device(w.weight, "linear", "the weight");
    TETRA_CHECK(x.dim(-1) == w.n_in && p.out.dim(-1) == w.n_out, "linear: input width ", x.dim(-1),
                " and output width ", p.out.dim(-1), " do not match a weight of ", w.n_out, "x", w.n_in);
    // Every kernel writes a row of out for each row of x: no more and no fewer.
    const int64_t rows = w.n_in > 0 ? x.numel() / w.n_in : 0;
    TETRA_CHECK(w.n_in == 0 || p.out.numel() == rows * w.n_out, "linear: out holds ", p.out.numel(),
                " values for ", rows, " rows of ", w.n_out);
  }
  // The GEMV or the wgmma skinny kernel, where dense_linear_path picks one and it takes the
  // launch; false leaves the launch to cuBLASLt.
  bool dense_kernel(const Context& ctx, TensorView x, std::span<const LinearPart> parts) {
    if (parts.empty() || parts[0].weight->n_in <= 0) return false;
    const int64_t tokens = x.numel() / parts[0].weight->n_in;
    switch (dense_linear_path(tokens, parts)) {
      case DenseLinearPath::Gemv: return gemv_bf16(kernel_launch(ctx), x, parts);
      case DenseLinearPath::Skinny: return gemm_skinny_bf16(kernel_launch(ctx), x, parts);
      case DenseLinearPath::Library: return false;
    }
    return false;
  }
  Uploader& uploader() {
    if (!uploader_) uploader_ = std::make_unique<Uploader>(stream_);
    return *uploader_;
  }
  const LayerExperts& layer_experts(const MoeExperts& e) const {
    const auto* l = dynamic_cast<const LayerExperts*>(&e);
    TETRA_CHECK(l, "moe: experts were not prepared by the CUDA backend");
    return *l;
  }

  int device_;
  DType kv_dtype_;
  DeviceProps props_;
  cudaStream_t stream_ = nullptr;
  Context ctx_;
  std::unique_ptr<DenseGemm> gemm_;
  WeightArena weights_;
  std::unique_ptr<Uploader> uploader_;
  MoeTuner tuner_;
  bool autotune_;
};

void CudaBackend::attention(const Context& ctx, TensorView q, const KvCacheLayer& cache, const AttentionBatch& batch,
                            float scale, TensorView out) {
  TETRA_CHECK(q.shape.rank == 3 && cache.k.shape.rank == 4 && cache.v.shape.rank == 4,
              "attention: q must be [T, heads, d] and the cache [blocks, block_size, kv_heads, d]");
  TETRA_CHECK(q.dtype == DType::BF16 && out.dtype == DType::BF16 && cache.k.dtype == cache.v.dtype &&
                  (cache.k.dtype == DType::BF16 || cache.k.dtype == DType::F8_E4M3),
              "attention: CUDA attention reads BF16 queries and a BF16 or F8_E4M3 cache");
  PagedAttentionParams p;
  p.q = q.as<const uint16_t>();
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.fp8_cache = cache.k.dtype == DType::F8_E4M3;
  p.k_scale = p.fp8_cache ? cache.k_scale : 1.0f;
  p.v_scale = p.fp8_cache ? cache.v_scale : 1.0f;
  p.out = out.as<uint16_t>();
  p.positions = batch.positions.as<const int32_t>();
  p.seq_starts = batch.seq_starts.as<const int32_t>();
  p.seq_lens = batch.seq_lens.as<const int32_t>();
  p.block_tables = batch.block_tables.as<const int32_t>();
  p.n_tokens = batch.n_tokens;
  p.n_seqs = batch.n_seqs;
  p.n_heads = int(q.dim(1));
  p.n_kv_heads = int(cache.k.dim(2));
  p.d_k = int(q.dim(2));
  p.d_v = int(cache.v.dim(3));
  p.block_size = batch.block_size;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.max_query_len = batch.max_query_len;
  p.max_seq_len = batch.max_seq_len;
  p.scale = scale;
  TETRA_CHECK(out.numel() == int64_t(p.n_tokens) * p.n_heads * p.d_v, "attention: the output is ", out.shape.str());
  if (p.n_tokens == 0) return;
  const int64_t ws = paged_attention_workspace_bytes(p, props_.sm_count);
  void* w = ws > 0 ? scratch(ctx, ws, "attention").data : nullptr;
  paged_attention(kernel_launch(ctx), p, w, ws, props_.sm_count);
}

void CudaBackend::mla_attention(const Context& ctx, TensorView q_latent, TensorView q_rope, const KvCacheLayer& cache,
                                const AttentionBatch& batch, float scale, TensorView selected, TensorView out) {
  TETRA_CHECK(q_latent.shape.rank == 3 && q_rope.shape.rank == 3 && cache.k.shape.rank == 4 && cache.k.dim(2) == 1,
              "mla_attention: q must be [T, heads, d] and the cache [blocks, block_size, 1, rank + rope]");
  TETRA_CHECK(cache.k.dtype == DType::BF16 || cache.k.dtype == DType::F8_E4M3,
              "mla_attention: CUDA MLA reads a BF16 or F8_E4M3 latent cache, not ", dtype_name(cache.k.dtype));
  TETRA_CHECK(q_latent.dtype == DType::BF16 && q_rope.dtype == DType::BF16 && out.dtype == DType::BF16,
              "mla_attention: CUDA MLA reads BF16 queries");
  MlaAttentionParams p{};
  p.n_tokens = batch.n_tokens;
  p.n_heads = int(q_latent.dim(1));
  p.rank = int(q_latent.dim(2));
  p.d_rope = int(q_rope.dim(2));
  TETRA_CHECK(q_latent.dim(0) == p.n_tokens && q_rope.dim(0) == p.n_tokens && q_rope.dim(1) == p.n_heads &&
                  out.numel() == int64_t(p.n_tokens) * p.n_heads * p.rank,
              "mla_attention: q_latent ", q_latent.shape.str(), ", q_rope ", q_rope.shape.str(), " and out ",
              out.shape.str(), " do not match ", p.n_tokens, " tokens");
  TETRA_CHECK(cache.k.dim(3) == p.rank + p.d_rope, "mla_attention: cache rows of ", cache.k.dim(3),
              " are not latent ", p.rank, " + rope ", p.d_rope);
  if (!selected.empty()) {
    TETRA_CHECK(selected.dtype == DType::I32 && selected.shape.rank == 2 && selected.dim(0) == p.n_tokens,
                "mla_attention: selected must be I32 [T, top_k], not ", selected.shape.str());
    p.selected = selected.as<const int32_t>();
    p.top_k = int(selected.dim(1));
  }
  p.q_latent = q_latent.as<const uint16_t>();
  p.q_rope = q_rope.as<const uint16_t>();
  p.cache = cache.k.data;
  p.fp8_cache = cache.k.dtype == DType::F8_E4M3;
  p.out = out.as<uint16_t>();
  p.positions = batch.positions.as<const int32_t>();
  p.seq_starts = batch.seq_starts.as<const int32_t>();
  p.block_tables = batch.block_tables.as<const int32_t>();
  p.n_seqs = batch.n_seqs;
  p.block_size = batch.block_size;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.max_query_len = batch.max_query_len;
  p.scale = scale;
  if (p.n_tokens == 0) return;
  const int64_t ws = mla_attention_workspace_bytes(p, props_.sm_count);
  void* w = ws > 0 ? scratch(ctx, ws, "mla_attention").data : nullptr;
  cuda::mla_attention(kernel_launch(ctx), p, w, ws, props_.sm_count);
}

void CudaBackend::dsa_select(const Context& ctx, TensorView q, TensorView weights, const KvCacheLayer& cache,
                             const AttentionBatch& batch, float q_scale, float weight_scale, TensorView selected) {
  TETRA_CHECK(q.shape.rank == 3 && q.dtype == DType::BF16 && weights.dtype == DType::F32 &&
                  (cache.index_k.dtype == DType::BF16 || cache.index_k.dtype == DType::F8_E4M3) &&
                  cache.index_k.shape.rank == 4 && cache.index_k.dim(2) == 1,
              "dsa_select: BF16 queries [T, heads, d], F32 weights and a BF16 or F8_E4M3 index-key cache [blocks, "
              "block_size, 1, d]");
  DsaSelectParams p{};
  p.n_tokens = batch.n_tokens;
  p.n_heads = int(q.dim(1));
  p.dim = int(q.dim(2));
  TETRA_CHECK(q.dim(0) == p.n_tokens && weights.numel() == int64_t(p.n_tokens) * p.n_heads &&
                  cache.index_k.dim(3) == p.dim,
              "dsa_select: q ", q.shape.str(), ", weights ", weights.shape.str(), " and index keys ",
              cache.index_k.shape.str(), " do not match ", p.n_tokens, " tokens");
  TETRA_CHECK(selected.dtype == DType::I32 && selected.shape.rank == 2 && selected.dim(0) == p.n_tokens,
              "dsa_select: selected must be I32 [T, top_k], not ", selected.shape.str());
  p.q = q.as<const uint16_t>();
  p.weights = weights.as<const float>();
  p.index_k = cache.index_k.data;
  p.fp8_keys = cache.index_k.dtype == DType::F8_E4M3;
  p.selected = selected.as<int32_t>();
  p.top_k = int(selected.dim(1));
  p.positions = batch.positions.as<const int32_t>();
  p.seq_starts = batch.seq_starts.as<const int32_t>();
  p.block_tables = batch.block_tables.as<const int32_t>();
  p.n_seqs = batch.n_seqs;
  p.block_size = batch.block_size;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  // Prompt steps size the scores by their longest sequence. Decode steps keep the table's row:
  // decode graphs are captured with padding rows (max_seq_len 1) and replayed at any length.
  p.max_seq_len = batch.max_query_len > 1 ? batch.max_seq_len : 0;
  p.q_scale = q_scale;
  p.weight_scale = weight_scale;
  if (p.n_tokens == 0) return;
  const int64_t ws = dsa_select_workspace_bytes(p);
  cuda::dsa_select(kernel_launch(ctx), p, scratch(ctx, ws, "dsa_select").data, ws);
}

void CudaBackend::moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                              const MoeExperts& experts, TensorView out) {
  const LayerExperts& le = layer_experts(experts);
  const int64_t T = x.dim(0);
  if (const MoeExperts* routed = le.routed()) {
    Context c = ctx;
    const int64_t ws = moe_workspace_bytes(*routed, T, int(ids.dim(1)));
    const TensorView w = scratch(ctx, ws, "moe_experts");
    c.workspace = Workspace{w.data, w.nbytes()};
    cuda::moe_experts(c, x, ids, weights, *routed, out);
  } else {
    check_device(out, "moe_experts", "out");
    TETRA_CHECK(out.dtype == DType::BF16 && out.shape.rank == 2 && out.dim(0) == T, "moe: out must be BF16 [T, H]");
    TETRA_CUDA_CHECK(cudaMemsetAsync(out.data, 0, size_t(out.nbytes()), stream_of(ctx)));
  }
  if (const MlpWeights* sh = le.separate_shared()) {
    // A shared expert of another width: down(silu(gate x) * up x), added after the routed sum.
    Arena& arena = *ctx.arena;
    const TensorView g = arena.alloc(DType::BF16, {T, sh->gate.n_out});
    const TensorView u = arena.alloc(DType::BF16, {T, sh->up.n_out});
    const TensorView d = arena.alloc(DType::BF16, {T, sh->down.n_out});
    linear(ctx, x, sh->gate, g);
    linear(ctx, x, sh->up, u);
    silu_mul(ctx, g, u, g);
    linear(ctx, g, sh->down, d);
    add(ctx, out, d, out);
  }
}

void CudaBackend::sample(const Context& ctx, TensorView logits, TensorView rows, TensorView penalty_ids,
                         TensorView penalty_counts, TensorView out) {
  TETRA_CHECK(logits.shape.rank == 2 && logits.dtype == DType::F32, "sample: logits must be F32 [R, V]");
  const int64_t n_rows = logits.dim(0), vocab = logits.dim(1);
  TETRA_CHECK(rows.nbytes() == n_rows * int64_t(sizeof(SamplingRow)) &&
                  out.nbytes() == n_rows * int64_t(sizeof(SampledToken)) &&
                  penalty_ids.numel() == penalty_counts.numel(),
              "sample: ", n_rows, " rows of logits need as many SamplingRow and SampledToken records");
  if (n_rows == 0) return;
  const int64_t ws = sample_workspace_bytes(n_rows, vocab);
  void* w = ws > 0 ? scratch(ctx, ws, "sample").data : nullptr;
  launch_sample(kernel_launch(ctx), logits.as<const float>(), n_rows, vocab, rows.as<const SamplingRow>(),
                penalty_ids.as<const int32_t>(), penalty_counts.as<const int32_t>(), penalty_ids.numel(),
                out.as<SampledToken>(), w);
}

namespace {

// A tuned MoE choice as the startup line prints it: the tile width (with the hot experts'
// width after a '+'), or "fused".
std::string moe_choice(const MoeConfig& c) {
  if (c.fused) return "fused";
  return c.hot_tokens ? str_cat(c.tile_tokens, "+", c.hot_tokens) : std::to_string(c.tile_tokens);
}

}  // namespace

// Tunes the MoE tiles of each distinct expert shape for token counts 1, 2, 4, ... up to
// max_tokens, on random inputs (the tuner keys on power-of-two buckets), before any forward.
// A bucket the tuner holds already (an earlier engine's, or the cache file's) keeps its
// choice, so every engine of a process runs the same tiles.
void CudaBackend::warm_up(const Context& ctx, const std::vector<const MoeExperts*>& experts, int top_k,
                          int64_t max_tokens) {
  if (!autotune_) return;
  std::map<std::tuple<int64_t, int64_t, int64_t, int, bool>, const MoeExperts*> shapes;
  for (const MoeExperts* e : experts) {
    const MoeExperts* routed = layer_experts(*e).routed();
    if (!routed || !moe_fast_path(*routed)) continue;
    const MoeShape& s = experts_shape(*routed);
    shapes.emplace(std::make_tuple(s.hidden, s.intermediate, int64_t(s.n_experts), int(experts_format(*routed)),
                                   s.shared_expert),
                   routed);
  }
  if (shapes.empty()) return;
  std::mt19937 rng(1);
  for (const auto& [key, routed] : shapes) {
    const MoeShape& s = experts_shape(*routed);
    std::string report;
    for (int64_t t = 1;; t = std::min(2 * t, max_tokens)) {
      if (moe_tuned(ctx, *routed, t, top_k)) {
        report += str_cat(report.empty() ? "" : ", ", "T=", t, ": ", moe_choice(pick_moe_config(ctx, *routed, t, top_k)),
                          " (tuned before)");
        if (t >= max_tokens) break;
        continue;
      }
      DeviceBuffer x(DType::BF16, {t, s.hidden}), out(DType::BF16, {t, s.hidden});
      DeviceBuffer ids(DType::I32, {t, top_k}), w(DType::F32, {t, top_k});
      DeviceBuffer ws(DType::U8, {moe_workspace_bytes(*routed, t, top_k)});
      cuda::fill_random(kernel_launch(ctx_), x.view(), {.scale = 1.0f}, uint64_t(t));
      std::vector<int32_t> host_ids(static_cast<size_t>(t * top_k));
      std::vector<float> host_w(static_cast<size_t>(t * top_k), 1.0f / float(top_k));
      for (int64_t i = 0; i < t; ++i) {
        // k distinct experts per token, uniformly: a partial Fisher-Yates draw.
        std::vector<int32_t> pool(static_cast<size_t>(s.n_experts));
        for (int e = 0; e < s.n_experts; ++e) pool[size_t(e)] = e;
        for (int j = 0; j < top_k; ++j) {
          std::uniform_int_distribution<int> pick(j, s.n_experts - 1);
          std::swap(pool[size_t(j)], pool[size_t(pick(rng))]);
          host_ids[size_t(i * top_k + j)] = pool[size_t(j)];
        }
      }
      copy_from_host(ids.view(), host_ids.data());
      copy_from_host(w.view(), host_w.data());
      Context c = ctx;
      c.workspace = Workspace{ws.view().data, ws.view().nbytes()};
      const MoeConfig chosen = tune_moe(c, x.view(), ids.view(), w.view(), *routed, out.view());
      report += str_cat(report.empty() ? "" : ", ", "T=", t, ": ", moe_choice(chosen));
      if (t >= max_tokens) break;
    }
    log_info("MoE tiles for H ", s.hidden, ", I ", s.intermediate, ", E ", s.n_experts, ", top-", top_k, ": ",
             report);
  }
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  TETRA_CHECK(err == cudaSuccess && n > 0, "--device cuda: no CUDA device answers (",
              err == cudaSuccess ? "none found" : cudaGetErrorString(err), ")");
  TETRA_CHECK(options.device_index >= 0 && options.device_index < n, "--device cuda:", options.device_index,
              ": this machine has ", n, " CUDA device", n == 1 ? "" : "s");
  return std::make_unique<CudaBackend>(options);
}

bool cuda_device_present() { return cuda_device_count() > 0; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();  // a failed probe must not leave a sticky error behind
  return n;
}

}  // namespace tetra::ops::cuda

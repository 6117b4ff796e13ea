#include "ops/cpu/cpu_backend.h"
#include "ops/cpu/sampling.h"

#include <cmath>
#include <cstring>
#include <new>

namespace tetra::ops::cpu {
namespace {

class HostBuffer : public Buffer {
 public:
  HostBuffer(DType dtype, Shape shape) {
    view_.dtype = dtype;
    view_.shape = shape;
    view_.device = Device::Cpu;
    const int64_t bytes = view_.nbytes();
    // 64-byte alignment keeps rows friendly to vector loads.
    storage_ = static_cast<char*>(::operator new[](size_t(bytes > 0 ? bytes : 1), std::align_val_t(64)));
    std::memset(storage_, 0, size_t(bytes));
    view_.data = storage_;
  }
  ~HostBuffer() override { ::operator delete[](storage_, std::align_val_t(64)); }
  TensorView view() const override { return view_; }

 private:
  char* storage_ = nullptr;
  TensorView view_;
};

void check_f32(const TensorView& t, const char* what) {
  TETRA_CHECK(t.dtype == DType::F32, "the CPU backend keeps ", what, " in F32, got ",
              dtype_name(t.dtype));
}

class CpuBackend : public Backend {
 public:
  CpuBackend(int n_threads, DType kv_dtype, DType moe_activation_dtype)
      : pool_(n_threads), kv_dtype_(kv_dtype), fp8_expert_activations_(moe_activation_dtype == DType::F8_E4M3) {
    TETRA_CHECK(kv_dtype == DType::F32 || kv_dtype == DType::F8_E4M3,
                "the CPU backend keeps its KV cache in F32 or F8_E4M3, not ", dtype_name(kv_dtype));
    TETRA_CHECK(moe_activation_dtype == DType::F32 || moe_activation_dtype == DType::F8_E4M3,
                "the CPU backend's experts take F32 or F8_E4M3 activations, not ", dtype_name(moe_activation_dtype));
    props_.name = "cpu";
    ctx_.pool = &pool_;
    ctx_.props = &props_;
  }

  Device device() const override { return Device::Cpu; }
  std::string name() const override { return "cpu (" + std::to_string(pool_.size()) + " threads)"; }
  Context& context() override { return ctx_; }
  DType activation_dtype() const override { return DType::F32; }
  DType kv_dtype() const override { return kv_dtype_; }

  std::unique_ptr<Buffer> alloc(DType dtype, Shape shape) override {
    return std::make_unique<HostBuffer>(dtype, shape);
  }
  std::unique_ptr<Buffer> alloc_host(int64_t bytes) override {
    return std::make_unique<HostBuffer>(DType::U8, Shape{bytes});
  }
  void copy_from_host(TensorView dst, const void* src) override {
    std::memcpy(dst.data, src, size_t(dst.nbytes()));
  }
  void copy_from_host_async(const Context&, TensorView dst, const void* src) override {
    copy_from_host(dst, src);
  }
  void copy_to_host(void* dst, TensorView src) override {
    std::memcpy(dst, src.data, size_t(src.nbytes()));
  }
  void fill_zero(TensorView dst) override { std::memset(dst.data, 0, size_t(dst.nbytes())); }
  MemoryInfo memory_info() const override { return {}; }
  // The CPU reads weights straight from the checkpoint's mapping.
  LinearWeight upload(const LinearWeight& host) override { return host; }
  TensorView upload(TensorView host) override { return host; }
  std::unique_ptr<MoeExperts> prepare_experts(const std::vector<MlpWeights>& experts,
                                              const MlpWeights* shared) override {
    return std::make_unique<CpuExperts>(experts, shared ? std::optional<MlpWeights>(*shared) : std::nullopt,
                                        fp8_expert_activations_);
  }
  std::unique_ptr<Buffer> random_tensor(DType dtype, Shape shape, const RandomFill& fill,
                                        uint64_t seed) override {
    auto b = alloc(dtype, shape);
    fill_random(b->view(), fill, seed);
    return b;
  }
  std::unique_ptr<MoeExperts> random_experts(const ExpertsSpec& spec, uint64_t seed) override;
  void warm_up(const Context&, const std::vector<const MoeExperts*>&, int, int64_t) override {}
  void synchronize() override {}

  void embedding(const Context&, TensorView table, TensorView ids, TensorView out) override {
    check_f32(out, "activations");
    const int64_t n = ids.numel(), hidden = table.dim(1), vocab = table.dim(0);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = ids.as<int32_t>()[t];
      TETRA_CHECK(id >= 0 && id < vocab, "token id ", id, " is outside the vocabulary of ", vocab);
      float* row = out.as<float>() + t * hidden;
      for (int64_t i = 0; i < hidden; ++i) row[i] = load_f32(table, id * hidden + i);
    }
  }

  void rms_norm(const Context& ctx, TensorView x, TensorView weight, float eps,
                TensorView out) override {
    check_f32(x, "activations");
    const int64_t d = x.dim(-1), rows = x.numel() / d;
    ctx.pool->parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.as<float>() + r * d;
        float* o = out.as<float>() + r * d;
        float sum = 0;
        for (int64_t i = 0; i < d; ++i) sum += xr[i] * xr[i];
        const float inv = 1.0f / std::sqrt(sum / float(d) + eps);
        for (int64_t i = 0; i < d; ++i) o[i] = load_f32(weight, i) * (xr[i] * inv);
      }
    });
  }

  void layer_norm(const Context& ctx, TensorView x, TensorView weight, TensorView bias, float eps,
                  TensorView out) override {
    check_f32(x, "activations");
    const int64_t d = x.dim(-1), rows = x.numel() / d;
    ctx.pool->parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.as<float>() + r * d;
        float* o = out.as<float>() + r * d;
        float mean = 0, var = 0;
        for (int64_t i = 0; i < d; ++i) mean += xr[i];
        mean /= float(d);
        for (int64_t i = 0; i < d; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        var /= float(d);
        const float inv = 1.0f / std::sqrt(var + eps);
        for (int64_t i = 0; i < d; ++i)
          o[i] = (xr[i] - mean) * inv * load_f32(weight, i) + (bias.empty() ? 0.0f : load_f32(bias, i));
      }
    });
  }

  void linear(const Context& ctx, TensorView x, const LinearWeight& w, TensorView out) override {
    check_f32(x, "activations");
    TETRA_CHECK(x.dim(-1) == w.n_in && out.dim(-1) == w.n_out, "linear: input width ", x.dim(-1),
                " and output width ", out.dim(-1), " do not match a weight of ", w.n_out, "x", w.n_in);
    linear_f32(ctx.pool, x.as<float>(), x.numel() / w.n_in, w, out.as<float>());
  }

  void rope(const Context& ctx, TensorView x, TensorView positions, const RopeSpec& spec) override {
    cpu::rope(ctx.pool, x, positions, spec);
  }
  void kv_write(const Context&, TensorView k, TensorView v, const AttentionBatch& batch,
                const KvCacheLayer& cache) override {
    cpu::kv_write(k, v, batch, cache);
  }
  void attention(const Context& ctx, TensorView q, const KvCacheLayer& cache,
                 const AttentionBatch& batch, float scale, TensorView out) override {
    cpu::attention(ctx.pool, q, cache, batch, scale, out);
  }

  void cache_write(const Context&, TensorView rows, const AttentionBatch& batch,
                   TensorView cache) override {
    cpu::cache_write(rows, batch, cache);
  }
  void mla_attention(const Context& ctx, TensorView q_latent, TensorView q_rope,
                     const KvCacheLayer& cache, const AttentionBatch& batch, float scale,
                     TensorView selected, TensorView out) override {
    cpu::mla_attention(ctx.pool, q_latent, q_rope, cache, batch, scale, selected, out);
  }
  void dsa_select(const Context&, TensorView q, TensorView weights, const KvCacheLayer& cache,
                  const AttentionBatch& batch, float q_scale, float weight_scale,
                  TensorView selected) override {
    cpu::dsa_select(q, weights, cache, batch, q_scale, weight_scale, selected);
  }
  void head_linear(const Context& ctx, TensorView x, const LinearWeight& w, int64_t head_stride,
                   int64_t row0, int64_t n_rows, bool transposed, TensorView out) override {
    cpu::head_linear(ctx.pool, x, w, head_stride, row0, n_rows, transposed, out);
  }
  void copy_columns(const Context&, TensorView src, int64_t src_col0, TensorView dst,
                    int64_t dst_col0, int64_t n) override {
    const int64_t rows = src.dim(0), sw = src.numel() / rows, dw = dst.numel() / dst.dim(0);
    TETRA_CHECK(dst.dim(0) == rows && src_col0 + n <= sw && dst_col0 + n <= dw,
                "copy_columns: columns out of range");
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst.as<float>() + r * dw + dst_col0, src.as<const float>() + r * sw + src_col0,
                  size_t(n) * sizeof(float));
  }

  void silu_mul(const Context&, TensorView gate, TensorView up, TensorView out) override {
    const int64_t n = gate.numel();
    const float *g = gate.as<float>(), *u = up.as<float>();
    float* o = out.as<float>();
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }

  void add(const Context&, TensorView a, TensorView b, TensorView out) override {
    TETRA_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: shapes ", a.shape.str(),
                " and ", b.shape.str(), " differ");
    const float *pa = a.as<float>(), *pb = b.as<float>();
    float* o = out.as<float>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = pa[i] + pb[i];
  }

  void route(const Context&, TensorView logits, const RoutingSpec& spec, TensorView ids,
             TensorView weights) override {
    cpu::route(logits, spec, ids, weights);
  }

  void moe_experts(const Context& ctx, TensorView x, TensorView ids, TensorView weights,
                   const MoeExperts& experts, TensorView out) override {
    cpu::moe_experts(ctx.pool, x, ids, weights, static_cast<const CpuExperts&>(experts), out);
  }

  void sample(const Context& ctx, TensorView logits, TensorView rows, TensorView penalty_ids,
              TensorView penalty_counts, TensorView out) override {
    const int64_t n_rows = logits.dim(0);
    TETRA_CHECK(rows.nbytes() == n_rows * int64_t(sizeof(SamplingRow)) &&
                    out.nbytes() == n_rows * int64_t(sizeof(SampledToken)) &&
                    penalty_ids.numel() == penalty_counts.numel(),
                "sample: ", n_rows, " rows of logits need as many SamplingRow and SampledToken records");
    cpu::sample_rows(ctx.pool, logits, rows.as<const SamplingRow>(), penalty_ids.as<const int32_t>(),
                     penalty_counts.as<const int32_t>(), penalty_ids.numel(), out.as<SampledToken>());
  }

  void gather_rows(const Context&, TensorView x, TensorView rows, TensorView out) override {
    const int64_t width = x.numel() / x.dim(0), row_bytes = x.nbytes() / x.dim(0);
    (void)width;
    for (int64_t r = 0; r < rows.numel(); ++r) {
      const int32_t src = rows.as<int32_t>()[r];
      TETRA_CHECK(src >= 0 && src < x.dim(0), "gather_rows: row ", src, " is outside ", x.dim(0));
      std::memcpy(static_cast<char*>(out.data) + r * row_bytes,
                  static_cast<const char*>(x.data) + src * row_bytes, size_t(row_bytes));
    }
  }

 private:
  ThreadPool pool_;
  DType kv_dtype_;  // F32, or F8_E4M3 (--kv-cache-dtype fp8_e4m3)
  bool fp8_expert_activations_;  // --moe-activation-dtype fp8_e4m3: NVFP4 experts run W4A8
  DeviceProps props_;
  Context ctx_;
};

std::unique_ptr<MoeExperts> CpuBackend::random_experts(const ExpertsSpec& spec, uint64_t seed) {
  std::vector<std::unique_ptr<Buffer>> storage;
  auto matrix = [&](int64_t n_out, int64_t n_in) {
    LinearWeight w;
    w.format = spec.format;
    w.n_out = n_out;
    w.n_in = n_in;
    if (spec.format == WeightFormat::Nvfp4) {
      storage.push_back(random_tensor(DType::U8, {n_out, n_in / 2}, {.kind = RandomFill::Bytes}, seed++));
      w.weight = storage.back()->view();
      storage.push_back(random_tensor(DType::F8_E4M3, {n_out, n_in / 16},
                                      {.kind = RandomFill::Bytes, .lo = kDummyNvfp4ScaleLo,
                                       .span = kDummyNvfp4ScaleSpan},
                                      seed++));
      w.block_scale = storage.back()->view();
      w.global_scale = kDummyNvfp4GlobalScale;
    } else {
      storage.push_back(random_tensor(DType::BF16, {n_out, n_in}, {}, seed++));
      w.weight = storage.back()->view();
    }
    return w;
  };
  auto mlp = [&] {
    return MlpWeights{matrix(spec.intermediate, spec.hidden), matrix(spec.intermediate, spec.hidden),
                      matrix(spec.hidden, spec.intermediate)};
  };
  std::vector<MlpWeights> experts;
  for (int e = 0; e < spec.n_experts; ++e) experts.push_back(mlp());
  std::optional<MlpWeights> shared;
  if (spec.shared_expert) shared = mlp();
  return std::make_unique<CpuExperts>(std::move(experts), std::move(shared), fp8_expert_activations_,
                                      std::move(storage));
}

}  // namespace

float load_f32(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.as<const float>()[i];
    case DType::BF16: return bf16_to_f32(t.as<const uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.as<const uint16_t>()[i]);
    default: fail("the CPU backend cannot read ", dtype_name(t.dtype), " as a float tensor");
  }
}

}  // namespace tetra::ops::cpu

namespace tetra::ops {
std::unique_ptr<Backend> make_cpu_backend(int n_threads, DType kv_dtype, DType moe_activation_dtype) {
  return std::make_unique<cpu::CpuBackend>(n_threads, kv_dtype, moe_activation_dtype);
}
}  // namespace tetra::ops

#include "runtime/op_profile.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace tetra::runtime {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Attention: return "attention";
    case OpClass::Moe: return "moe";
    case OpClass::DenseGemm: return "dense GEMMs";
    case OpClass::NormRope: return "norms/rope";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Sampling: return "sampling";
  }
  return "";
}

ProfilingBackend::ProfilingBackend(std::unique_ptr<ops::Backend> inner)
    : ForwardingBackend(*inner), owned_(std::move(inner)) {
  // The median of a wait on an idle stream, taken off every op's figure.
  std::vector<double> t;
  for (int i = 0; i < 101; ++i) {
    owned_->synchronize();
    const double t0 = now();
    owned_->synchronize();
    t.push_back(now() - t0);
  }
  std::nth_element(t.begin(), t.begin() + 50, t.end());
  sync_overhead_ = t[50];
}

template <class F>
void ProfilingBackend::timed(const std::string& op, OpClass cls, F&& run) {
  if (!enabled_) return run();
  owned_->synchronize();
  const double t0 = now();
  run();
  owned_->synchronize();
  OpTime& t = times_[op];
  t.cls = cls;
  ++t.calls;
  t.seconds += std::max(0.0, now() - t0 - sync_overhead_);
}

void ProfilingBackend::embedding(const ops::Context& c, TensorView table, TensorView ids, TensorView out) {
  timed("embedding", OpClass::Elementwise, [&] { inner().embedding(c, table, ids, out); });
}
void ProfilingBackend::rms_norm(const ops::Context& c, TensorView x, TensorView w, float eps, TensorView out) {
  timed("rms_norm", OpClass::NormRope, [&] { inner().rms_norm(c, x, w, eps, out); });
}
void ProfilingBackend::add_rms_norm(const ops::Context& c, TensorView h, TensorView delta, TensorView w, float eps,
                                    TensorView out) {
  timed("add_rms_norm", OpClass::NormRope, [&] { inner().add_rms_norm(c, h, delta, w, eps, out); });
}
void ProfilingBackend::layer_norm(const ops::Context& c, TensorView x, TensorView w, TensorView b, float eps,
                                  TensorView out) {
  timed("layer_norm", OpClass::NormRope, [&] { inner().layer_norm(c, x, w, b, eps, out); });
}
void ProfilingBackend::linear(const ops::Context& c, TensorView x, const ops::LinearWeight& w, TensorView out) {
  timed(str_cat("linear ", w.n_out, "x", w.n_in), OpClass::DenseGemm, [&] { inner().linear(c, x, w, out); });
}
void ProfilingBackend::linears(const ops::Context& c, TensorView x, std::span<const ops::LinearPart> parts) {
  std::string name = "linears ";  // e.g. "linears 4096+512+512x2048"
  for (size_t i = 0; i < parts.size(); ++i) name += str_cat(i ? "+" : "", parts[i].weight->n_out);
  if (!parts.empty()) name += str_cat("x", parts.front().weight->n_in);
  timed(name, OpClass::DenseGemm, [&] { inner().linears(c, x, parts); });
}
void ProfilingBackend::rope(const ops::Context& c, TensorView x, TensorView pos, const ops::RopeSpec& r) {
  timed("rope", OpClass::NormRope, [&] { inner().rope(c, x, pos, r); });
}
void ProfilingBackend::kv_write(const ops::Context& c, TensorView k, TensorView v, const ops::AttentionBatch& b,
                                const ops::KvCacheLayer& cache) {
  timed("kv_write", OpClass::Attention, [&] { inner().kv_write(c, k, v, b, cache); });
}
void ProfilingBackend::cache_write(const ops::Context& c, TensorView rows, const ops::AttentionBatch& b,
                                   TensorView cache) {
  timed("cache_write", OpClass::Attention, [&] { inner().cache_write(c, rows, b, cache); });
}
void ProfilingBackend::mla_rope_cache_write(const ops::Context& c, TensorView q, TensorView q_nope, TensorView q_rope,
                                            TensorView ckv, TensorView kv_norm, float eps, const ops::RopeSpec& r,
                                            const ops::AttentionBatch& b, TensorView cache) {
  timed("mla_rope_cache_write", OpClass::NormRope,
        [&] { inner().mla_rope_cache_write(c, q, q_nope, q_rope, ckv, kv_norm, eps, r, b, cache); });
}
void ProfilingBackend::qk_norm_rope_kv_write(const ops::Context& c, TensorView q, TensorView k, TensorView v,
                                             TensorView q_norm, TensorView k_norm, float eps, const ops::RopeSpec& r,
                                             const ops::AttentionBatch& b, const ops::KvCacheLayer& cache) {
  timed("qk_norm_rope_kv_write", OpClass::NormRope,
        [&] { inner().qk_norm_rope_kv_write(c, q, k, v, q_norm, k_norm, eps, r, b, cache); });
}
void ProfilingBackend::attention(const ops::Context& c, TensorView q, const ops::KvCacheLayer& cache,
                                 const ops::AttentionBatch& b, float scale, TensorView out) {
  timed("attention", OpClass::Attention, [&] { inner().attention(c, q, cache, b, scale, out); });
}
void ProfilingBackend::mla_attention(const ops::Context& c, TensorView ql, TensorView qr, const ops::KvCacheLayer& cache,
                                     const ops::AttentionBatch& b, float scale, TensorView selected, TensorView out) {
  timed("mla_attention", OpClass::Attention, [&] { inner().mla_attention(c, ql, qr, cache, b, scale, selected, out); });
}
void ProfilingBackend::dsa_select(const ops::Context& c, TensorView q, TensorView w, const ops::KvCacheLayer& cache,
                                  const ops::AttentionBatch& b, float q_scale, float w_scale, TensorView selected) {
  timed("dsa_select", OpClass::Attention, [&] { inner().dsa_select(c, q, w, cache, b, q_scale, w_scale, selected); });
}
void ProfilingBackend::head_linear(const ops::Context& c, TensorView x, const ops::LinearWeight& w, int64_t head_stride,
                                   int64_t row0, int64_t n_rows, bool transposed, TensorView out) {
  timed("head_linear", OpClass::DenseGemm,
        [&] { inner().head_linear(c, x, w, head_stride, row0, n_rows, transposed, out); });
}
void ProfilingBackend::copy_columns(const ops::Context& c, TensorView src, int64_t s0, TensorView dst, int64_t d0,
                                    int64_t n) {
  timed("copy_columns", OpClass::Elementwise, [&] { inner().copy_columns(c, src, s0, dst, d0, n); });
}
void ProfilingBackend::silu_mul(const ops::Context& c, TensorView g, TensorView u, TensorView out) {
  timed("silu_mul", OpClass::Elementwise, [&] { inner().silu_mul(c, g, u, out); });
}
void ProfilingBackend::add(const ops::Context& c, TensorView a, TensorView b, TensorView out) {
  timed("add", OpClass::Elementwise, [&] { inner().add(c, a, b, out); });
}
void ProfilingBackend::route(const ops::Context& c, TensorView logits, const ops::RoutingSpec& spec, TensorView ids,
                             TensorView weights) {
  timed("route", OpClass::Moe, [&] { inner().route(c, logits, spec, ids, weights); });
}
void ProfilingBackend::moe_experts(const ops::Context& c, TensorView x, TensorView ids, TensorView weights,
                                   const ops::MoeExperts& experts, TensorView out) {
  timed("moe_experts", OpClass::Moe, [&] { inner().moe_experts(c, x, ids, weights, experts, out); });
}
void ProfilingBackend::gather_rows(const ops::Context& c, TensorView x, TensorView rows, TensorView out) {
  timed("gather_rows", OpClass::Elementwise, [&] { inner().gather_rows(c, x, rows, out); });
}
void ProfilingBackend::sample(const ops::Context& c, TensorView logits, TensorView rows, TensorView ids,
                              TensorView counts, TensorView out) {
  timed("sample", OpClass::Sampling, [&] { inner().sample(c, logits, rows, ids, counts, out); });
}

}  // namespace tetra::runtime

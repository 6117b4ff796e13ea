// A Backend that hands every call to another one. Wrappers that watch a backend (calibration
// records activations, profiling times ops) derive from it and override only what they watch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  Backend& inner() { return in_; }

  Device device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  Context& context() override { return in_.context(); }
  DType activation_dtype() const override { return in_.activation_dtype(); }
  DType kv_dtype() const override { return in_.kv_dtype(); }

  std::unique_ptr<Buffer> alloc(DType dtype, Shape shape) override { return in_.alloc(dtype, shape); }
  std::unique_ptr<Buffer> alloc_host(int64_t bytes) override { return in_.alloc_host(bytes); }
  void copy_from_host(TensorView dst, const void* src) override { in_.copy_from_host(dst, src); }
  void copy_from_host_async(const Context& c, TensorView dst, const void* src) override {
    in_.copy_from_host_async(c, dst, src);
  }
  void copy_to_host(void* dst, TensorView src) override { in_.copy_to_host(dst, src); }
  void fill_zero(TensorView dst) override { in_.fill_zero(dst); }
  MemoryInfo memory_info() const override { return in_.memory_info(); }
  LinearWeight upload(const LinearWeight& host) override { return in_.upload(host); }
  TensorView upload(TensorView host) override { return in_.upload(host); }
  std::unique_ptr<MoeExperts> prepare_experts(const std::vector<MlpWeights>& experts,
                                              const MlpWeights* shared) override {
    return in_.prepare_experts(experts, shared);
  }
  std::unique_ptr<Buffer> random_tensor(DType dtype, Shape shape, const RandomFill& fill, uint64_t seed) override {
    return in_.random_tensor(dtype, shape, fill, seed);
  }
  std::unique_ptr<MoeExperts> random_experts(const ExpertsSpec& spec, uint64_t seed) override {
    return in_.random_experts(spec, seed);
  }
  void warm_up(const Context& c, const std::vector<const MoeExperts*>& experts, int top_k,
               int64_t max_tokens) override {
    in_.warm_up(c, experts, top_k, max_tokens);
  }
  void synchronize() override { in_.synchronize(); }
  void make_current() override { in_.make_current(); }
  std::unique_ptr<Graph> capture(const Context& c, const std::function<void()>& body) override {
    return in_.capture(c, body);
  }

  void embedding(const Context& c, TensorView table, TensorView ids, TensorView out) override {
    in_.embedding(c, table, ids, out);
  }
  void rms_norm(const Context& c, TensorView x, TensorView w, float eps, TensorView out) override {
    in_.rms_norm(c, x, w, eps, out);
  }
  void add_rms_norm(const Context& c, TensorView h, TensorView delta, TensorView w, float eps,
                    TensorView out) override {
    in_.add_rms_norm(c, h, delta, w, eps, out);
  }
  void layer_norm(const Context& c, TensorView x, TensorView w, TensorView b, float eps, TensorView out) override {
    in_.layer_norm(c, x, w, b, eps, out);
  }
  void linear(const Context& c, TensorView x, const LinearWeight& w, TensorView out) override {
    in_.linear(c, x, w, out);
  }
  void linears(const Context& c, TensorView x, std::span<const LinearPart> parts) override { in_.linears(c, x, parts); }
  void rope(const Context& c, TensorView x, TensorView pos, const RopeSpec& r) override { in_.rope(c, x, pos, r); }
  void kv_write(const Context& c, TensorView k, TensorView v, const AttentionBatch& b,
                const KvCacheLayer& cache) override {
    in_.kv_write(c, k, v, b, cache);
  }
  void cache_write(const Context& c, TensorView rows, const AttentionBatch& b, TensorView cache) override {
    in_.cache_write(c, rows, b, cache);
  }
  void mla_rope_cache_write(const Context& c, TensorView q, TensorView q_nope, TensorView q_rope, TensorView ckv,
                            TensorView kv_norm, float eps, const RopeSpec& r, const AttentionBatch& b,
                            TensorView cache) override {
    in_.mla_rope_cache_write(c, q, q_nope, q_rope, ckv, kv_norm, eps, r, b, cache);
  }
  void qk_norm_rope_kv_write(const Context& c, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                             TensorView k_norm, float eps, const RopeSpec& r, const AttentionBatch& b,
                             const KvCacheLayer& cache) override {
    in_.qk_norm_rope_kv_write(c, q, k, v, q_norm, k_norm, eps, r, b, cache);
  }
  void attention(const Context& c, TensorView q, const KvCacheLayer& cache, const AttentionBatch& b, float scale,
                 TensorView out) override {
    in_.attention(c, q, cache, b, scale, out);
  }
  void mla_attention(const Context& c, TensorView ql, TensorView qr, const KvCacheLayer& cache,
                     const AttentionBatch& b, float scale, TensorView selected, TensorView out) override {
    in_.mla_attention(c, ql, qr, cache, b, scale, selected, out);
  }
  void dsa_select(const Context& c, TensorView q, TensorView w, const KvCacheLayer& cache, const AttentionBatch& b,
                  float q_scale, float w_scale, TensorView selected) override {
    in_.dsa_select(c, q, w, cache, b, q_scale, w_scale, selected);
  }
  void head_linear(const Context& c, TensorView x, const LinearWeight& w, int64_t head_stride, int64_t row0,
                   int64_t n_rows, bool transposed, TensorView out) override {
    in_.head_linear(c, x, w, head_stride, row0, n_rows, transposed, out);
  }
  void copy_columns(const Context& c, TensorView src, int64_t s0, TensorView dst, int64_t d0, int64_t n) override {
    in_.copy_columns(c, src, s0, dst, d0, n);
  }
  void silu_mul(const Context& c, TensorView g, TensorView u, TensorView out) override { in_.silu_mul(c, g, u, out); }
  void add(const Context& c, TensorView a, TensorView b, TensorView out) override { in_.add(c, a, b, out); }
  void route(const Context& c, TensorView logits, const RoutingSpec& spec, TensorView ids,
             TensorView weights) override {
    in_.route(c, logits, spec, ids, weights);
  }
  void moe_experts(const Context& c, TensorView x, TensorView ids, TensorView weights, const MoeExperts& experts,
                   TensorView out) override {
    in_.moe_experts(c, x, ids, weights, experts, out);
  }
  void gather_rows(const Context& c, TensorView x, TensorView rows, TensorView out) override {
    in_.gather_rows(c, x, rows, out);
  }
  void sample(const Context& c, TensorView logits, TensorView rows, TensorView ids, TensorView counts,
              TensorView out) override {
    in_.sample(c, logits, rows, ids, counts, out);
  }

 private:
  Backend& in_;
};

}  // namespace tetra::ops

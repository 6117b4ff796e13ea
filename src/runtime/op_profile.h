// Where a forward's time goes, op by op: a Backend wrapper that, while enabled, waits for the
// device before and after each op and reads the host clock between, so each op's figure is
// its own time on the device plus one wait's round trip (sync_overhead(), measured on an idle
// stream, is taken off). For `tetra bench decode`'s eager profiling pass; a graph replay runs
// no op through it, so profile with CUDA graphs off.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ops/forwarding_backend.h"

namespace tetra::runtime {

// The op classes of the breakdown.
enum class OpClass : uint8_t { Attention, Moe, DenseGemm, NormRope, Elementwise, Sampling };
const char* op_class_name(OpClass c);  // "attention", "moe", "dense GEMMs", ...

struct OpTime {
  OpClass cls = OpClass::Elementwise;
  int64_t calls = 0;
  double seconds = 0;
};

class ProfilingBackend final : public ops::ForwardingBackend {
 public:
  explicit ProfilingBackend(std::unique_ptr<ops::Backend> inner);

  void enable(bool on) { enabled_ = on; }
  void reset() { times_.clear(); }
  // By op ("linear 4096x2048" names a linear by its weight's shape).
  const std::map<std::string, OpTime>& times() const { return times_; }
  double sync_overhead() const { return sync_overhead_; }

  std::string name() const override { return owned_->name() + " (profiling)"; }
  void embedding(const ops::Context& c, TensorView table, TensorView ids, TensorView out) override;
  void rms_norm(const ops::Context& c, TensorView x, TensorView w, float eps, TensorView out) override;
  void add_rms_norm(const ops::Context& c, TensorView h, TensorView delta, TensorView w, float eps,
                    TensorView out) override;
  void layer_norm(const ops::Context& c, TensorView x, TensorView w, TensorView b, float eps, TensorView out) override;
  void linear(const ops::Context& c, TensorView x, const ops::LinearWeight& w, TensorView out) override;
  void linears(const ops::Context& c, TensorView x, std::span<const ops::LinearPart> parts) override;
  void rope(const ops::Context& c, TensorView x, TensorView pos, const ops::RopeSpec& r) override;
  void kv_write(const ops::Context& c, TensorView k, TensorView v, const ops::AttentionBatch& b,
                const ops::KvCacheLayer& cache) override;
  void cache_write(const ops::Context& c, TensorView rows, const ops::AttentionBatch& b, TensorView cache) override;
  void mla_rope_cache_write(const ops::Context& c, TensorView q, TensorView q_nope, TensorView q_rope, TensorView ckv,
                            TensorView kv_norm, float eps, const ops::RopeSpec& r, const ops::AttentionBatch& b,
                            TensorView cache) override;
  void qk_norm_rope_kv_write(const ops::Context& c, TensorView q, TensorView k, TensorView v, TensorView q_norm,
                             TensorView k_norm, float eps, const ops::RopeSpec& r, const ops::AttentionBatch& b,
                             const ops::KvCacheLayer& cache) override;
  void attention(const ops::Context& c, TensorView q, const ops::KvCacheLayer& cache, const ops::AttentionBatch& b,
                 float scale, TensorView out) override;
  void mla_attention(const ops::Context& c, TensorView ql, TensorView qr, const ops::KvCacheLayer& cache,
                     const ops::AttentionBatch& b, float scale, TensorView selected, TensorView out) override;
  void dsa_select(const ops::Context& c, TensorView q, TensorView w, const ops::KvCacheLayer& cache,
                  const ops::AttentionBatch& b, float q_scale, float w_scale, TensorView selected) override;
  void head_linear(const ops::Context& c, TensorView x, const ops::LinearWeight& w, int64_t head_stride,
                   int64_t row0, int64_t n_rows, bool transposed, TensorView out) override;
  void copy_columns(const ops::Context& c, TensorView src, int64_t s0, TensorView dst, int64_t d0,
                    int64_t n) override;
  void silu_mul(const ops::Context& c, TensorView g, TensorView u, TensorView out) override;
  void add(const ops::Context& c, TensorView a, TensorView b, TensorView out) override;
  void route(const ops::Context& c, TensorView logits, const ops::RoutingSpec& spec, TensorView ids,
             TensorView weights) override;
  void moe_experts(const ops::Context& c, TensorView x, TensorView ids, TensorView weights,
                   const ops::MoeExperts& experts, TensorView out) override;
  void gather_rows(const ops::Context& c, TensorView x, TensorView rows, TensorView out) override;
  void sample(const ops::Context& c, TensorView logits, TensorView rows, TensorView ids, TensorView counts,
              TensorView out) override;

 private:
  template <class F>
  void timed(const std::string& op, OpClass cls, F&& run);

  std::unique_ptr<ops::Backend> owned_;
  bool enabled_ = false;
  double sync_overhead_ = 0;
  std::map<std::string, OpTime> times_;
};

}  // namespace tetra::runtime

// The CPU reference backend: fp32 arithmetic, weights read in their stored dtype, work split
// over a thread pool. Clear over clever: it is what every fast path is checked against.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops::cpu {

// Reads element i of a tensor of a float-like dtype (F32, BF16, F16) as f32.
float load_f32(const TensorView& t, int64_t i);

// Decodes row `row` of a linear weight (any WeightFormat) into out[0 .. n_in).
void decode_weight_row(const LinearWeight& w, int64_t row, float* out);

// out[T, n_out] = x[T, n_in] W^T (+ bias); x and out F32.
void linear_f32(ThreadPool* pool, const float* x, int64_t n_tokens, const LinearWeight& w, float* out);

// --moe-activation-dtype fp8_e4m3 (W4A8, see w4a8.cpp): activations rounded to E4M3 with one
// scale per token per kFp8ActivationGroup input channels.
inline constexpr int64_t kFp8ActivationGroup = 128;
struct Fp8Activations {
  std::vector<float> values;  // [T, n_in]: the E4M3 values, decoded
  std::vector<float> scales;  // [T, groups]: amax / 448 of each group (1 for an all-zero group)
  int64_t n_in = 0, groups = 0;
};
Fp8Activations quantize_activations_fp8(const float* x, int64_t n_tokens, int64_t n_in);
// out[T, n_out] = x W^T (+ bias) as an E4M3 MMA computes it from an NVFP4 weight: x as above,
// each weight value folded with its block scale into one E4M3 value.
void linear_w4a8(ThreadPool* pool, const float* x, int64_t n_tokens, const LinearWeight& w, float* out);

// The cache slot of position `pos` of sequence `seq`, through the batch's block tables.
inline int64_t cache_slot(const AttentionBatch& b, int64_t seq, int64_t pos) {
  const int32_t block = b.block_tables.as<const int32_t>()[seq * b.max_blocks_per_seq + pos / b.block_size];
  return int64_t(block) * b.block_size + pos % b.block_size;
}
// The sequence each token of the batch belongs to.
std::vector<int32_t> sequence_of_tokens(const AttentionBatch& b);

// Row `row` (of `width` values) of a KV cache tensor as F32: a pointer into an F32 cache, or
// an F8_E4M3 one (stored as e4m3(x / scale)) decoded as f32(e4m3) * scale into buf[width].
const float* cache_row(TensorView cache, int64_t row, int64_t width, float scale, float* buf);

void rope(ThreadPool* pool, TensorView x, TensorView positions, const RopeSpec& rope);
void kv_write(TensorView k, TensorView v, const AttentionBatch& batch, const KvCacheLayer& cache);
void attention(ThreadPool* pool, TensorView q, const KvCacheLayer& cache, const AttentionBatch& batch,
               float scale, TensorView out);

// Rows [T, width] to their slots of a cache tensor; an F8_E4M3 one stores e4m3(x / scale).
void cache_write(TensorView rows, const AttentionBatch& batch, TensorView cache, float scale = 1.0f);
void mla_attention(ThreadPool* pool, TensorView q_latent, TensorView q_rope, const KvCacheLayer& cache,
                   const AttentionBatch& batch, float scale, TensorView selected, TensorView out);
void dsa_select(TensorView q, TensorView weights, const KvCacheLayer& cache, const AttentionBatch& batch,
                float q_scale, float weight_scale, TensorView selected);
void head_linear(ThreadPool* pool, TensorView x, const LinearWeight& w, int64_t head_stride,
                 int64_t row0, int64_t n_rows, bool transposed, TensorView out);

// Fills a host tensor with dummy values (see RandomFill); the same stream for a given seed.
void fill_random(TensorView t, const RandomFill& fill, uint64_t seed);

void route(TensorView logits, const RoutingSpec& spec, TensorView ids, TensorView weights);

// The CPU reads experts where they are (the checkpoint's mapping); dummy experts own theirs.
// With fp8_activations (W4A8), every NVFP4 linear among them runs as linear_w4a8.
class CpuExperts : public MoeExperts {
 public:
  CpuExperts(std::vector<MlpWeights> experts, std::optional<MlpWeights> shared, bool fp8_activations,
             std::vector<std::unique_ptr<Buffer>> storage = {});
  int64_t n_experts() const override { return int64_t(experts_.size()); }
  const MlpWeights& expert(int64_t e) const { return experts_[size_t(e)]; }
  const MlpWeights* shared() const { return shared_ ? &*shared_ : nullptr; }
  bool fp8_activations() const { return fp8_activations_; }

 private:
  std::vector<MlpWeights> experts_;
  std::optional<MlpWeights> shared_;
  bool fp8_activations_;
  std::vector<std::unique_ptr<Buffer>> storage_;
};

void moe_experts(ThreadPool* pool, TensorView x, TensorView ids, TensorView weights,
                 const CpuExperts& experts, TensorView out);

}  // namespace tetra::ops::cpu

// The backend a command asks for (--device): the CPU reference, or the CUDA backend where
// this build has it and a GPU answers.
#include "ops/ops.h"
#ifdef TETRA_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace tetra::ops {

void Backend::mla_rope_cache_write(const Context& ctx, TensorView q, TensorView q_nope, TensorView q_rope,
                                   TensorView ckv, TensorView kv_norm, float eps, const RopeSpec& rope_spec,
                                   const AttentionBatch& batch, TensorView cache) {
  const int64_t t = q.dim(0), heads = q.dim(1), dn = q_nope.dim(2), dr = q_rope.dim(2), rank = kv_norm.numel();
  TETRA_CHECK(q.shape.rank == 3 && q.dim(2) == dn + dr && q_nope.dim(0) == t && q_rope.dim(0) == t &&
                  q_nope.dim(1) == heads && q_rope.dim(1) == heads && ckv.shape.rank == 2 && ckv.dim(0) == t &&
                  ckv.dim(1) == rank + dr,
              "mla_rope_cache_write: q ", q.shape.str(), ", q_nope ", q_nope.shape.str(), ", q_rope ",
              q_rope.shape.str(), " and ckv ", ckv.shape.str(), " do not agree with a latent of ", rank);
  const TensorView q_rows = q.reshaped({t * heads, dn + dr});
  copy_columns(ctx, q_rows, 0, q_nope.reshaped({t * heads, dn}), 0, dn);
  copy_columns(ctx, q_rows, dn, q_rope.reshaped({t * heads, dr}), 0, dr);
  rope(ctx, q_rope, batch.positions, rope_spec);
  // Each row's two parts are contiguous views of it: no scratch.
  const int64_t value_bytes = dtype_bits(ckv.dtype) / 8;
  for (int64_t i = 0; i < t; ++i) {
    const TensorView row = ckv.rows(i, i + 1);
    const TensorView latent{row.data, ckv.dtype, Shape{1, rank}, ckv.device};
    const TensorView k_rope{static_cast<char*>(row.data) + rank * value_bytes, ckv.dtype, Shape{1, 1, dr}, ckv.device};
    rms_norm(ctx, latent, kv_norm, eps, latent);
    rope(ctx, k_rope, batch.positions.rows(i, i + 1), rope_spec);
  }
  cache_write(ctx, ckv, batch, cache);
}

bool cuda_device_available() {
#ifdef TETRA_HAVE_CUDA
  return cuda::cuda_device_present();
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TETRA_HAVE_CUDA
  return cuda::cuda_device_count();
#else
  return 0;
#endif
}

std::optional<DType> parse_auto_or_fp8(const std::string& text, const std::string& flag) {
  if (text == "auto") return std::nullopt;
  if (text == "fp8_e4m3" || text == "fp8") return DType::F8_E4M3;
  fail(flag, " must be auto or fp8_e4m3, not '", text, "'");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  TETRA_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "--device must be cpu, cuda or auto, not '",
              o.device, "'");
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_available());
  if (!cuda) return make_cpu_backend(o.n_threads, o.kv_cache_dtype.value_or(DType::F32),
                                     o.moe_activation_dtype.value_or(DType::F32));
#ifdef TETRA_HAVE_CUDA
  TETRA_CHECK(!o.moe_activation_dtype, "--moe-activation-dtype fp8_e4m3: the W4A8 expert kernels are not on the GPU "
              "yet; --device cpu runs the reference to measure its accuracy (tetra eval)");
  return cuda::make_cuda_backend({.device_index = o.device_index,
                                  .moe_tune_cache = o.moe_tune_cache,
                                  .moe_autotune = o.moe_autotune,
                                  .pdl = o.pdl,
                                  .kv_dtype = o.kv_cache_dtype.value_or(DType::BF16)});
#else
  fail("--device cuda: this build of tetra has no CUDA backend (it was built without nvcc or with TETRA_CUDA=OFF)");
#endif
}

}  // namespace tetra::ops

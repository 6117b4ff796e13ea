// The backend a command asks for (--device): the CPU reference, or the CUDA backend where
// this build has it and a GPU answers.
#include "ops/ops.h"
#ifdef TETRA_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace tetra::ops {

bool cuda_device_available() {
#ifdef TETRA_HAVE_CUDA
  return cuda::cuda_device_present();
#else
  return false;
#endif
}

std::optional<DType> parse_kv_cache_dtype(const std::string& text, const std::string& flag) {
  if (text == "auto") return std::nullopt;
  if (text == "fp8_e4m3" || text == "fp8") return DType::F8_E4M3;
  fail(flag, " must be auto or fp8_e4m3, not '", text, "'");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  TETRA_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "--device must be cpu, cuda or auto, not '",
              o.device, "'");
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_available());
  if (!cuda) return make_cpu_backend(o.n_threads, o.kv_cache_dtype.value_or(DType::F32));
#ifdef TETRA_HAVE_CUDA
  // The CUDA attention and cache-write kernels take BF16 rows; an F8 cache would be misread.
  TETRA_CHECK(!o.kv_cache_dtype,
              "--kv-cache-dtype fp8_e4m3: the CUDA kernels do not read an FP8 KV cache yet; use "
              "--kv-cache-dtype auto on the GPU, or --device cpu");
  return cuda::make_cuda_backend({.device_index = o.device_index,
                                  .moe_tune_cache = o.moe_tune_cache,
                                  .moe_autotune = o.moe_autotune,
                                  .pdl = o.pdl});
#else
  fail("--device cuda: this build of tetra has no CUDA backend (it was built without nvcc or with TETRA_CUDA=OFF)");
#endif
}

}  // namespace tetra::ops

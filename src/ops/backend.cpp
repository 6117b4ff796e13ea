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

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  TETRA_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "--device must be cpu, cuda or auto, not '",
              o.device, "'");
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_available());
  if (!cuda) return make_cpu_backend(o.n_threads);
#ifdef TETRA_HAVE_CUDA
  return cuda::make_cuda_backend({.device_index = o.device_index,
                                  .moe_tune_cache = o.moe_tune_cache,
                                  .moe_autotune = o.moe_autotune,
                                  .pdl = o.pdl});
#else
  fail("--device cuda: this build of tetra has no CUDA backend (it was built without nvcc or with TETRA_CUDA=OFF)");
#endif
}

}  // namespace tetra::ops

// Packing routed experts into the device layout of the MoE kernels (moe_internal.h).
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/moe_internal.h"

namespace tetra::ops::cuda {

CudaMoeExperts::CudaMoeExperts(const MoeShape& s, WeightFormat f) : shape(s), format(f) {
  TETRA_CHECK(f == WeightFormat::Nvfp4 || f == WeightFormat::Dense,
              "moe: experts must be NVFP4 or BF16");
  TETRA_CHECK(s.hidden > 0 && s.intermediate > 0 && s.n_experts > 0, "moe: empty expert shape");
  // The GEMM kernels walk K in chunks of 128 and N in blocks of 64 (gate/up) and 128 (down).
  TETRA_CHECK(s.hidden % 128 == 0 && s.intermediate % 128 == 0,
              "moe: the CUDA kernels need hidden and intermediate sizes that are multiples of 128 "
              "(got ", s.hidden, " and ", s.intermediate, ")");
  const int64_t n = n_stored();
  TETRA_CUDA_CHECK(cudaMalloc(&w13, n * w13_expert_bytes()));
  TETRA_CUDA_CHECK(cudaMalloc(&w2, n * w2_expert_bytes()));
  if (f == WeightFormat::Nvfp4) {
    TETRA_CUDA_CHECK(cudaMalloc(&w13_scale, n * w13_scale_expert_bytes()));
    TETRA_CUDA_CHECK(cudaMalloc(&w2_scale, n * w2_scale_expert_bytes()));
  }
  TETRA_CUDA_CHECK(cudaMalloc(&global_scale, n * 3 * sizeof(float)));
  tuner = std::make_unique<MoeTuner>(moe_tune_cache_path());
}

CudaMoeExperts::~CudaMoeExperts() {
  // Errors are ignored here: a destructor must not throw, and the memory is gone either way.
  cudaFree(w13);
  cudaFree(w2);
  cudaFree(w13_scale);
  cudaFree(w2_scale);
  cudaFree(global_scale);
}

int64_t CudaMoeExperts::w13_expert_bytes() const {
  const int64_t n = 2 * shape.intermediate * shape.hidden;
  return format == WeightFormat::Nvfp4 ? n / 2 : n * 2;
}
int64_t CudaMoeExperts::w2_expert_bytes() const {
  const int64_t n = shape.hidden * shape.intermediate;
  return format == WeightFormat::Nvfp4 ? n / 2 : n * 2;
}
int64_t CudaMoeExperts::w13_scale_expert_bytes() const {
  return format == WeightFormat::Nvfp4 ? 2 * shape.intermediate * shape.hidden / 16 : 0;
}
int64_t CudaMoeExperts::w2_scale_expert_bytes() const {
  return format == WeightFormat::Nvfp4 ? shape.hidden * shape.intermediate / 16 : 0;
}

const MoeShape& experts_shape(const MoeExperts& experts) {
  return dynamic_cast<const CudaMoeExperts&>(experts).shape;
}

int64_t experts_bytes_per_expert(const MoeExperts& experts) {
  const auto& ex = dynamic_cast<const CudaMoeExperts&>(experts);
  return ex.w13_expert_bytes() + ex.w2_expert_bytes() + ex.w13_scale_expert_bytes() +
         ex.w2_scale_expert_bytes();
}

namespace {

// A host copy of a view's bytes (device views are copied down first).
std::vector<uint8_t> host_bytes(cudaStream_t stream, TensorView v) {
  std::vector<uint8_t> out(size_t(v.nbytes()));
  if (v.device == Device::Cuda)
    copy_and_wait(stream, out.data(), v.data, out.size(), cudaMemcpyDeviceToHost);
  else
    std::memcpy(out.data(), v.data, out.size());
  return out;
}

void check_linear(const LinearWeight& w, WeightFormat format, int64_t n_out, int64_t n_in,
                  const char* what) {
  TETRA_CHECK(w.format == format, "moe: every expert matrix must have the same format (", what, ")");
  TETRA_CHECK(w.n_out == n_out && w.n_in == n_in, "moe: expert ", what, " is [", w.n_out, ", ",
              w.n_in, "], expected [", n_out, ", ", n_in, "]");
  TETRA_CHECK(w.bias.empty(), "moe: expert biases are not supported on CUDA");
  if (format == WeightFormat::Nvfp4) {
    TETRA_CHECK(w.weight.dtype == DType::U8 && w.weight.numel() == n_out * n_in / 2,
                "moe: NVFP4 ", what, " weight must be U8 [n_out, n_in/2]");
    TETRA_CHECK(w.block_scale.dtype == DType::F8_E4M3 && w.block_scale.numel() == n_out * n_in / 16,
                "moe: NVFP4 ", what, " block scales must be F8_E4M3 [n_out, n_in/16]");
  } else {
    TETRA_CHECK((w.weight.dtype == DType::BF16 || w.weight.dtype == DType::F32) &&
                    w.weight.numel() == n_out * n_in,
                "moe: dense ", what, " weight must be BF16 or F32 [n_out, n_in]");
  }
}

// Appends a matrix's weight bytes in the device layout (NVFP4 words permuted; dense as BF16).
void append_weight(cudaStream_t stream, std::vector<uint8_t>& dst, const LinearWeight& w) {
  std::vector<uint8_t> src = host_bytes(stream, w.weight);
  if (w.format == WeightFormat::Nvfp4) {
    static_assert(sizeof(uint32_t) == 4, "NVFP4 words are 8 values");
    const size_t at = dst.size();
    dst.resize(at + src.size());
    for (size_t i = 0; i < src.size(); i += 4) {
      uint32_t word;
      std::memcpy(&word, src.data() + i, 4);
      word = nvfp4_permute_word(word);
      std::memcpy(dst.data() + at + i, &word, 4);
    }
  } else if (w.weight.dtype == DType::BF16) {
    dst.insert(dst.end(), src.begin(), src.end());
  } else {
    const size_t n = src.size() / 4, at = dst.size();
    dst.resize(at + 2 * n);
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, src.data() + 4 * i, 4);
      const uint16_t b = f32_to_bf16(f);
      std::memcpy(dst.data() + at + 2 * i, &b, 2);
    }
  }
}

void append_scale(cudaStream_t stream, std::vector<uint8_t>& dst, const LinearWeight& w) {
  std::vector<uint8_t> src = host_bytes(stream, w.block_scale);
  dst.insert(dst.end(), src.begin(), src.end());
}

}  // namespace

std::unique_ptr<MoeExperts> prepare_experts(const Context& ctx, const std::vector<MlpWeights>& experts,
                                            const MlpWeights* shared) {
  TETRA_CHECK(!experts.empty(), "moe: no experts to prepare");
  const LinearWeight& g0 = experts[0].gate;
  MoeShape shape{g0.n_in, g0.n_out, int(experts.size()), shared != nullptr};
  const WeightFormat format = g0.format;
  auto ex = std::make_unique<CudaMoeExperts>(shape, format);
  auto stream = static_cast<cudaStream_t>(ctx.stream);

  std::vector<const MlpWeights*> all;
  for (const MlpWeights& m : experts) all.push_back(&m);
  if (shared) all.push_back(shared);
  std::vector<float> gscale;
  for (size_t e = 0; e < all.size(); ++e) {
    const MlpWeights& m = *all[e];
    check_linear(m.gate, format, shape.intermediate, shape.hidden, "gate");
    check_linear(m.up, format, shape.intermediate, shape.hidden, "up");
    check_linear(m.down, format, shape.hidden, shape.intermediate, "down");
    std::vector<uint8_t> w13, w2, s13, s2;
    append_weight(stream, w13, m.gate);
    append_weight(stream, w13, m.up);
    append_weight(stream, w2, m.down);
    auto* d13 = static_cast<uint8_t*>(ex->w13) + e * ex->w13_expert_bytes();
    auto* d2 = static_cast<uint8_t*>(ex->w2) + e * ex->w2_expert_bytes();
    copy_and_wait(stream, d13, w13.data(), w13.size(), cudaMemcpyHostToDevice);
    copy_and_wait(stream, d2, w2.data(), w2.size(), cudaMemcpyHostToDevice);
    if (format == WeightFormat::Nvfp4) {
      append_scale(stream, s13, m.gate);
      append_scale(stream, s13, m.up);
      append_scale(stream, s2, m.down);
      copy_and_wait(stream, ex->w13_scale + e * ex->w13_scale_expert_bytes(), s13.data(), s13.size(),
               cudaMemcpyHostToDevice);
      copy_and_wait(stream, ex->w2_scale + e * ex->w2_scale_expert_bytes(), s2.data(), s2.size(),
               cudaMemcpyHostToDevice);
      gscale.insert(gscale.end(), {m.gate.global_scale, m.up.global_scale, m.down.global_scale});
    } else {
      gscale.insert(gscale.end(), {1.0f, 1.0f, 1.0f});
    }
  }
  copy_and_wait(stream, ex->global_scale, gscale.data(), gscale.size() * sizeof(float), cudaMemcpyHostToDevice);
  return ex;
}

std::unique_ptr<MoeExperts> random_experts(const Context& ctx, const MoeShape& shape,
                                           WeightFormat format, uint64_t seed) {
  auto ex = std::make_unique<CudaMoeExperts>(shape, format);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t n = ex->n_stored();
  if (format == WeightFormat::Nvfp4) {
    // Any byte is a valid pair of e2m1 codes; scales in [0.5, 0.94] and a global scale of
    // 1/128 keep activations of unit size finite through both GEMMs.
    launch_fill_random_bytes(stream, static_cast<uint8_t*>(ex->w13), n * ex->w13_expert_bytes(), seed, 0, 256);
    launch_fill_random_bytes(stream, static_cast<uint8_t*>(ex->w2), n * ex->w2_expert_bytes(), seed + 1, 0, 256);
    launch_fill_random_bytes(stream, ex->w13_scale, n * ex->w13_scale_expert_bytes(), seed + 2, 0x30, 8);
    launch_fill_random_bytes(stream, ex->w2_scale, n * ex->w2_scale_expert_bytes(), seed + 3, 0x30, 8);
  } else {
    launch_fill_random_bf16(stream, static_cast<uint16_t*>(ex->w13), n * ex->w13_expert_bytes() / 2, seed, 0.03f);
    launch_fill_random_bf16(stream, static_cast<uint16_t*>(ex->w2), n * ex->w2_expert_bytes() / 2, seed + 1, 0.03f);
  }
  std::vector<float> gscale(size_t(n) * 3, format == WeightFormat::Nvfp4 ? 1.0f / 128 : 1.0f);
  copy_and_wait(stream, ex->global_scale, gscale.data(), gscale.size() * sizeof(float), cudaMemcpyHostToDevice);
  return ex;
}

}  // namespace tetra::ops::cuda

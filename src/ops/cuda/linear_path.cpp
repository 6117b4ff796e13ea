#include "ops/cuda/linear_path.h"

#include "ops/cuda/gemm_skinny.h"
#include "ops/cuda/gemv.h"

namespace tetra::ops::cuda {

namespace {
constexpr int64_t kFewRows = 512;
constexpr int64_t kLargeWeightBytes = int64_t(48) << 20;
constexpr int64_t kSkinnyMaxTokensAlone = 16;
}  // namespace

DenseLinearPath dense_linear_path(int64_t tokens, std::span<const LinearPart> parts) {
  int64_t rows = 0, bytes = 0;
  for (const LinearPart& p : parts) {
    rows += p.weight->n_out;
    bytes += p.weight->weight.nbytes();
  }
  if (tokens <= 1) return DenseLinearPath::Gemv;
  if (rows < kFewRows) return tokens <= kGemvMaxTokens ? DenseLinearPath::Gemv : DenseLinearPath::Library;
  if (bytes >= kLargeWeightBytes) return DenseLinearPath::Library;
  const int64_t max_tokens = parts.size() > 1 ? kSkinnyMaxTokens : kSkinnyMaxTokensAlone;
  return tokens <= max_tokens ? DenseLinearPath::Skinny : DenseLinearPath::Library;
}

}  // namespace tetra::ops::cuda

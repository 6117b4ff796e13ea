// Which kernel runs a dense linear launch (ops/cuda/linear_path.h), checked on the CPU for the
// shapes `tetra bench linear` measured: the rule is host code, and a change to it should be
// a decision, with its figures in docs/PERF.md, not an accident.
#include "ops/cuda/linear_path.h"

#include <gtest/gtest.h>

#include <vector>

namespace tetra::ops::cuda {
namespace {

using Path = DenseLinearPath;

// A launch of BF16 linears of width n_in with these output rows (the weights' bytes are what
// the rule reads; no memory behind them).
struct Launch {
  std::vector<LinearWeight> w;
  std::vector<LinearPart> parts;
  Launch(std::vector<int64_t> rows, int64_t n_in) {
    for (int64_t n : rows) {
      LinearWeight lw;
      lw.weight = TensorView{nullptr, DType::BF16, {n, n_in}, Device::Cuda};
      lw.n_out = n;
      lw.n_in = n_in;
      w.push_back(lw);
    }
    for (const LinearWeight& lw : w) parts.push_back({&lw, TensorView{}});
  }
  Launch(const Launch&) = delete;  // parts point into w
  Path at(int64_t tokens) const { return dense_linear_path(tokens, parts); }
};

TEST(DenseLinearPath, OneTokenIsTheGemv) {
  for (const Launch& l : {Launch({4096, 512, 512}, 2048), Launch({151936}, 2048), Launch({128}, 2048)})
    EXPECT_EQ(l.at(1), Path::Gemv);
}

TEST(DenseLinearPath, RoutersStayOnTheGemvUpTo8Tokens) {
  const Launch qwen3({128}, 2048), glm5({256}, 6144);
  for (const Launch* l : {&qwen3, &glm5}) {
    EXPECT_EQ(l->at(8), Path::Gemv);
    EXPECT_EQ(l->at(9), Path::Library);
    EXPECT_EQ(l->at(64), Path::Library);
  }
}

TEST(DenseLinearPath, LargeWeightsGoToTheLibraryFrom2Tokens) {
  // GLM-5's q_b (67 MB) and o_proj (201 MB), Qwen3's lm_head (622 MB).
  for (const Launch& l : {Launch({16384}, 2048), Launch({6144}, 16384), Launch({151936}, 2048)}) {
    EXPECT_EQ(l.at(2), Path::Library);
    EXPECT_EQ(l.at(16), Path::Library);
  }
}

TEST(DenseLinearPath, TheSkinnyKernelTakesTheRestUpTo16AloneAnd64InParts) {
  const Launch o_proj({2048}, 4096), qkv({4096, 512, 512}, 2048), q_a_kv_a({2048, 576}, 6144);
  EXPECT_EQ(o_proj.at(2), Path::Skinny);
  EXPECT_EQ(o_proj.at(16), Path::Skinny);
  EXPECT_EQ(o_proj.at(17), Path::Library);
  for (const Launch* l : {&qkv, &q_a_kv_a}) {
    EXPECT_EQ(l->at(2), Path::Skinny);
    EXPECT_EQ(l->at(64), Path::Skinny);
    EXPECT_EQ(l->at(65), Path::Library);
  }
}

}  // namespace
}  // namespace tetra::ops::cuda

// Checkpoints as save_pretrained writes them from a BF16 model: the router's
// e_score_correction_bias stored as BF16 or F16 (transformers upcasts it to F32 when it
// loads). tetra must load them the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "fixtures.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "model/model.h"
#include "runtime/generate.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

// A copy of `src` whose correction biases are stored in `dtype` (rounded from the F32 ones).
fs::path with_bias_dtype(const fs::path& src, DType dtype, const std::string& tag) {
  const fs::path dst = fs::path(::testing::TempDir()) / ("tetra_bias_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().extension() != ".safetensors") fs::copy_file(e.path(), dst / e.path().filename());
  auto ckpt = Checkpoint::open(src);
  std::vector<TensorDecl> decls;
  for (const std::string& name : ckpt->names()) {
    const TensorInfo* info = ckpt->find(name);
    const bool bias = name.find("e_score_correction_bias") != std::string::npos;
    decls.push_back({name, bias ? dtype : info->dtype, info->shape});
  }
  SafetensorsWriter w(dst / "model.safetensors", decls);
  for (const TensorDecl& d : decls) {
    const TensorView t = ckpt->get(d.name);
    if (d.dtype == t.dtype) {
      w.write(d.name, t);
      continue;
    }
    std::vector<uint16_t> narrow(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = t.as<const float>()[i];
      narrow[size_t(i)] = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    w.write(d.name, narrow.data(), narrow.size() * 2);
  }
  w.finish();
  return dst;
}

TEST(CheckpointDtypes, NarrowCorrectionBiasLoadsAsTransformersUpcastsIt) {
  const fs::path src = testing::fixtures_dir() / "glm4_moe-tiny";
  auto backend = ops::make_cpu_backend(2);
  const auto c = testing::read_cases(src).at(0);
  const runtime::GenerateOptions opts{.max_new_tokens = c.max_new_tokens, .ignore_eos = true};
  for (const auto& [dtype, tag] : {std::pair{DType::BF16, "bf16"}, std::pair{DType::F16, "f16"}}) {
    const fs::path dir = with_bias_dtype(src, dtype, tag);
    auto model = model::load_model(dir, *backend);  // refused before: "must be stored as F32"
    const auto r = runtime::generate(*model, *backend, c.prompt_ids, opts);
    // The biases moved by one rounding (about 2^-9 of their size); routing only chooses by
    // them, so the fixture's tokens stay, with log-probs near transformers' F32 run.
    EXPECT_EQ(r.token_ids, c.token_ids) << tag;
    for (size_t i = 0; i < r.logprobs.size(); ++i) EXPECT_NEAR(r.logprobs[i], c.logprobs[i], 1e-2) << tag << " " << i;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace tetra

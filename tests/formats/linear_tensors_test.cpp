// load_linear: each module's format comes from the quant config (MIXED_PRECISION with FP8 and
// NVFP4 layers, exclusions), every dtype and shape is checked, and a mismatch names the file
// and the tensor.
#include "formats/linear_tensors.h"

#include <unistd.h>

#include <functional>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/nvfp4.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  fs::path dir;
  std::vector<float> w;  // the NVFP4 module's source weight [4, 32]
  std::vector<uint8_t> packed, scales;  // and its quantized form
  Fixture() {
    dir = fs::temp_directory_path() / ("tetra_linear_tensors_test_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Fixture() { fs::remove_all(dir); }
};

// A checkpoint with: an NVFP4 expert (W4A4 with input_scale), an FP8 dense layer (scale [1]),
// a BF16 attention projection with a bias, and broken modules.
void write_checkpoint(Fixture& f) {
  f.w.resize(4 * 32);
  for (size_t i = 0; i < f.w.size(); ++i) f.w[i] = bf16_to_f32(f32_to_bf16(0.01f * float(int(i) - 60)));
  std::vector<uint8_t>& packed = f.packed;
  std::vector<uint8_t>& scales = f.scales;
  packed.resize(4 * 16);
  scales.resize(4 * 2);
  const float gs = nvfp4::global_scale_from_amax(0.67f);
  for (int r = 0; r < 4; ++r)
    nvfp4::quantize_row(f.w.data() + r * 32, 32, gs, packed.data() + r * 16, scales.data() + r * 2);
  const float is = 0.5f, fp8_scale = 0.25f;
  std::vector<uint8_t> fp8(8 * 32);
  for (size_t i = 0; i < fp8.size(); ++i) fp8[i] = f32_to_e4m3(float(int(i % 9) - 4));
  std::vector<uint16_t> bf(8 * 32, f32_to_bf16(1.5f)), bias(8, f32_to_bf16(-2.0f));
  const std::string e = "model.layers.1.mlp.experts.0.gate_proj";
  const std::string d = "model.layers.0.mlp.down_proj";
  const std::string a = "model.layers.0.self_attn.q_proj";
  std::vector<TensorDecl> decls = {
      {e + ".weight", DType::U8, Shape{4, 16}},
      {e + ".weight_scale", DType::F8_E4M3, Shape{4, 2}},
      {e + ".weight_scale_2", DType::F32, Shape{}},
      {e + ".input_scale", DType::F32, Shape{}},
      {d + ".weight", DType::F8_E4M3, Shape{8, 32}},
      {d + ".weight_scale", DType::F32, Shape{1}},
      {a + ".weight", DType::BF16, Shape{8, 32}},
      {a + ".bias", DType::BF16, Shape{8}},
      // broken: block scales of the wrong width, and a negative global scale
      {"bad.scale_shape.weight", DType::U8, Shape{4, 16}},
      {"bad.scale_shape.weight_scale", DType::F8_E4M3, Shape{4, 4}},
      {"bad.scale_shape.weight_scale_2", DType::F32, Shape{}},
      {"bad.negative.weight", DType::U8, Shape{4, 16}},
      {"bad.negative.weight_scale", DType::F8_E4M3, Shape{4, 2}},
      {"bad.negative.weight_scale_2", DType::F32, Shape{}},
      {"bad.negative.input_scale", DType::F32, Shape{}},
  };
  SafetensorsWriter out(f.dir / "model.safetensors", decls);
  const float neg = -1.0f;
  out.write(e + ".weight", packed.data(), packed.size());
  out.write(e + ".weight_scale", scales.data(), scales.size());
  out.write(e + ".weight_scale_2", &gs, 4);
  out.write(e + ".input_scale", &is, 4);
  out.write(d + ".weight", fp8.data(), fp8.size());
  out.write(d + ".weight_scale", &fp8_scale, 4);
  out.write(a + ".weight", bf.data(), bf.size() * 2);
  out.write(a + ".bias", bias.data(), bias.size() * 2);
  std::vector<uint8_t> wide(16);
  out.write("bad.scale_shape.weight", packed.data(), packed.size());
  out.write("bad.scale_shape.weight_scale", wide.data(), wide.size());
  out.write("bad.scale_shape.weight_scale_2", &gs, 4);
  out.write("bad.negative.weight", packed.data(), packed.size());
  out.write("bad.negative.weight_scale", scales.data(), scales.size());
  out.write("bad.negative.weight_scale_2", &neg, 4);
  out.write("bad.negative.input_scale", &is, 4);
  out.finish();
}

QuantConfig mixed() {
  return parse_quant_config(nlohmann::json::parse(R"({"quantization": {
      "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": null,
      "quantized_layers": {
        "model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
        "model.layers.1.mlp.experts.0.gate_proj": {"quant_algo": "NVFP4", "group_size": 16},
        "bad.scale_shape": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
        "bad.negative": {"quant_algo": "NVFP4", "group_size": 16}}}})"),
                            "hf_quant_config.json");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LinearTensors, MixedPrecisionModulesLoadInTheirFormats) {
  Fixture f;
  write_checkpoint(f);
  auto ckpt = Checkpoint::open(f.dir);
  const QuantConfig q = mixed();

  const LinearTensors e = load_linear(*ckpt, &q, "model.layers.1.mlp.experts.0.gate_proj", 4, 32);
  EXPECT_EQ(e.algo, QuantAlgo::Nvfp4);
  EXPECT_EQ(e.global_scale, nvfp4::global_scale_from_amax(0.67f));
  EXPECT_EQ(e.input_scale, 0.5f);
  std::vector<float> row(32), want(32);
  for (int r = 0; r < 4; ++r) {
    linear_row_to_f32(e, r, row.data());
    nvfp4::dequantize_row(f.packed.data() + r * 16, f.scales.data() + r * 2, e.global_scale, 32,
                          want.data());
    EXPECT_EQ(row, want) << r;
    // Within one grid step (at most 2 block multipliers) of the source.
    for (int c = 0; c < 32; ++c)
      EXPECT_LE(std::fabs(row[c] - f.w[size_t(r * 32 + c)]),
                2 * nvfp4::block_multiplier(f.scales[size_t(r * 2 + c / 16)], e.global_scale));
  }

  const LinearTensors d = load_linear(*ckpt, &q, "model.layers.0.mlp.down_proj", 8, 32);
  EXPECT_EQ(d.algo, QuantAlgo::Fp8);
  EXPECT_EQ(d.global_scale, 0.25f);
  EXPECT_EQ(d.input_scale, 0.0f);
  linear_row_to_f32(d, 0, row.data());
  EXPECT_EQ(row[0], -4.0f * 0.25f);
  EXPECT_EQ(row[5], 1.0f * 0.25f);

  // Not in quantized_layers: BF16, with its bias.
  const LinearTensors a = load_linear(*ckpt, &q, "model.layers.0.self_attn.q_proj", 8, 32);
  EXPECT_EQ(a.algo, QuantAlgo::None);
  EXPECT_EQ(a.bias.dim(0), 8);
  linear_row_to_f32(a, 7, row.data());
  EXPECT_EQ(row[31], 1.5f);
}

TEST(LinearTensors, MismatchesAreClearErrors) {
  Fixture f;
  write_checkpoint(f);
  auto ckpt = Checkpoint::open(f.dir);
  const QuantConfig q = mixed();
  const std::string e = "model.layers.1.mlp.experts.0.gate_proj";
  // The config's shape disagrees with the file.
  std::string msg = error_of([&] { load_linear(*ckpt, &q, e, 4, 64); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find(e + ".weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 32]"), std::string::npos) << msg;
  msg = error_of([&] { load_linear(*ckpt, &q, "bad.scale_shape", 4, 32); });
  EXPECT_NE(msg.find("bad.scale_shape.weight_scale"), std::string::npos) << msg;
  msg = error_of([&] { load_linear(*ckpt, &q, "bad.negative", 4, 32); });
  EXPECT_NE(msg.find("bad.negative.weight_scale_2"), std::string::npos) << msg;
  // Config says NVFP4 for a BF16 tensor, or BF16 for an NVFP4 one.
  QuantConfig all_nvfp4 = parse_quant_config(
      nlohmann::json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})"), "config.json");
  msg = error_of([&] { load_linear(*ckpt, &all_nvfp4, "model.layers.0.self_attn.q_proj", 8, 32); });
  EXPECT_NE(msg.find("is BF16, expected U8"), std::string::npos) << msg;
  msg = error_of([&] { load_linear(*ckpt, nullptr, e, 4, 32); });
  EXPECT_NE(msg.find("unquantized"), std::string::npos) << msg;
  // NVFP4 (W4A4) needs input_scale; the FP8 module has none, so as NVFP4 it fails on shapes.
  msg = error_of([&] { load_linear(*ckpt, &all_nvfp4, "model.layers.0.mlp.down_proj", 8, 32); });
  EXPECT_NE(msg.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << msg;
  // A width that is not a multiple of 16 cannot be NVFP4.
  msg = error_of([&] { load_linear(*ckpt, &q, e, 4, 24); });
  EXPECT_NE(msg.find("multiple of 16"), std::string::npos) << msg;
  msg = error_of([&] { load_linear(*ckpt, &q, "model.layers.9.mlp.down_proj", 8, 32); });
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tetra

// tetra quantize against the numpy reference port of ModelOpt's export (tools/nvfp4_ref.py):
// every output tensor byte for byte and both config files, on a small checkpoint whose experts
// are adversarial (all zeros, one huge outlier, exact rounding ties, negative zeros, subnormal
// block scales), across two shards, with an MTP layer and a layer too narrow to quantize.
#include "formats/quantize_checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/linear_tensors.h"
#include "formats/nvfp4.h"
#include "formats/quant_config.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"

namespace tetra {
namespace {

namespace fs = std::filesystem;

struct Dir {
  fs::path path;
  Dir() {
    path = fs::temp_directory_path() / ("tetra_quantize_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

// A BF16 [rows, cols] tensor from a generator of f32 values (rounded to BF16).
struct Bf16 {
  Shape shape;
  std::vector<uint16_t> data;
};

template <typename F>
Bf16 make(int64_t rows, int64_t cols, F f) {
  Bf16 t{Shape{rows, cols}, std::vector<uint16_t>(size_t(rows * cols))};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.data[size_t(r * cols + c)] = f32_to_bf16(f(r, c));
  return t;
}

struct Source {
  std::map<std::string, Bf16> tensors;  // name -> BF16 data
  std::map<std::string, std::string> shard;
};

// The test checkpoint: 2 layers plus an MTP layer (index 2), experts 0-5 adversarial.
Source make_source() {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  auto normal = [&](int64_t, int64_t) { return nd(rng); };
  Source s;
  auto add = [&](const std::string& name, Bf16 t, const char* shard) {
    s.tensors[name] = std::move(t);
    s.shard[name] = shard;
  };
  const char* a = "model-00001-of-00002.safetensors";
  const char* b = "model-00002-of-00002.safetensors";
  const int64_t H = 64, I = 32;
  add("model.embed_tokens.weight", make(40, H, normal), a);
  Bf16 norm = make(1, H, normal);
  norm.shape = Shape{H};  // norms are 1-D
  add("model.layers.0.input_layernorm.weight", norm, a);
  add("model.layers.0.self_attn.q_proj.weight", make(H, H, normal), a);
  add("model.layers.0.self_attn.o_proj.weight", make(H, H, normal), a);
  add("model.layers.0.mlp.gate.weight", make(6, H, normal), a);
  const std::string e = "model.layers.0.mlp.experts.";
  // 0: all zeros (weight_scale_2 = 0).
  for (const char* p : {"gate_proj", "up_proj"})
    add(e + "0." + p + ".weight", make(I, H, [](int64_t, int64_t) { return 0.0f; }), a);
  add(e + "0.down_proj.weight", make(H, I, [](int64_t, int64_t) { return 0.0f; }), a);
  // 1: one huge outlier in gate; up shares its amax, so up's block scales clamp to 2^-9.
  add(e + "1.gate_proj.weight",
      make(I, H, [&](int64_t r, int64_t c) { return r == 5 && c == 17 ? 30000.0f : nd(rng); }), a);
  add(e + "1.up_proj.weight", make(I, H, normal), a);
  add(e + "1.down_proj.weight",
      make(H, I, [&](int64_t r, int64_t c) { return r == 0 && c == 0 ? -2.0e4f : 1e-3f * nd(rng); }),
      a);
  // 2: exact ties. amax 2.625 gives weight_scale_2 = 2^-10 exactly; a block whose max is
  // 6 * 2^-10 gets block scale 1.0, so w / denom lands on 0.25, 0.75, ... exactly.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
  auto tie_fn = [&](int64_t r, int64_t c) {
    if (r == 0 && c == 0) return 2.625f;
    if (r == 0) return 0.0f;
    const float v = ties[c % 8] * 0x1p-10f;
    return (c / 8) % 2 ? -v : v;
  };
  add(e + "2.gate_proj.weight", make(I, H, tie_fn), b);
  add(e + "2.up_proj.weight", make(I, H, tie_fn), b);
  add(e + "2.down_proj.weight", make(H, I, [&](int64_t r, int64_t c) {
        return r == 0 && c == 0 ? 2.625f : ties[(r + c) % 8] * 0x1p-10f;
      }), b);
  // 3: negative zeros and tiny negatives next to one normal value per row.
  auto negz = [&](int64_t r, int64_t c) {
    if (c == 3) return 1.0f + 0.01f * float(r);
    if (c % 3 == 0) return -0.0f;
    if (c % 3 == 1) return -1e-4f;
    return -1e-30f;
  };
  add(e + "3.gate_proj.weight", make(I, H, negz), b);
  add(e + "3.up_proj.weight", make(I, H, negz), b);
  add(e + "3.down_proj.weight", make(H, I, negz), b);
  // 4: ordinary; 5: a down_proj whose input width (40) is not a multiple of 16 (stays BF16).
  add(e + "4.gate_proj.weight", make(I, H, normal), b);
  add(e + "4.up_proj.weight", make(I, H, normal), b);
  add(e + "4.down_proj.weight", make(H, I, normal), b);
  add(e + "5.gate_proj.weight", make(40, H, normal), b);
  add(e + "5.up_proj.weight", make(40, H, normal), b);
  add(e + "5.down_proj.weight", make(H, 40, normal), b);
  // Layer 1: a dense MLP, a shared expert and Mixtral-named experts.
  add("model.layers.1.self_attn.q_proj.weight", make(H, H, normal), b);
  for (const std::string m : {"model.layers.1.mlp.", "model.layers.1.mlp.shared_experts."}) {
    add(m + "gate_proj.weight", make(48, H, normal), b);
    add(m + "up_proj.weight", make(48, H, normal), b);
    add(m + "down_proj.weight", make(H, 48, normal), b);
  }
  add("model.layers.1.block_sparse_moe.gate.weight", make(2, H, normal), b);
  add("model.layers.1.block_sparse_moe.experts.0.w1.weight", make(I, H, normal), b);
  add("model.layers.1.block_sparse_moe.experts.0.w3.weight", make(I, H, normal), b);
  add("model.layers.1.block_sparse_moe.experts.0.w2.weight", make(H, I, normal), b);
  // MTP layer: copied whole.
  add("model.layers.2.eh_proj.weight", make(H, 2 * H, normal), b);
  add("model.layers.2.mlp.experts.0.gate_proj.weight", make(I, H, normal), b);
  add("model.norm.weight", norm, b);
  add("lm_head.weight", make(40, H, normal), b);
  return s;
}

void write_source(const Source& s, const fs::path& dir, bool nan = false) {
  fs::create_directories(dir);
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, shard] : s.shard) by_shard[shard].push_back(name);
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (const auto& [shard, names] : by_shard) {
    std::vector<TensorDecl> decls;
    for (const auto& n : names) decls.push_back({n, DType::BF16, s.tensors.at(n).shape});
    // An F32 router bias (6 experts) in one shard, an F32 attention bias in the other.
    const bool first = shard == "model-00001-of-00002.safetensors";
    const int64_t n_bias = first ? 6 : 64;
    decls.push_back({first ? "model.layers.0.mlp.gate.e_score_correction_bias"
                           : "model.layers.1.self_attn.q_proj.bias",
                     DType::F32, Shape{n_bias}});
    SafetensorsWriter w(dir / shard, decls, {{"format", "pt"}});
    for (const auto& n : names) {
      std::vector<uint16_t> d = s.tensors.at(n).data;
      if (nan && n == "model.layers.0.mlp.experts.4.up_proj.weight") d[7] = 0x7fc0;
      w.write(n, d.data(), d.size() * 2);
      weight_map[n] = shard;
      total += d.size() * 2;
    }
    std::vector<float> bias(static_cast<size_t>(n_bias));
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.5f * float(i) - 1.0f;
    w.write(decls.back().name, bias.data(), bias.size() * sizeof(float));
    weight_map[decls.back().name] = shard;
    w.finish();
  }
  write_safetensors_index(dir / "model.safetensors.index.json", weight_map, total);
  std::ofstream(dir / "config.json") << R"({"model_type": "qwen3_moe", "num_hidden_layers": 2,
    "hidden_size": 64, "torch_dtype": "bfloat16"})";
  std::ofstream(dir / "tokenizer.json") << R"({"model": {}})";
  fs::create_directories(dir / "extra");
  std::ofstream(dir / "extra" / "notes.txt") << "copied";
}

std::string python_with_numpy() {
  for (const char* py : {"/usr/bin/python3", "python3"})
    if (std::system((std::string(py) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0)
      return py;
  return "";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Every tensor of two checkpoints: same names, dtypes, shapes and bytes. Returns the count.
int compare_checkpoints(const fs::path& a_dir, const fs::path& b_dir) {
  auto a = Checkpoint::open(a_dir);
  auto b = Checkpoint::open(b_dir);
  EXPECT_EQ(a->names(), b->names());
  int n = 0;
  for (const std::string& name : a->names()) {
    if (!b->has(name)) continue;
    const TensorView x = a->get(name), y = b->get(name);
    EXPECT_EQ(x.dtype, y.dtype) << name;
    EXPECT_TRUE(x.shape == y.shape) << name << " " << x.shape.str() << " vs " << y.shape.str();
    if (x.nbytes() != y.nbytes()) continue;
    const bool same = std::memcmp(x.data, y.data, size_t(x.nbytes())) == 0;
    EXPECT_TRUE(same) << "tensor " << name << " differs from the reference";
    n += same;
  }
  return n;
}

void run_reference(const std::string& py, const fs::path& src, const fs::path& out,
                   const std::string& extra = "") {
  const std::string cmd = py + " " + TETRA_SOURCE_DIR + "/tools/nvfp4_ref.py checkpoint --model " +
                          src.string() + " --out " + out.string() + " " + extra + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(QuantizeCheckpoint, MatchesTheNumpyReferenceByteForByte) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "python3 with numpy is missing (scripts/setup installs python3-numpy)";
  Dir dir;
  const Source s = make_source();
  write_source(s, dir.path / "src");
  QuantizeOptions opt;
  opt.src = dir.path / "src";
  opt.dst = dir.path / "tetra";
  int64_t calls = 0;
  opt.on_progress = [&](int64_t, int64_t, int64_t, int64_t) { ++calls; };
  const QuantizeSummary sum = quantize_checkpoint(opt);
  EXPECT_EQ(sum.algo, "W4A16_NVFP4");
  // Experts 0-4 x 3, expert 5's gate/up, dense + shared x 3, Mixtral x 3.
  EXPECT_EQ(sum.n_quantized, 15 + 2 + 6 + 3);
  EXPECT_EQ(calls, int64_t(s.tensors.size()) + 2);
  run_reference(py, opt.src, dir.path / "ref");
  const int n = compare_checkpoints(opt.dst, dir.path / "ref");
  EXPECT_EQ(n, int(s.tensors.size()) + 2 + 2 * sum.n_quantized);
  EXPECT_EQ(read_json(opt.dst / "hf_quant_config.json"),
            read_json(dir.path / "ref" / "hf_quant_config.json"));
  EXPECT_EQ(read_json(opt.dst / "config.json"), read_json(dir.path / "ref" / "config.json"));
  EXPECT_TRUE(fs::exists(opt.dst / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(opt.dst / "extra" / "notes.txt"));
  EXPECT_TRUE(fs::exists(opt.dst / "model.safetensors.index.json"));

  // What was decided, read back through the loader the model uses.
  const auto q = load_quant_config(opt.dst);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::W4a16Nvfp4);
  const std::vector<std::string> want_exclude = {
      "lm_head", "model.layers.0.mlp.experts.5.down_proj", "model.layers.0.mlp.gate",
      "model.layers.0.self_attn*", "model.layers.1.block_sparse_moe.gate",
      "model.layers.1.self_attn*", "model.layers.2*"};
  EXPECT_EQ(q->exclude, want_exclude);
  auto ckpt = Checkpoint::open(opt.dst);
  const std::string e = "model.layers.0.mlp.experts.";
  std::vector<float> row(64);

  // All zeros: scale 0, codes 0, rows dequantize to 0.
  LinearTensors z = load_linear(*ckpt, &*q, e + "0.gate_proj", 32, 64);
  EXPECT_EQ(z.global_scale, 0.0f);
  linear_row_to_f32(z, 3, row.data());
  for (float v : row) EXPECT_EQ(v, 0.0f);

  // Ties: weight_scale_2 = 2^-10, block scale 1.0, codes per the tie table; negated blocks
  // carry the sign bit.
  LinearTensors t = load_linear(*ckpt, &*q, e + "2.gate_proj", 32, 64);
  EXPECT_EQ(t.global_scale, 0x1p-10f);
  const uint8_t* codes = t.weight.as<const uint8_t>() + 1 * 32;  // row 1
  const uint8_t want[8] = {0, 2, 2, 4, 4, 6, 6, 7};
  for (int c = 0; c < 16; ++c) {
    const uint8_t code = c % 2 ? nvfp4::unpack_odd(codes[c / 2]) : nvfp4::unpack_even(codes[c / 2]);
    EXPECT_EQ(code, want[c % 8] | (c >= 8 ? 8 : 0)) << c;
  }
  EXPECT_EQ(t.block_scale.as<const uint8_t>()[4], f32_to_e4m3(1.0f));

  // Outlier: up_proj shares gate's amax (3e4), so its blocks clamp to the 2^-9 scale.
  LinearTensors g = load_linear(*ckpt, &*q, e + "1.gate_proj", 32, 64);
  LinearTensors u = load_linear(*ckpt, &*q, e + "1.up_proj", 32, 64);
  EXPECT_EQ(g.global_scale, u.global_scale);
  EXPECT_EQ(u.block_scale.as<const uint8_t>()[0], 0x01);

  // Negative zeros give code 0, tiny negatives code 8.
  LinearTensors nz = load_linear(*ckpt, &*q, e + "3.gate_proj", 32, 64);
  EXPECT_EQ(nvfp4::unpack_even(nz.weight.as<const uint8_t>()[0]), 0);  // -0.0
  EXPECT_EQ(nvfp4::unpack_odd(nz.weight.as<const uint8_t>()[0]), 8);   // -1e-4

  // Kept as they were: the narrow down_proj, the router, attention, the MTP layer.
  EXPECT_EQ(load_linear(*ckpt, &*q, e + "5.down_proj", 64, 40).algo, QuantAlgo::None);
  EXPECT_EQ(load_linear(*ckpt, &*q, "model.layers.0.mlp.gate", 6, 64).algo, QuantAlgo::None);
  EXPECT_EQ(ckpt->find("model.layers.2.mlp.experts.0.gate_proj.weight")->dtype, DType::BF16);
  EXPECT_EQ(load_linear(*ckpt, &*q, "model.layers.1.self_attn.q_proj", 64, 64).bias.dim(0), 64);

  // An ordinary expert dequantizes close to its BF16 source.
  LinearTensors o = load_linear(*ckpt, &*q, e + "4.down_proj", 64, 32);
  const Bf16& src = s.tensors.at(e + "4.down_proj.weight");
  std::vector<float> r32(32);
  double err = 0, ref = 0;
  for (int64_t r = 0; r < 64; ++r) {
    linear_row_to_f32(o, r, r32.data());
    for (int c = 0; c < 32; ++c) {
      const double x = bf16_to_f32(src.data[size_t(r * 32 + c)]);
      err += (r32[c] - x) * (r32[c] - x);
      ref += x * x;
    }
  }
  EXPECT_LT(err / ref, 0.02);  // NVFP4's relative MSE on Gaussian weights is about 1%
}

TEST(QuantizeCheckpoint, CalibratedInputScalesMatchTheReference) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "python3 with numpy is missing (scripts/setup installs python3-numpy)";
  Dir dir;
  write_source(make_source(), dir.path / "src");
  std::map<std::string, float> amax = {
      {"model.layers.0.mlp.experts.4.gate_proj", 3.5f},
      {"model.layers.0.mlp.experts.4.up_proj", 7.25f},   // the pair takes the larger
      {"model.layers.0.mlp.experts.4.down_proj", 0.1f},
      {"model.layers.1.mlp.down_proj", 1e-3f}};           // others never saw input: 6/2688
  {
    nlohmann::json j = amax;
    std::ofstream(dir.path / "amax.json") << j.dump();
  }
  QuantizeOptions opt;
  opt.src = dir.path / "src";
  opt.dst = dir.path / "tetra";
  opt.input_amax = amax;
  EXPECT_EQ(quantize_checkpoint(opt).algo, "NVFP4");
  run_reference(py, opt.src, dir.path / "ref", "--input-amax " + (dir.path / "amax.json").string());
  compare_checkpoints(opt.dst, dir.path / "ref");
  EXPECT_EQ(read_json(opt.dst / "config.json"), read_json(dir.path / "ref" / "config.json"));
  const auto q = load_quant_config(opt.dst);
  ASSERT_TRUE(q.has_value());
  EXPECT_EQ(q->algo, QuantAlgo::Nvfp4);
  auto ckpt = Checkpoint::open(opt.dst);
  const LinearTensors w =
      load_linear(*ckpt, &*q, "model.layers.0.mlp.experts.4.gate_proj", 32, 64);
  EXPECT_EQ(w.input_scale, 7.25f / 2688.0f);
  EXPECT_EQ(load_linear(*ckpt, &*q, "model.layers.0.mlp.experts.1.down_proj", 64, 32).input_scale,
            6.0f / 2688.0f);
}

TEST(QuantizeCheckpoint, AFailedRunLeavesNothingThatLooksComplete) {
  Dir dir;
  write_source(make_source(), dir.path / "src", /*nan=*/true);
  QuantizeOptions opt;
  opt.src = dir.path / "src";
  opt.dst = dir.path / "out";
  try {
    quantize_checkpoint(opt);
    FAIL() << "a NaN weight must stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.4.up_proj"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(opt.dst));
  for (const auto& entry : fs::directory_iterator(dir.path))  // no temporary folder left
    EXPECT_EQ(entry.path().filename(), "src");
  // An existing output folder is never overwritten; a quantized source is refused.
  fs::create_directories(opt.dst);
  EXPECT_THROW(quantize_checkpoint(opt), Error);
  fs::remove_all(opt.dst);
  std::ofstream(dir.path / "src" / "hf_quant_config.json") << "{}";
  EXPECT_THROW(quantize_checkpoint(opt), Error);
}

TEST(QuantizeCheckpoint, EveryFixtureMatchesTheReference) {
  const std::string py = python_with_numpy();
  ASSERT_FALSE(py.empty()) << "python3 with numpy is missing (scripts/setup installs python3-numpy)";
  const fs::path fixtures = fs::path(TETRA_SOURCE_DIR) / "tests" / "fixtures";
  int n_fixtures = 0, n_tensors = 0;
  for (const auto& entry : fs::directory_iterator(fixtures)) {
    if (!fs::exists(entry.path() / "model.safetensors")) continue;
    if (fs::exists(entry.path() / "hf_quant_config.json")) continue;  // already NVFP4
    SCOPED_TRACE(entry.path().filename().string());
    Dir dir;
    QuantizeOptions opt;
    opt.src = entry.path();
    opt.dst = dir.path / "tetra";
    const QuantizeSummary sum = quantize_checkpoint(opt);
    EXPECT_GT(sum.n_quantized, 0);
    run_reference(py, opt.src, dir.path / "ref");
    n_tensors += compare_checkpoints(opt.dst, dir.path / "ref");
    EXPECT_EQ(read_json(opt.dst / "hf_quant_config.json"),
              read_json(dir.path / "ref" / "hf_quant_config.json"));
    EXPECT_EQ(read_json(opt.dst / "config.json"), read_json(dir.path / "ref" / "config.json"));
    ++n_fixtures;
  }
  ASSERT_GT(n_fixtures, 0) << "no BF16 fixtures under " << fixtures.string();
  std::printf("%d fixtures, %d tensors identical to the reference\n", n_fixtures, n_tensors);
}

TEST(QuantizeCheckpoint, ExclusionSummaryFollowsModelOpt) {
  const std::vector<std::string> quantized = {"model.layers.0.mlp.experts.0.up_proj",
                                              "model.layers.1.mlp.down_proj", "model.layers.10.x"};
  const std::vector<std::string> unquantized = {
      "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "lm_head",
      "model.layers.0.mlp.gate", "model.layers.2.self_attn.o_proj", "model.layers.1.foo"};
  // layers.2 has nothing quantized, but "model.layers.2*" is not negative only if no quantized
  // name starts with it; "model.layers.1*" is (layers.1 and layers.10).
  EXPECT_EQ(summarize_exclusions(unquantized, quantized),
            (std::vector<std::string>{"lm_head", "model.layers.0.mlp.gate",
                                      "model.layers.0.self_attn*", "model.layers.1.foo",
                                      "model.layers.2*"}));
  EXPECT_EQ(mlp_linear_module("model.layers.3.mlp.experts.12.down_proj.weight"),
            "model.layers.3.mlp.experts.12.down_proj");
  EXPECT_EQ(mlp_linear_module("model.layers.3.block_sparse_moe.experts.1.w3.weight"),
            "model.layers.3.block_sparse_moe.experts.1.w3");
  EXPECT_EQ(mlp_linear_module("model.layers.3.mlp.shared_experts.up_proj.weight"),
            "model.layers.3.mlp.shared_experts.up_proj");
  EXPECT_FALSE(mlp_linear_module("model.layers.3.mlp.gate.weight"));
  EXPECT_FALSE(mlp_linear_module("model.layers.3.self_attn.o_proj.weight"));
  EXPECT_FALSE(mlp_linear_module("model.layers.3.mlp.experts.1.up_proj.bias"));
}

}  // namespace
}  // namespace tetra

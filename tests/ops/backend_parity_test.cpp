// Every op of ops.h on the CUDA backend against the CPU reference, after ggml's
// test-backend-ops: the same inputs (rounded to BF16 first, since CUDA keeps activations in
// BF16) through both, compared by normalized mean squared error,
//   NMSE = sum (cuda - cpu)^2 / sum cpu^2,
// with a tolerance per op and its reason. Awkward shapes throughout: one token, sizes off
// every tile grid, experts with no tokens, all tokens on one expert, contexts from 1 to 32k,
// sequences of mixed lengths across block boundaries, a prefix-cached prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace tetra::ops {
namespace {

// One bf16 rounding of each output value: relative error up to 2^-9, NMSE about 1.3e-6.
constexpr double kBf16Out = 2e-5;
// Attention and the MoE fast path also round an intermediate to bf16 (the softmax weights
// for the tensor cores; silu(gate) * up between the expert GEMMs): NMSE about 1e-5.
constexpr double kBf16Inner = 1e-4;
// F32 outputs differ by summation order only.
constexpr double kF32Out = 1e-9;

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // unwritten (poisoned) or overflowed
    e += double(got[i] - want[i]) * (got[i] - want[i]);
    r += double(want[i]) * want[i];
  }
  return r > 0 ? e / r : e;
}

// One backend with its step arena and the buffers a case made on it.
struct Side {
  std::unique_ptr<Backend> b;
  std::unique_ptr<Arena> arena;
  Context ctx;
  std::vector<std::unique_ptr<Buffer>> keep;

  explicit Side(std::unique_ptr<Backend> backend) : b(std::move(backend)), arena(std::make_unique<Arena>(*b)) {
    ctx = b->context();
    ctx.arena = arena.get();
  }
  bool cuda() const { return b->device() == Device::Cuda; }

  // Values in `dtype` (F32 values converted), on this backend.
  TensorView put(const std::vector<float>& v, Shape shape, DType dtype) {
    keep.push_back(b->alloc(dtype, shape));
    const TensorView t = keep.back()->view();
    std::vector<uint16_t> half(v.size());
    if (dtype == DType::BF16) {
      for (size_t i = 0; i < v.size(); ++i) half[i] = f32_to_bf16(v[i]);
      b->copy_from_host(t, half.data());
    } else if (dtype == DType::F8_E4M3) {
      std::vector<uint8_t> bytes(v.size());
      for (size_t i = 0; i < v.size(); ++i) bytes[i] = f32_to_e4m3(v[i]);
      b->copy_from_host(t, bytes.data());
    } else {
      b->copy_from_host(t, v.data());
    }
    return t;
  }
  TensorView act(const std::vector<float>& v, Shape shape) { return put(v, shape, b->activation_dtype()); }
  TensorView ints(const std::vector<int32_t>& v, Shape shape) {
    keep.push_back(b->alloc(DType::I32, shape));
    if (!v.empty()) b->copy_from_host(keep.back()->view(), v.data());
    return keep.back()->view();
  }
  // An output, poisoned (NaN) so that an element nobody writes fails the comparison.
  TensorView out(Shape shape, DType dtype) {
    keep.push_back(b->alloc(dtype, shape));
    const TensorView t = keep.back()->view();
    std::vector<uint8_t> nan(static_cast<size_t>(t.nbytes()), 0xff);
    b->copy_from_host(t, nan.data());
    return t;
  }
  TensorView out_act(Shape shape) { return out(shape, b->activation_dtype()); }
  std::vector<float> read(TensorView t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> h(v.size());
      b->copy_to_host(h.data(), t);
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(h[i]);
    } else if (t.dtype == DType::I32) {
      std::vector<int32_t> h(v.size());
      b->copy_to_host(h.data(), t);
      for (size_t i = 0; i < v.size(); ++i) v[i] = float(h[i]);
    } else if (t.dtype == DType::F8_E4M3) {
      std::vector<uint8_t> h(v.size());
      b->copy_to_host(h.data(), t);
      for (size_t i = 0; i < v.size(); ++i) v[i] = e4m3_to_f32(h[i]);
    } else {
      b->copy_to_host(v.data(), t);
    }
    return v;
  }
};

// A linear weight in host memory (the checkpoint's side of an upload).
struct HostLinear {
  std::vector<uint8_t> bytes, scale;
  std::vector<float> bias;
  LinearWeight view;
};

struct BackendParity : ::testing::Test {
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    cpu = std::make_unique<Side>(make_cpu_backend(4));
    gpu = std::make_unique<Side>(make_backend({.device = "cuda"}));
  }
  std::unique_ptr<Side> cpu, gpu;
  std::mt19937 rng{20261201};

  std::vector<float> randn(int64_t n, float scale = 1.0f, bool bf16 = true) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = bf16 ? round_bf16(d(rng)) : d(rng);
    return v;
  }

  HostLinear host_linear(WeightFormat f, DType dtype, int64_t n_out, int64_t n_in, bool bias) {
    HostLinear h;
    h.view.format = f;
    h.view.n_out = n_out;
    h.view.n_in = n_in;
    if (f == WeightFormat::Nvfp4) {
      std::uniform_int_distribution<int> byte(0, 255), sc(0x28, 0x40);
      h.bytes.resize(size_t(n_out * n_in / 2));
      h.scale.resize(size_t(n_out * n_in / 16));
      for (auto& b : h.bytes) b = uint8_t(byte(rng));
      for (auto& s : h.scale) s = uint8_t(sc(rng));
      h.view.weight = {h.bytes.data(), DType::U8, {n_out, n_in / 2}, Device::Cpu};
      h.view.block_scale = {h.scale.data(), DType::F8_E4M3, {n_out, n_in / 16}, Device::Cpu};
      h.view.global_scale = 0.01f;
    } else if (f == WeightFormat::Fp8) {
      std::uniform_int_distribution<int> mag(0x20, 0x50), sign(0, 1);
      h.bytes.resize(size_t(n_out * n_in));
      for (auto& b : h.bytes) b = uint8_t(mag(rng) | (sign(rng) << 7));
      h.view.weight = {h.bytes.data(), DType::F8_E4M3, {n_out, n_in}, Device::Cpu};
      h.view.global_scale = 0.02f;
    } else {
      const auto w = randn(n_out * n_in, 0.05f);
      h.bytes.resize(size_t(n_out * n_in * dtype_bits(dtype) / 8));
      for (size_t i = 0; i < w.size(); ++i) {
        if (dtype == DType::F32) std::memcpy(h.bytes.data() + 4 * i, &w[i], 4);
        const uint16_t v = dtype == DType::BF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
        if (dtype != DType::F32) std::memcpy(h.bytes.data() + 2 * i, &v, 2);
      }
      h.view.weight = {h.bytes.data(), dtype, {n_out, n_in}, Device::Cpu};
    }
    if (bias) {
      h.bias = randn(n_out, 0.1f);
      h.view.bias = {h.bias.data(), DType::F32, {n_out}, Device::Cpu};
    }
    return h;
  }
};

void report(const std::string& what, double e, double tol) {
  std::printf("  %-58s NMSE %.2e (tolerance %.0e)\n", what.c_str(), e, tol);
  EXPECT_LE(e, tol) << what;
}

TEST_F(BackendParity, Embedding) {
  for (int64_t t : {1, 37}) {
    const int64_t vocab = 1000, hidden = 72;
    const auto table = randn(vocab * hidden);
    std::vector<int32_t> ids(static_cast<size_t>(t));
    for (auto& id : ids) id = int32_t(rng() % vocab);
    std::vector<float> got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      const TensorView tab = s->put(table, {vocab, hidden}, DType::BF16);
      const TensorView o = s->out_act({t, hidden});
      s->b->embedding(s->ctx, tab, s->ints(ids, {t}), o);
      (s == cpu.get() ? want : got) = s->read(o);
    }
    report("embedding T=" + std::to_string(t), nmse(got, want), 0.0);  // a copy: exact
  }
}

TEST_F(BackendParity, RmsNormAndLayerNorm) {
  struct Case { int64_t rows, d; };
  for (const Case c : {Case{1, 64}, Case{37, 72}, Case{300, 2048}, Case{7, 3000}, Case{5, 6144}, Case{68, 128}}) {
    const auto x = randn(c.rows * c.d, 3.0f), w = randn(c.d, 0.3f), bias = randn(c.d, 0.1f);
    for (bool layer : {false, true}) {
      std::vector<float> got, want;
      for (Side* s : {cpu.get(), gpu.get()}) {
        const TensorView xv = s->act(x, {c.rows, c.d});
        const TensorView wv = s->put(w, {c.d}, DType::BF16), bv = s->put(bias, {c.d}, DType::BF16);
        if (layer) s->b->layer_norm(s->ctx, xv, wv, bv, 1e-6f, xv);
        else s->b->rms_norm(s->ctx, xv, wv, 1e-6f, xv);  // in place, as the models call it
        (s == cpu.get() ? want : got) = s->read(xv);
      }
      report(std::string(layer ? "layer_norm " : "rms_norm ") + std::to_string(c.rows) + "x" + std::to_string(c.d),
             nmse(got, want), kBf16Out);
    }
  }
}

TEST_F(BackendParity, AddRmsNorm) {
  // The fused residual step leaves h exactly as add does, and out within one rounding of
  // rms_norm's, on both backends.
  struct Case { int64_t rows, d; };
  for (const Case c : {Case{1, 64}, Case{37, 72}, Case{5, 2048}, Case{7, 3000}, Case{3, 6144}}) {
    const auto h = randn(c.rows * c.d, 3.0f), y = randn(c.rows * c.d, 1.0f), w = randn(c.d, 0.3f);
    std::vector<float> got_h, want_h, got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      const TensorView hv = s->act(h, {c.rows, c.d}), yv = s->act(y, {c.rows, c.d});
      const TensorView wv = s->put(w, {c.d}, DType::BF16);
      const TensorView ov = s->out_act({c.rows, c.d});
      s->b->add_rms_norm(s->ctx, hv, yv, wv, 1e-6f, ov);
      (s == cpu.get() ? want_h : got_h) = s->read(hv);
      (s == cpu.get() ? want : got) = s->read(ov);
      // The unfused ops on the same backend: the same numbers, bit for bit.
      const TensorView h2 = s->act(h, {c.rows, c.d}), o2 = s->out_act({c.rows, c.d});
      s->b->add(s->ctx, h2, yv, h2);
      s->b->rms_norm(s->ctx, h2, wv, 1e-6f, o2);
      EXPECT_EQ(s->read(h2), s->read(hv)) << s->b->name() << " h";
      EXPECT_EQ(s->read(o2), s->read(ov)) << s->b->name() << " out";
    }
    // The CPU keeps f32 activations: its h is the exact sum; CUDA's one bf16 rounding of it.
    report("add_rms_norm h " + std::to_string(c.rows) + "x" + std::to_string(c.d), nmse(got_h, want_h), kBf16Out);
    report("add_rms_norm out " + std::to_string(c.rows) + "x" + std::to_string(c.d), nmse(got, want), kBf16Out);
  }
}

TEST_F(BackendParity, LinearEveryFormatAndShape) {
  struct Case { WeightFormat f; DType dt; int64_t t, n_out, n_in; bool bias; DType out; const char* name; };
  const Case cases[] = {
      {WeightFormat::Dense, DType::BF16, 1, 2048, 768, false, DType::BF16, "bf16 GEMV decode"},
      {WeightFormat::Dense, DType::BF16, 8, 151, 2048, true, DType::BF16, "bf16 GEMV 8 tokens + bias"},
      {WeightFormat::Dense, DType::BF16, 3, 151, 4096, false, DType::F32, "bf16 GEMV -> f32, rows off the block"},
      // GEMV rows shared by 4 and by 8 warps (n_in 7168 and 16,400: lanes off the last batch).
      {WeightFormat::Dense, DType::BF16, 5, 67, 7168, true, DType::BF16, "bf16 GEMV 4 warps a row + bias"},
      {WeightFormat::Dense, DType::BF16, 8, 33, 16400, false, DType::F32, "bf16 GEMV 8 warps a row -> f32"},
      // wgmma skinny linears (512 rows and more, 2-16 tokens alone): 64-row tiles (partial ones past
      // n_out), tokens padded to 16, 32 or 64, K shared by a cluster of skinny_split(n_in)
      // blocks (1, 3 and 6 here; 112 chunks of K over 6 blocks is uneven).
      {WeightFormat::Dense, DType::BF16, 2, 4096, 2048, true, DType::BF16, "bf16 wgmma 2 tokens + bias"},
      {WeightFormat::Dense, DType::BF16, 9, 512, 2048, false, DType::BF16, "bf16 wgmma 9 tokens, 3 blocks a tile"},
      {WeightFormat::Dense, DType::BF16, 16, 600, 4096, true, DType::F32, "bf16 wgmma 16 tokens + bias -> f32"},
      {WeightFormat::Dense, DType::BF16, 17, 520, 7168, true, DType::BF16, "bf16 wgmma K over 6 blocks + bias"},
      {WeightFormat::Dense, DType::BF16, 5, 576, 64, false, DType::BF16, "bf16 wgmma one chunk of K"},
      {WeightFormat::Dense, DType::BF16, 24, 512, 2048, false, DType::BF16, "bf16 cuBLASLt 24 tokens"},
      {WeightFormat::Dense, DType::BF16, 12, 256, 2048, false, DType::F32, "bf16 cuBLASLt router 12 tokens"},
      {WeightFormat::Dense, DType::BF16, 300, 1024, 2048, true, DType::BF16, "bf16 cuBLASLt prefill + bias"},
      {WeightFormat::Dense, DType::BF16, 17, 11, 37, true, DType::BF16, "bf16 odd sizes"},
      {WeightFormat::Dense, DType::BF16, 5, 512, 64, false, DType::F32, "bf16 -> f32 (lm_head, router)"},
      {WeightFormat::Dense, DType::F32, 7, 40, 72, false, DType::BF16, "f32 weight"},
      {WeightFormat::Dense, DType::F16, 3, 64, 96, true, DType::BF16, "f16 weight"},
      {WeightFormat::Nvfp4, DType::U8, 1, 768, 2048, false, DType::BF16, "nvfp4 decode"},
      {WeightFormat::Nvfp4, DType::U8, 16, 80, 64, true, DType::BF16, "nvfp4 16 tokens + bias"},
      {WeightFormat::Nvfp4, DType::U8, 200, 96, 160, false, DType::F32, "nvfp4 tiled, f32 out"},
      {WeightFormat::Fp8, DType::F8_E4M3, 9, 33, 48, false, DType::BF16, "fp8 per-tensor"},
  };
  for (const Case& c : cases) {
    HostLinear h = host_linear(c.f, c.dt, c.n_out, c.n_in, c.bias);
    const auto x = randn(c.t * c.n_in);
    std::vector<float> got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      const LinearWeight w = s->b->upload(h.view);
      const DType odt = s->cuda() ? c.out : DType::F32;
      const TensorView o = s->out({c.t, c.n_out}, odt);
      s->b->linear(s->ctx, s->act(x, {c.t, c.n_in}), w, o);
      (s == cpu.get() ? want : got) = s->read(o);
    }
    report(std::string("linear ") + c.name + " T=" + std::to_string(c.t), nmse(got, want),
           c.out == DType::F32 ? kF32Out : kBf16Out);
  }
}

TEST_F(BackendParity, FewTokenLinearIsTheSameInAnyBatchOfUpTo8) {
  // Decode graphs pad batches to the next captured size: a token's projection must not depend
  // on the tokens beside it. A router's linear (under 512 rows) stays on the GEMV up to 8
  // tokens, with one warp a row (n_in 2048) or several (7168).
  for (const int64_t n_in : {2048, 7168}) {
    HostLinear h = host_linear(WeightFormat::Dense, DType::BF16, 256, n_in, true);
    const auto x = randn(8 * n_in);
    const LinearWeight w = gpu->b->upload(h.view);
    std::vector<float> alone;
    for (int64_t t : {1, 3, 8}) {
      const TensorView o = gpu->out({t, 256}, DType::BF16);
      gpu->b->linear(gpu->ctx, gpu->act(std::vector<float>(x.begin(), x.begin() + t * n_in), {t, n_in}), w, o);
      const std::vector<float> all = gpu->read(o);
      const std::vector<float> first(all.begin(), all.begin() + 256);
      if (t == 1) alone = first;
      EXPECT_EQ(first, alone) << "n_in " << n_in << ": token 0 of " << t;
    }
  }
}

TEST_F(BackendParity, SkinnyLinearsAreTheSameInAnyBatch) {
  // The same for the wgmma skinny kernel (512 rows and more; two parts in one launch, so 2-64
  // tokens): tokens padded to 16, 32 or 64, K in one block (n_in 512) or shared by 3 or 6.
  for (const int64_t n_in : {512, 2048, 7168}) {
    HostLinear ha = host_linear(WeightFormat::Dense, DType::BF16, 640, n_in, true);
    HostLinear hb = host_linear(WeightFormat::Dense, DType::BF16, 72, n_in, false);
    const auto x = randn(64 * n_in);
    const LinearWeight wa = gpu->b->upload(ha.view), wb = gpu->b->upload(hb.view);
    std::vector<float> first2[2];
    for (int64_t t : {2, 9, 24, 40, 64}) {
      const TensorView a = gpu->out({t, 640}, DType::BF16), b = gpu->out({t, 72}, DType::BF16);
      const LinearPart parts[] = {{&wa, a}, {&wb, b}};
      gpu->b->linears(gpu->ctx, gpu->act(std::vector<float>(x.begin(), x.begin() + t * n_in), {t, n_in}), parts);
      for (int i = 0; i < 2; ++i) {
        const std::vector<float> all = gpu->read(parts[i].out);
        const std::vector<float> head(all.begin(), all.begin() + 2 * parts[i].out.dim(1));
        if (t == 2) first2[i] = head;
        EXPECT_EQ(head, first2[i]) << "n_in " << n_in << ", part " << i << ": tokens 0-1 of " << t;
      }
    }
  }
}

TEST_F(BackendParity, LinearsMatchTheReferencePartByPart) {
  // q, k and v in one call, against the CPU's (where each part is what linear gives it alone):
  // the GEMV at 1 token (at n_in 4096 two warps a row), the wgmma skinny kernel at 5-64 (at
  // n_in 4096 six blocks a tile, v's 72 rows a partial tile, tokens padded to 16, 32 and 64).
  for (const int64_t n_in : {256, 4096}) {
    HostLinear hq = host_linear(WeightFormat::Dense, DType::BF16, 512, n_in, true);
    HostLinear hk = host_linear(WeightFormat::Dense, DType::BF16, 64, n_in, true);
    HostLinear hv = host_linear(WeightFormat::Dense, DType::BF16, 72, n_in, true);
    for (int64_t t : {1, 5, 20, 64}) {
      const auto x = randn(t * n_in);
      std::vector<float> got[3], want[3];
      for (Side* s : {cpu.get(), gpu.get()}) {
        const LinearWeight wq = s->b->upload(hq.view), wk = s->b->upload(hk.view), wv = s->b->upload(hv.view);
        const TensorView xv = s->act(x, {t, n_in});
        const TensorView q = s->out_act({t, 512}), k = s->out_act({t, 64}), v = s->out_act({t, 72});
        const LinearPart parts[] = {{&wq, q}, {&wk, k}, {&wv, v}};
        s->b->linears(s->ctx, xv, parts);
        std::vector<float>* out = s == cpu.get() ? want : got;
        for (int i = 0; i < 3; ++i) out[i] = s->read(parts[i].out);
        if (s != cpu.get()) continue;
        const TensorView q1 = s->out_act({t, 512}), k1 = s->out_act({t, 64}), v1 = s->out_act({t, 72});
        s->b->linear(s->ctx, xv, wq, q1);
        s->b->linear(s->ctx, xv, wk, k1);
        s->b->linear(s->ctx, xv, wv, v1);
        EXPECT_EQ(want[0], s->read(q1)) << "n_in " << n_in << " T=" << t << " q";
        EXPECT_EQ(want[1], s->read(k1)) << "n_in " << n_in << " T=" << t << " k";
        EXPECT_EQ(want[2], s->read(v1)) << "n_in " << n_in << " T=" << t << " v";
      }
      const char* names[] = {"q", "k", "v"};
      for (int i = 0; i < 3; ++i)
        report("linears " + std::string(names[i]) + " n_in " + std::to_string(n_in) + " T=" + std::to_string(t),
               nmse(got[i], want[i]), kBf16Out);
    }
  }
}

TEST_F(BackendParity, Rope) {
  struct Case { int64_t heads, dim; int rotary; bool interleaved; float scaling; int max_pos; };
  for (const Case c : {Case{4, 24, 24, false, 1.0f, 100}, Case{8, 128, 128, false, 1.0f, 32768},
                       Case{2, 128, 64, false, 1.0f, 4096}, Case{4, 64, 64, true, 1.2f, 40000}}) {
    const int64_t t = 19;
    const auto x = randn(t * c.heads * c.dim);
    std::vector<int32_t> pos(static_cast<size_t>(t));
    for (auto& p : pos) p = int32_t(rng() % uint32_t(c.max_pos));
    std::vector<float> inv(static_cast<size_t>(c.rotary / 2));
    for (int i = 0; i < c.rotary / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / c.rotary));
    std::vector<float> got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      RopeSpec spec{.inv_freq = s->put(inv, {int64_t(inv.size())}, DType::F32), .attention_scaling = c.scaling,
                    .rotary_dim = c.rotary, .interleaved = c.interleaved};
      const TensorView xv = s->act(x, {t, c.heads, c.dim});
      s->b->rope(s->ctx, xv, s->ints(pos, {t}), spec);
      (s == cpu.get() ? want : got) = s->read(xv);
    }
    report("rope d=" + std::to_string(c.dim) + " rotary=" + std::to_string(c.rotary) +
               (c.interleaved ? " interleaved" : "") + " positions<" + std::to_string(c.max_pos),
           nmse(got, want), kBf16Out);
  }
}

TEST_F(BackendParity, QkNormRopeKvWrite) {
  // The fused attention-input step against the CPU, and on each backend against rms_norm,
  // rope and kv_write run in turn (bit for bit). Slots -1 (padding) write nothing.
  // From 128 tokens a head is held in registers (a kernel of its own): the same bits.
  struct Case { int64_t heads, kv_heads, dim; int rotary; bool interleaved, qk_norm; int64_t t; };
  for (const Case c : {Case{32, 4, 128, 128, false, true, 13}, Case{8, 2, 64, 32, true, false, 13},
                       Case{6, 3, 24, 24, false, true, 13}, Case{32, 4, 128, 128, false, true, 200},
                       Case{8, 2, 64, 32, true, false, 130}, Case{6, 2, 128, 64, false, true, 150},
                       Case{4, 2, 256, 256, true, true, 128}, Case{3, 1, 96, 96, false, true, 140}}) {
    const int64_t t = c.t, bs = 8;
    // Every token its own slot ((i * 7) mod slots, 7 prime to them): no two write one slot.
    int64_t n_blocks = (t + bs - 1) / bs + 1;
    if (n_blocks % 7 == 0) ++n_blocks;
    const auto q = randn(t * c.heads * c.dim, 2.0f), k = randn(t * c.kv_heads * c.dim, 2.0f),
               v = randn(t * c.kv_heads * c.dim), qn = randn(c.dim, 0.5f), kn = randn(c.dim, 0.5f);
    std::vector<int32_t> pos(static_cast<size_t>(t)), slots(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) {
      pos[size_t(i)] = int32_t(rng() % 5000u);
      slots[size_t(i)] = i % 5 == 3 ? -1 : int32_t((i * 7) % (n_blocks * bs));
    }
    std::vector<float> inv(static_cast<size_t>(c.rotary / 2));
    for (int i = 0; i < c.rotary / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / c.rotary));
    std::vector<float> got[3], want[3];
    for (Side* s : {cpu.get(), gpu.get()}) {
      const RopeSpec spec{.inv_freq = s->put(inv, {int64_t(inv.size())}, DType::F32), .rotary_dim = c.rotary,
                          .interleaved = c.interleaved};
      AttentionBatch b;
      b.n_tokens = int(t);
      b.positions = s->ints(pos, {t});
      b.slot_mapping = s->ints(slots, {t});
      const Shape cache_shape{n_blocks, bs, c.kv_heads, c.dim};
      std::vector<float> results[2][3];
      for (int fused = 0; fused < 2; ++fused) {
        const KvCacheLayer cache{s->put(std::vector<float>(size_t(cache_shape.numel()), 0.0f), cache_shape,
                                        s->b->kv_dtype()),
                                 s->put(std::vector<float>(size_t(cache_shape.numel()), 0.0f), cache_shape,
                                        s->b->kv_dtype()),
                                 {}};
        const TensorView qv = s->act(q, {t, c.heads, c.dim}), kv = s->act(k, {t, c.kv_heads, c.dim}),
                         vv = s->act(v, {t, c.kv_heads, c.dim});
        const TensorView qnv = c.qk_norm ? s->put(qn, {c.dim}, DType::BF16) : TensorView{},
                         knv = c.qk_norm ? s->put(kn, {c.dim}, DType::BF16) : TensorView{};
        if (fused) {
          s->b->qk_norm_rope_kv_write(s->ctx, qv, kv, vv, qnv, knv, 1e-6f, spec, b, cache);
        } else {
          if (c.qk_norm) {
            s->b->rms_norm(s->ctx, qv, qnv, 1e-6f, qv);
            s->b->rms_norm(s->ctx, kv, knv, 1e-6f, kv);
          }
          s->b->rope(s->ctx, qv, b.positions, spec);
          s->b->rope(s->ctx, kv, b.positions, spec);
          s->b->kv_write(s->ctx, kv, vv, b, cache);
        }
        results[fused][0] = s->read(qv), results[fused][1] = s->read(cache.k), results[fused][2] = s->read(cache.v);
      }
      for (int i = 0; i < 3; ++i) EXPECT_EQ(results[1][i], results[0][i]) << s->b->name() << " output " << i;
      for (int i = 0; i < 3; ++i) (s == cpu.get() ? want : got)[i] = results[1][i];
    }
    const std::string name = " T=" + std::to_string(t) + " d=" + std::to_string(c.dim) + " rotary=" +
                             std::to_string(c.rotary) + (c.qk_norm ? " qk-norm" : "") +
                             (c.interleaved ? " interleaved" : "");
    report("qk_norm_rope_kv_write q" + name, nmse(got[0], want[0]), kBf16Out);
    report("qk_norm_rope_kv_write k cache" + name, nmse(got[1], want[1]), kBf16Out);
    report("qk_norm_rope_kv_write v cache" + name, nmse(got[2], want[2]), kBf16Out);
  }
}

TEST_F(BackendParity, MlaRopeCacheWrite) {
  // MLA's fused attention-input step against the CPU, and on each backend against the ops it
  // replaces (copy_columns, rms_norm, rope, cache_write: the default). Slots -1 write nothing.
  struct Case { int64_t heads, dn, dr, rank; int rotary; bool interleaved; };
  // q_nope is copied 16 bytes at a time where its rows allow (dn and dn + dr multiples of 8),
  // else a value at a time (dn 20).
  for (const Case c : {Case{64, 192, 64, 512, 64, true}, Case{5, 24, 16, 40, 8, false}, Case{3, 128, 64, 600, 64, false},
                       Case{4, 20, 12, 40, 12, false}}) {
    const int64_t t = 11, n_blocks = 3, bs = 8, width = c.rank + c.dr;
    const auto q = randn(t * c.heads * (c.dn + c.dr), 2.0f), ckv = randn(t * width, 2.0f), kn = randn(c.rank, 0.5f);
    std::vector<int32_t> pos(static_cast<size_t>(t)), slots(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) {
      pos[size_t(i)] = int32_t(rng() % 100000u);
      slots[size_t(i)] = i % 4 == 2 ? -1 : int32_t((i * 5) % (n_blocks * bs));
    }
    std::vector<float> inv(static_cast<size_t>(c.rotary / 2));
    for (int i = 0; i < c.rotary / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / c.rotary));
    std::vector<float> got[4], want[4];
    for (Side* s : {cpu.get(), gpu.get()}) {
      const RopeSpec spec{.inv_freq = s->put(inv, {int64_t(inv.size())}, DType::F32), .attention_scaling = 1.25f,
                          .rotary_dim = c.rotary, .interleaved = c.interleaved};
      AttentionBatch b;
      b.n_tokens = int(t);
      b.positions = s->ints(pos, {t});
      b.slot_mapping = s->ints(slots, {t});
      const TensorView norm = s->put(kn, {c.rank}, DType::BF16);
      std::vector<float> results[2][4];
      for (int fused = 0; fused < 2; ++fused) {
        const Shape cache_shape{n_blocks, bs, 1, width};
        const TensorView cache = s->put(std::vector<float>(size_t(cache_shape.numel()), 0.0f), cache_shape, s->b->kv_dtype());
        const TensorView qv = s->act(q, {t, c.heads, c.dn + c.dr}), cv = s->act(ckv, {t, width});
        const TensorView qn = s->out_act({t, c.heads, c.dn}), qr = s->out_act({t, c.heads, c.dr});
        if (fused)
          s->b->mla_rope_cache_write(s->ctx, qv, qn, qr, cv, norm, 1e-6f, spec, b, cache);
        else
          s->b->Backend::mla_rope_cache_write(s->ctx, qv, qn, qr, cv, norm, 1e-6f, spec, b, cache);
        results[fused][0] = s->read(qn), results[fused][1] = s->read(qr), results[fused][2] = s->read(cv),
        results[fused][3] = s->read(cache);
      }
      for (int i = 0; i < 4; ++i) {
        const double e = nmse(results[1][i], results[0][i]);
        EXPECT_LE(e, kBf16Out) << s->b->name() << " fused against the separate ops, output " << i;
      }
      for (int i = 0; i < 4; ++i) (s == cpu.get() ? want : got)[i] = results[1][i];
    }
    const std::string name = " heads=" + std::to_string(c.heads) + " rank=" + std::to_string(c.rank) +
                             " dr=" + std::to_string(c.dr) + " rotary=" + std::to_string(c.rotary) +
                             (c.interleaved ? " interleaved" : "");
    report("mla_rope_cache_write q_nope" + name, nmse(got[0], want[0]), 0.0);
    report("mla_rope_cache_write q_rope" + name, nmse(got[1], want[1]), kBf16Out);
    report("mla_rope_cache_write ckv" + name, nmse(got[2], want[2]), kBf16Out);
    report("mla_rope_cache_write cache" + name, nmse(got[3], want[3]), kBf16Out);
  }
}

TEST_F(BackendParity, ElementwiseGatherAndColumns) {
  const int64_t t = 33, n = 200;
  const auto a = randn(t * n), b = randn(t * n);
  std::vector<int32_t> rows = {32, 0, 7, 7, 31};
  std::vector<float> got[4], want[4];
  for (Side* s : {cpu.get(), gpu.get()}) {
    auto& r = s == cpu.get() ? want : got;
    const TensorView av = s->act(a, {t, n}), bv = s->act(b, {t, n});
    const TensorView sum = s->out_act({t, n}), prod = s->out_act({t, n});
    s->b->add(s->ctx, av, bv, sum);
    s->b->silu_mul(s->ctx, av, bv, prod);
    const TensorView g = s->out_act({int64_t(rows.size()), n});
    s->b->gather_rows(s->ctx, av, s->ints(rows, {int64_t(rows.size())}), g);
    const TensorView cols = s->act(std::vector<float>(size_t(t * 50), 0.5f), {t, 50});
    s->b->copy_columns(s->ctx, av, 13, cols, 7, 29);
    r[0] = s->read(sum), r[1] = s->read(prod), r[2] = s->read(g), r[3] = s->read(cols);
  }
  report("add", nmse(got[0], want[0]), kBf16Out);
  report("silu_mul", nmse(got[1], want[1]), kBf16Out);
  report("gather_rows (a copy)", nmse(got[2], want[2]), 0.0);
  report("copy_columns (a copy)", nmse(got[3], want[3]), 0.0);
}

// A paged batch: sequences with a cached prefix (`context`) and `new_tokens` this step, their
// blocks scattered over the pool. Two steps on the same cache: the prefixes first, then the
// new tokens (the prefix cache).
struct SeqSpec { int context, new_tokens; };

struct PagedStep {
  std::vector<int32_t> pos, slots, starts{0}, lens, tables;
  int n = 0, max_q = 0, max_len = 0;

  AttentionBatch on(Side& s, int bs, int mbps) const {
    AttentionBatch b;
    b.n_tokens = n;
    b.n_seqs = int(lens.size());
    b.block_size = bs;
    b.max_blocks_per_seq = mbps;
    b.max_query_len = max_q;
    b.max_seq_len = max_len;
    b.positions = s.ints(pos, {n});
    b.slot_mapping = s.ints(slots, {n});
    b.seq_starts = s.ints(starts, {int64_t(starts.size())});
    b.seq_lens = s.ints(lens, {int64_t(lens.size())});
    b.block_tables = s.ints(tables, {int64_t(lens.size()), mbps});
    return b;
  }
};

struct PagedSteps {
  PagedStep pre, now;
  int64_t total_blocks = 0;
  int bs = 0, mbps = 0;
};

// spare_blocks: table rows longer than the longest sequence needs, as the engine's are (sized
// for the model's context).
PagedSteps paged_steps(const std::vector<SeqSpec>& seqs, int bs, std::mt19937& rng, int spare_blocks = 0) {
  PagedSteps out;
  out.bs = bs;
  int max_len = 0;
  for (const SeqSpec& s : seqs) {
    out.total_blocks += (s.context + s.new_tokens + bs - 1) / bs;
    max_len = std::max(max_len, s.context + s.new_tokens);
  }
  out.mbps = (max_len + bs - 1) / bs + spare_blocks;
  std::vector<int32_t> perm(static_cast<size_t>(out.total_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next_block = 0;
  for (const SeqSpec& s : seqs) {
    const int len = s.context + s.new_tokens, nb = (len + bs - 1) / bs;
    std::vector<int32_t> table(static_cast<size_t>(out.mbps), 0);
    for (int b = 0; b < nb; ++b) table[size_t(b)] = perm[size_t(next_block++)];
    auto add = [&](PagedStep& st, int from, int to) {
      for (int j = from; j < to; ++j) {
        st.pos.push_back(j);
        st.slots.push_back(table[size_t(j / bs)] * bs + j % bs);
      }
      st.n += to - from;
      st.starts.push_back(st.n);
      st.lens.push_back(to);
      st.tables.insert(st.tables.end(), table.begin(), table.end());
      st.max_q = std::max(st.max_q, to - from);
      st.max_len = std::max(st.max_len, to);
    };
    if (s.context > 0) add(out.pre, 0, s.context);
    add(out.now, s.context, len);
  }
  return out;
}

// An FP8 cache (both backends made with --kv-cache-dtype fp8_e4m3) stores k / k_scale and
// v / v_scale; both backends must write the same bytes from the same inputs.
void attention_case(BackendParity& p, const std::vector<SeqSpec>& seqs, int heads, int kv_heads, int dim, int bs,
                    const std::string& name, float k_scale = 1.0f, float v_scale = 1.0f) {
  const PagedSteps steps = paged_steps(seqs, bs, p.rng);
  const int64_t pre_tokens = steps.pre.n, n_tokens = steps.now.n;
  const auto k_pre = p.randn(pre_tokens * kv_heads * dim), v_pre = p.randn(pre_tokens * kv_heads * dim);
  const auto k_now = p.randn(n_tokens * kv_heads * dim), v_now = p.randn(n_tokens * kv_heads * dim);
  const auto q = p.randn(n_tokens * heads * dim);
  std::vector<float> got, want;
  std::vector<uint8_t> cache_bytes[2];
  const bool fp8 = p.cpu->b->kv_dtype() == DType::F8_E4M3;
  for (Side* s : {p.cpu.get(), p.gpu.get()}) {
    const Shape cache_shape{steps.total_blocks, bs, kv_heads, dim};
    KvCacheLayer cache{s->out(cache_shape, s->b->kv_dtype()), s->out(cache_shape, s->b->kv_dtype()), {}, k_scale,
                       v_scale};
    if (pre_tokens > 0) {
      const AttentionBatch b = steps.pre.on(*s, bs, steps.mbps);
      s->b->kv_write(s->ctx, s->act(k_pre, {pre_tokens, kv_heads, dim}), s->act(v_pre, {pre_tokens, kv_heads, dim}),
                     b, cache);
    }
    const AttentionBatch b = steps.now.on(*s, bs, steps.mbps);
    s->b->kv_write(s->ctx, s->act(k_now, {n_tokens, kv_heads, dim}), s->act(v_now, {n_tokens, kv_heads, dim}), b,
                   cache);
    const TensorView o = s->out_act({n_tokens, heads, dim});
    s->arena->reset();
    s->b->attention(s->ctx, s->act(q, {n_tokens, heads, dim}), cache, b, 1.0f / std::sqrt(float(dim)), o);
    (s == p.cpu.get() ? want : got) = s->read(o);
    if (fp8) {
      auto& bytes = cache_bytes[s == p.cpu.get() ? 0 : 1];
      for (const TensorView t : {cache.k, cache.v}) {
        std::vector<uint8_t> h(static_cast<size_t>(t.nbytes()));
        s->b->copy_to_host(h.data(), t);
        bytes.insert(bytes.end(), h.begin(), h.end());
      }
    }
  }
  if (fp8) {
    int64_t differ = 0;
    for (size_t i = 0; i < cache_bytes[0].size(); ++i) differ += cache_bytes[0][i] != cache_bytes[1][i];
    EXPECT_EQ(differ, 0) << name << ": FP8 cache bytes the backends wrote differently";
  }
  report(std::string(fp8 ? "attention, FP8 cache, " : "attention ") + name, nmse(got, want), kBf16Inner);
}

TEST_F(BackendParity, AttentionDecodePrefillAndMixed) {
  attention_case(*this, {{0, 1}}, 4, 2, 24, 16, "one token, context 1, d=24");
  attention_case(*this, {{4095, 1}}, 32, 4, 128, 16, "decode at 4k, 32/4 heads, d=128");
  attention_case(*this, {{32767, 1}}, 8, 1, 128, 16, "decode at 32k, one sequence (split-KV)");
  attention_case(*this, {{0, 300}}, 8, 2, 128, 16, "prefill of 300 from position 0");
  attention_case(*this, {{123, 77}}, 4, 4, 64, 16, "prefix-cached prefill (123 cached + 77)");
  attention_case(*this, {{1000, 1}, {0, 33}, {17, 1}, {250, 40}, {0, 1}, {2047, 1}, {5, 19}, {64, 64}, {999, 2}},
                 16, 4, 128, 16, "9 mixed sequences across block boundaries");
  attention_case(*this, {{30, 5}, {7, 1}}, 4, 2, 20, 7, "d=20, block size 7");
  attention_case(*this, {{100, 3}}, 2, 1, 256, 1, "d=256, block size 1");
}

// --kv-cache-dtype fp8_e4m3 on both backends: kv_write's bytes equal, attention within the
// BF16 tolerance of reading the same bytes (the scales are no powers of 2).
struct BackendParityFp8Kv : BackendParity {
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device";
    cpu = std::make_unique<Side>(make_cpu_backend(4, DType::F8_E4M3));
    gpu = std::make_unique<Side>(make_backend({.device = "cuda", .kv_cache_dtype = DType::F8_E4M3}));
  }
};

TEST_F(BackendParityFp8Kv, AttentionDecodePrefillAndMixed) {
  attention_case(*this, {{0, 1}}, 4, 2, 24, 16, "one token, context 1, d=24 (fallback)", 0.37f, 1.7f);
  attention_case(*this, {{4095, 1}}, 32, 4, 128, 16, "decode at 4k, 32/4 heads, d=128", 0.37f, 1.7f);
  attention_case(*this, {{32767, 1}}, 8, 1, 128, 16, "decode at 32k, one sequence (split-KV)", 0.37f, 1.7f);
  attention_case(*this, {{0, 300}}, 8, 2, 128, 16, "prefill of 300 from position 0", 0.37f, 1.7f);
  attention_case(*this, {{123, 77}}, 4, 4, 64, 16, "prefix-cached prefill (123 cached + 77)", 2.5f, 0.3f);
  attention_case(*this, {{1000, 1}, {0, 33}, {17, 1}, {250, 40}, {0, 1}, {2047, 1}, {5, 19}, {64, 64}, {999, 2}},
                 16, 4, 128, 16, "9 mixed sequences across block boundaries", 0.37f, 1.7f);
  attention_case(*this, {{100, 3}}, 2, 1, 256, 1, "d=256, block size 1", 1.0f, 1.0f);
}

// MLA over the latent cache (rows [latent | rope key] written by cache_write), with every key
// up to each token's position, or only those a DSA list names: random positions of the
// token's keys, with unused entries (-1) and entries past its position (neither is a key).
struct MlaShape { int heads, rank, rope; };

void mla_case(BackendParity& p, const std::vector<SeqSpec>& seqs, MlaShape m, int bs, int top_k,
              const std::string& name) {
  const PagedSteps steps = paged_steps(seqs, bs, p.rng);
  const int width = m.rank + m.rope;
  const int64_t pre_tokens = steps.pre.n, n_tokens = steps.now.n;
  const auto c_pre = p.randn(pre_tokens * width), c_now = p.randn(n_tokens * width);
  const auto ql = p.randn(n_tokens * m.heads * m.rank), qr = p.randn(n_tokens * m.heads * m.rope);
  std::vector<int32_t> sel;
  for (int64_t t = 0; top_k > 0 && t < n_tokens; ++t) {
    const int pos = steps.now.pos[size_t(t)];
    std::vector<int32_t> keys(static_cast<size_t>(pos + 1));
    std::iota(keys.begin(), keys.end(), 0);
    std::shuffle(keys.begin(), keys.end(), p.rng);
    for (int j = 0; j < top_k; ++j) {
      int32_t v = size_t(j) < keys.size() ? keys[size_t(j)] : -1;
      if (j % 7 == 3) v = -1;
      if (j % 11 == 5) v = pos + 1 + j;
      sel.push_back(v);
    }
  }
  const float scale = 0.1f;  // scores of a few units: a softmax neither flat nor one-hot
  const bool fp8 = p.cpu->b->kv_dtype() == DType::F8_E4M3;
  std::vector<float> got, want, caches[2];
  for (Side* s : {p.cpu.get(), p.gpu.get()}) {
    KvCacheLayer cache{s->out({steps.total_blocks, bs, 1, width}, s->b->kv_dtype()), {}, {}};
    if (pre_tokens > 0)
      s->b->cache_write(s->ctx, s->act(c_pre, {pre_tokens, width}), steps.pre.on(*s, bs, steps.mbps), cache.k);
    const AttentionBatch b = steps.now.on(*s, bs, steps.mbps);
    s->b->cache_write(s->ctx, s->act(c_now, {n_tokens, width}), b, cache.k);
    const TensorView selected = top_k > 0 ? s->ints(sel, {n_tokens, top_k}) : TensorView{};
    const TensorView o = s->out_act({n_tokens, m.heads, m.rank});
    s->arena->reset();
    s->b->mla_attention(s->ctx, s->act(ql, {n_tokens, m.heads, m.rank}), s->act(qr, {n_tokens, m.heads, m.rope}),
                        cache, b, scale, selected, o);
    (s == p.cpu.get() ? want : got) = s->read(o);
    if (fp8) caches[s == p.cpu.get() ? 0 : 1] = s->read(cache.k);
  }
  if (fp8) {  // the same E4M3 values from the same BF16 inputs (unwritten rows: NaN on both)
    int64_t differ = 0;
    for (size_t i = 0; i < caches[0].size(); ++i)
      differ += caches[0][i] != caches[1][i] && !(std::isnan(caches[0][i]) && std::isnan(caches[1][i]));
    EXPECT_EQ(differ, 0) << name << ": FP8 latent values the backends wrote differently";
  }
  report(std::string(fp8 ? "mla_attention, FP8 cache, " : "mla_attention ") + name, nmse(got, want), kBf16Inner);
}

const MlaShape kGlm5{64, 512, 64}, kDeepseek{128, 512, 64}, kNarrow{16, 512, 64}, kTiny{4, 32, 8};

TEST_F(BackendParity, MlaAttentionDecodePrefillAndSelected) {
  const MlaShape glm5 = kGlm5, deepseek = kDeepseek, narrow = kNarrow, tiny = kTiny;
  mla_case(*this, {{0, 1}}, narrow, 16, 0, "one token, context 1");
  mla_case(*this, {{4095, 1}}, glm5, 64, 0, "GLM-5 decode at 4k");
  mla_case(*this, {{32767, 1}}, narrow, 64, 0, "decode at 32k, one sequence (split keys)");
  mla_case(*this, {{131071, 1}}, glm5, 64, 0, "GLM-5 decode at 128k");
  mla_case(*this, {{2000, 1}, {5000, 1}, {1, 1}}, deepseek, 64, 0, "DeepSeek-V3 decode, 3 sequences");
  mla_case(*this, {{0, 300}}, narrow, 16, 0, "prefill of 300 from position 0");
  mla_case(*this, {{123, 77}}, {8, 512, 64}, 16, 0, "prefix-cached prefill (123 cached + 77)");
  mla_case(*this, {{10, 7}, {0, 3}}, {20, 512, 64}, 16, 0, "20 heads: row tiles across tokens");
  mla_case(*this, {{1000, 1}, {0, 33}, {17, 1}, {250, 40}, {0, 1}, {2047, 1}, {5, 19}, {64, 64}, {999, 2}}, narrow,
           16, 0, "9 mixed sequences across block boundaries");
  mla_case(*this, {{30, 5}, {7, 1}}, tiny, 7, 0, "tiny fixture shape (fallback), block size 7");
  // Batches split 8, 4 and 2 ways a row tile on 132 SMs; the splits merge inside a thread-block
  // cluster where the GPU holds all the grid's clusters at once (on the H200: 2 and 4 a cluster),
  // else in the combine kernel. Mixed lengths: some splits of the short sequences have no keys.
  std::vector<SeqSpec> b16, b33, b64;
  for (int s = 0; s < 16; ++s) b16.push_back({(s * 397) % 3000, 1});
  for (int s = 0; s < 33; ++s) b33.push_back({(s * 211) % 1500, 1});
  for (int s = 0; s < 64; ++s) b64.push_back({(s * 131) % 2500, 1});
  mla_case(*this, b16, glm5, 64, 0, "GLM-5 decode, 16 mixed sequences (8 splits)");
  mla_case(*this, b33, glm5, 64, 0, "GLM-5 decode, 33 mixed sequences (4 splits)");
  mla_case(*this, b64, glm5, 64, 2048, "GLM-5 decode, 64 sequences over 2,048 selected keys (2 splits)");
  mla_case(*this, {{200, 30}}, glm5, 64, 0, "GLM-5 prefill of 30 after 200 cached (30 row tiles, 4 splits)");
  mla_case(*this, {{4095, 1}, {100, 1}, {3, 1}}, glm5, 64, 2048, "GLM-5 decode over 2,048 selected keys");
  mla_case(*this, {{50, 40}}, narrow, 16, 32, "prefill over 32 selected keys per token");
  mla_case(*this, {{20, 3}, {0, 2}}, tiny, 4, 6, "tiny shape (fallback), 6 selected keys");
}

// An E4M3 latent cache: every kernel (fallback, the mma.sync tiles, wgmma with and without a
// cluster merge, selected keys) stages and widens its bytes, held to the BF16 tolerance of
// reading the same values, which both backends must have written.
TEST_F(BackendParityFp8Kv, MlaAttentionDecodePrefillAndSelected) {
  std::vector<SeqSpec> b16, b33, b64;
  for (int s = 0; s < 16; ++s) b16.push_back({(s * 397) % 3000, 1});
  for (int s = 0; s < 33; ++s) b33.push_back({(s * 211) % 1500, 1});
  for (int s = 0; s < 64; ++s) b64.push_back({(s * 131) % 2500, 1});
  mla_case(*this, {{0, 1}}, kNarrow, 16, 0, "one token, context 1 (tiled)");
  mla_case(*this, {{32767, 1}}, kNarrow, 64, 0, "decode at 32k, one sequence (tiled, split keys)");
  mla_case(*this, {{50, 40}}, kNarrow, 16, 32, "prefill over 32 selected keys per token (tiled)");
  mla_case(*this, {{4095, 1}}, kGlm5, 64, 0, "GLM-5 decode at 4k (wgmma)");
  mla_case(*this, {{2000, 1}, {5000, 1}, {1, 1}}, kDeepseek, 64, 0, "DeepSeek-V3 decode, 3 sequences (wgmma)");
  mla_case(*this, {{0, 300}}, kNarrow, 16, 0, "prefill of 300 from position 0 (wgmma)");
  mla_case(*this, b16, kGlm5, 64, 0, "GLM-5 decode, 16 mixed sequences (wgmma, 8 splits)");
  // On 132 SMs these two split 4 and 2 ways, which merge in a thread-block cluster.
  mla_case(*this, b33, kGlm5, 64, 0, "GLM-5 decode, 33 mixed sequences (wgmma, 4 splits)");
  mla_case(*this, b64, kGlm5, 64, 2048, "GLM-5 decode, 64 sequences over 2,048 selected keys (2 splits)");
  mla_case(*this, {{4095, 1}, {100, 1}, {3, 1}}, kGlm5, 64, 2048, "GLM-5 decode over 2,048 selected keys (wgmma)");
  mla_case(*this, {{30, 5}, {7, 1}}, kTiny, 7, 0, "tiny fixture shape (fallback), block size 7");
  mla_case(*this, {{20, 3}, {0, 2}}, kTiny, 4, 6, "tiny shape (fallback), 6 selected keys");
}

// MLA's fused attention-input step into an E4M3 cache, on the GPU: each written row is its own
// normed and rotated latent (the op's ckv output) rounded to E4M3 once, as the separate ops'
// cache_write rounds it; slots -1 write nothing.
TEST_F(BackendParityFp8Kv, MlaRopeCacheWriteRoundsTheLatentOnce) {
  const int64_t t = 11, heads = 4, dn = 128, dr = 64, rank = 512, n_blocks = 3, bs = 8, width = rank + dr;
  const auto q = randn(t * heads * (dn + dr), 2.0f), ckv = randn(t * width, 2.0f), kn = randn(rank, 0.5f);
  std::vector<int32_t> pos(static_cast<size_t>(t)), slots(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    pos[size_t(i)] = int32_t(rng() % 100000u);
    slots[size_t(i)] = i % 4 == 2 ? -1 : int32_t((i * 5) % (n_blocks * bs));
  }
  std::vector<float> inv(32);
  for (int i = 0; i < 32; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / 64));
  Side& s = *gpu;
  const RopeSpec spec{.inv_freq = s.put(inv, {32}, DType::F32), .attention_scaling = 1.0f, .rotary_dim = 64,
                      .interleaved = true};
  AttentionBatch b;
  b.n_tokens = int(t);
  b.positions = s.ints(pos, {t});
  b.slot_mapping = s.ints(slots, {t});
  const TensorView norm = s.put(kn, {rank}, DType::BF16);
  std::vector<float> rows, cache_values[2];
  for (int fused = 0; fused < 2; ++fused) {
    const TensorView cache = s.put(std::vector<float>(size_t(n_blocks * bs * width), 0.0f), {n_blocks, bs, 1, width},
                                   DType::F8_E4M3);
    const TensorView qv = s.act(q, {t, heads, dn + dr}), cv = s.act(ckv, {t, width});
    const TensorView qn = s.out_act({t, heads, dn}), qr = s.out_act({t, heads, dr});
    if (fused)
      s.b->mla_rope_cache_write(s.ctx, qv, qn, qr, cv, norm, 1e-6f, spec, b, cache);
    else
      s.b->Backend::mla_rope_cache_write(s.ctx, qv, qn, qr, cv, norm, 1e-6f, spec, b, cache);
    if (fused) rows = s.read(cv);
    cache_values[fused] = s.read(cache);
  }
  int64_t written = 0;
  std::vector<bool> is_written(size_t(n_blocks * bs), false);
  for (int64_t i = 0; i < t; ++i) {
    if (slots[size_t(i)] < 0) continue;
    is_written[size_t(slots[size_t(i)])] = true;
    for (int64_t d = 0; d < width; ++d) {
      const float want = e4m3_to_f32(f32_to_e4m3(rows[size_t(i * width + d)]));
      const float got = cache_values[1][size_t(slots[size_t(i)] * width + d)];
      written += got == want;
      EXPECT_EQ(got, want) << "token " << i << " value " << d;
      if (got != want) break;
    }
  }
  EXPECT_EQ(written, 8 * width);
  for (int64_t slot = 0; slot < n_blocks * bs; ++slot) {
    if (is_written[size_t(slot)]) continue;
    for (int64_t d = 0; d < width; ++d) ASSERT_EQ(cache_values[1][size_t(slot * width + d)], 0.0f) << "slot " << slot;
  }
  EXPECT_LE(nmse(cache_values[1], cache_values[0]), kBf16Out) << "fused against the separate ops";
}

// The DSA's choice against a double-precision reference on the same inputs: both backends
// must take min(top_k, keys) distinct positions of the token's keys, and where their sets
// differ, each key in one but not the other must score within a rounding of the top_k-th
// score (f32 sums in another order). Keys that are equal score equally: the lower position
// wins on both.
void dsa_case(BackendParity& p, const std::vector<SeqSpec>& seqs, int heads, int dim, int top_k, int bs,
              bool all_equal, const std::string& name, int spare_blocks = 0) {
  const PagedSteps steps = paged_steps(seqs, bs, p.rng, spare_blocks);
  const int64_t pre_tokens = steps.pre.n, n_tokens = steps.now.n;
  auto k_pre = p.randn(pre_tokens * dim), k_now = p.randn(n_tokens * dim);
  if (all_equal) {
    std::fill(k_pre.begin(), k_pre.end(), 0.5f);
    std::fill(k_now.begin(), k_now.end(), 0.5f);
  }
  if (p.cpu->b->kv_dtype() == DType::F8_E4M3) {  // the keys both backends store, and the reference reads
    for (auto* keys : {&k_pre, &k_now})
      for (float& v : *keys) v = e4m3_to_f32(f32_to_e4m3(v));
  }
  const auto q = p.randn(n_tokens * heads * dim), weights = p.randn(n_tokens * heads, 1.0f, false);
  const float q_scale = 1.0f / std::sqrt(float(dim)), weight_scale = 1.0f / std::sqrt(float(heads));
  std::vector<std::vector<int32_t>> picked;
  for (Side* s : {p.cpu.get(), p.gpu.get()}) {
    KvCacheLayer cache{{}, {}, s->out({steps.total_blocks, bs, 1, dim}, s->b->kv_dtype())};
    if (pre_tokens > 0)
      s->b->cache_write(s->ctx, s->act(k_pre, {pre_tokens, dim}), steps.pre.on(*s, bs, steps.mbps), cache.index_k);
    const AttentionBatch b = steps.now.on(*s, bs, steps.mbps);
    s->b->cache_write(s->ctx, s->act(k_now, {n_tokens, dim}), b, cache.index_k);
    const TensorView sel = s->out({n_tokens, top_k}, DType::I32);
    s->arena->reset();
    s->b->dsa_select(s->ctx, s->act(q, {n_tokens, heads, dim}), s->put(weights, {n_tokens, heads}, DType::F32), cache,
                     b, q_scale, weight_scale, sel);
    std::vector<int32_t> v(static_cast<size_t>(n_tokens * top_k));
    s->b->copy_to_host(v.data(), sel);
    picked.push_back(std::move(v));
  }
  // Each token's keys in position order, from the prefix and the new tokens of its sequence.
  int64_t pre_at = 0, now_at = 0, differing = 0;
  for (size_t seq = 0; seq < seqs.size(); ++seq) {
    std::vector<const float*> key_rows;
    for (int j = 0; j < seqs[seq].context; ++j) key_rows.push_back(&k_pre[size_t((pre_at + j) * dim)]);
    for (int j = 0; j < seqs[seq].new_tokens; ++j) key_rows.push_back(&k_now[size_t((now_at + j) * dim)]);
    for (int j = 0; j < seqs[seq].new_tokens; ++j) {
      const int64_t t = now_at + j;
      const int n_keys = seqs[seq].context + j + 1, k = std::min(top_k, n_keys);
      std::vector<double> score(static_cast<size_t>(n_keys), 0.0);
      double max_abs = 0;
      for (int key = 0; key < n_keys; ++key) {
        for (int h = 0; h < heads; ++h) {
          double dot = 0;
          for (int d = 0; d < dim; ++d) dot += double(q[size_t((t * heads + h) * dim + d)]) * key_rows[size_t(key)][d];
          score[size_t(key)] += std::max(0.0, dot * q_scale) * weights[size_t(t * heads + h)] * weight_scale;
        }
        max_abs = std::max(max_abs, std::abs(score[size_t(key)]));
      }
      std::vector<double> sorted = score;
      std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<>());
      const double threshold = sorted[size_t(k - 1)], near = 1e-4 * max_abs;
      std::vector<std::set<int32_t>> sets;
      for (const auto& v : picked) {
        std::set<int32_t> chosen;
        for (int e = 0; e < top_k; ++e) {
          const int32_t pos = v[size_t(t * top_k + e)];
          if (e >= k) {
            EXPECT_EQ(pos, -1) << name << " token " << t << " entry " << e;
            continue;
          }
          EXPECT_TRUE(pos >= 0 && pos < n_keys) << name << " token " << t << " entry " << e << ": " << pos;
          chosen.insert(pos);
        }
        EXPECT_EQ(int(chosen.size()), k) << name << " token " << t << ": repeated positions";
        sets.push_back(std::move(chosen));
      }
      for (int32_t pos : sets[0]) {
        if (sets[1].count(pos)) continue;
        ++differing;
        EXPECT_LE(std::abs(score[size_t(pos)] - threshold), near) << name << " token " << t << " CPU-only " << pos;
      }
      for (int32_t pos : sets[1]) {
        if (sets[0].count(pos)) continue;
        EXPECT_LE(std::abs(score[size_t(pos)] - threshold), near) << name << " token " << t << " CUDA-only " << pos;
      }
      if (all_equal) {
        for (int32_t pos : sets[1]) EXPECT_LT(pos, k) << name << ": ties go to the lowest positions";
      }
    }
    pre_at += seqs[seq].context;
    now_at += seqs[seq].new_tokens;
  }
  std::printf("  %-58s %lld keys differ at the threshold\n", ("dsa_select " + name).c_str(), (long long)differing);
}

TEST_F(BackendParity, DsaSelectAboveAndBelowTopK) {
  dsa_case(*this, {{0, 1}}, 32, 128, 2048, 64, false, "one token: every key");
  dsa_case(*this, {{4095, 1}, {1000, 1}, {10, 1}}, 32, 128, 2048, 64, false, "GLM-5 decode: 4k, 1k, 11 keys");
  dsa_case(*this, {{32767, 1}}, 32, 128, 2048, 64, false, "decode at 32k");
  dsa_case(*this, {{60, 80}}, 8, 32, 16, 16, false, "prefill, top 16 of up to 140 keys");
  dsa_case(*this, {{3000, 1}}, 4, 64, 100, 16, true, "3,001 equal keys: the first 100");
  dsa_case(*this, {{39999, 1}}, 4, 64, 100, 64, true, "40,000 equal keys over 3 slices: the first 100");
  dsa_case(*this, {{131071, 1}}, 32, 128, 2048, 64, false, "GLM-5 decode at 128k (8 slices)");
  // More survivors than a block holds in registers: the final stage reads them from memory.
  dsa_case(*this, {{163839, 1}}, 4, 64, 2048, 64, false, "160k keys: 10 slices, 20,480 survivors");
  dsa_case(*this, {{20, 3}, {0, 2}}, 8, 32, 4, 7, false, "tiny fixture shape, block size 7");
  // Prompts under table rows sized for a long context: the keys the step has, not the row's.
  dsa_case(*this, {{0, 700}}, 32, 128, 512, 64, false, "prefill of 700 under a row of 192k keys", 3000);
  dsa_case(*this, {{100, 300}, {0, 50}, {5000, 2}}, 32, 128, 256, 64, false, "mixed step, rows of 64k", 900);
}

// E4M3 index keys on both backends: both scores kernels (mma.sync for 32 heads of 128 and 8 of
// 32, a thread a key for 4 of 64) widen them as they read.
TEST_F(BackendParityFp8Kv, DsaSelectAboveAndBelowTopK) {
  dsa_case(*this, {{4095, 1}, {1000, 1}, {10, 1}}, 32, 128, 2048, 64, false, "FP8 keys, GLM-5 decode: 4k, 1k, 11 keys");
  dsa_case(*this, {{60, 80}}, 8, 32, 16, 16, false, "FP8 keys, prefill, top 16 of up to 140 keys");
  dsa_case(*this, {{3000, 1}}, 4, 64, 100, 16, true, "FP8 keys, 3,001 equal keys: the first 100");
  dsa_case(*this, {{1999, 1}}, 4, 64, 100, 16, false, "FP8 keys, 4 heads of 64 (a thread a key)");
  dsa_case(*this, {{20, 3}, {0, 2}}, 8, 32, 4, 7, false, "FP8 keys, tiny fixture shape, block size 7");
}

TEST_F(BackendParity, HeadLinearBothDirections) {
  // kv_b_proj's per-head halves as MLA absorbs them: W_UK^T q_nope into the latent space,
  // W_UV o_latent out of it. Dense BF16 runs one batched GEMM; other formats the general kernel.
  struct Case { WeightFormat f; int64_t t, heads, stride, row0, n_rows, k; bool transposed; const char* name; };
  const Case cases[] = {
      {WeightFormat::Dense, 1, 8, 448, 0, 192, 512, true, "GLM-5 W_UK^T, decode"},
      {WeightFormat::Dense, 7, 8, 448, 192, 256, 512, false, "GLM-5 W_UV, 7 tokens"},
      {WeightFormat::Dense, 300, 4, 448, 0, 192, 512, true, "GLM-5 W_UK^T, prefill"},
      {WeightFormat::Dense, 300, 4, 448, 192, 256, 512, false, "GLM-5 W_UV, prefill"},
      {WeightFormat::Dense, 5, 4, 32, 0, 16, 32, true, "tiny W_UK^T"},
      {WeightFormat::Dense, 5, 4, 32, 16, 16, 32, false, "tiny W_UV"},
      {WeightFormat::Nvfp4, 3, 4, 48, 16, 32, 64, true, "nvfp4 transposed"},
      {WeightFormat::Nvfp4, 3, 4, 48, 16, 32, 64, false, "nvfp4 plain"},
  };
  for (const Case& c : cases) {
    HostLinear h = host_linear(c.f, DType::BF16, c.heads * c.stride, c.k, false);
    const int64_t x_width = c.transposed ? c.n_rows : c.k, out_width = c.transposed ? c.k : c.n_rows;
    const auto x = randn(c.t * c.heads * x_width);
    std::vector<float> got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      const LinearWeight w = s->b->upload(h.view);
      const TensorView o = s->out_act({c.t, c.heads, out_width});
      s->b->head_linear(s->ctx, s->act(x, {c.t, c.heads, x_width}), w, c.stride, c.row0, c.n_rows, c.transposed, o);
      (s == cpu.get() ? want : got) = s->read(o);
    }
    report(std::string("head_linear ") + c.name + " T=" + std::to_string(c.t), nmse(got, want), kBf16Out);
  }
}

TEST_F(BackendParity, RouteSoftmaxAndGroupedSigmoid) {
  struct Case { Scoring s; int t, e, k, groups, topk_groups; bool norm; float scale; };
  for (const Case c : {Case{Scoring::Softmax, 1, 8, 2, 1, 1, true, 1.0f}, Case{Scoring::Softmax, 33, 128, 8, 1, 1, true, 1.0f},
                       Case{Scoring::Softmax, 5, 8, 2, 1, 1, false, 1.0f},
                       Case{Scoring::Sigmoid, 17, 256, 8, 8, 4, true, 2.5f}, Case{Scoring::Sigmoid, 3, 16, 4, 1, 1, true, 1.0f}}) {
    const auto logits = randn(int64_t(c.t) * c.e, 2.0f, false), bias = randn(c.e, 0.1f, false);
    std::vector<float> ids[2], w[2];
    for (Side* s : {cpu.get(), gpu.get()}) {
      RoutingSpec spec{.scoring = c.s, .top_k = c.k, .norm_topk_prob = c.norm, .routed_scaling_factor = c.scale,
                       .n_group = c.groups, .topk_group = c.topk_groups};
      if (c.s == Scoring::Sigmoid) spec.correction_bias = s->put(bias, {c.e}, DType::F32);
      const TensorView iv = s->out({c.t, c.k}, DType::I32), wv = s->out({c.t, c.k}, DType::F32);
      s->b->route(s->ctx, s->put(logits, {c.t, c.e}, DType::F32), spec, iv, wv);
      const int side = s == cpu.get() ? 0 : 1;
      ids[side] = s->read(iv), w[side] = s->read(wv);
    }
    EXPECT_EQ(ids[0], ids[1]) << "route E=" << c.e << " k=" << c.k;
    report("route weights E=" + std::to_string(c.e) + " k=" + std::to_string(c.k), nmse(w[1], w[0]), 1e-10);
  }
}

// Experts in host memory: n experts of [inter, hidden] gate/up and [hidden, inter] down.
struct HostExperts {
  std::vector<HostLinear> mats;  // 3 per expert
  std::vector<MlpWeights> views;
  std::optional<MlpWeights> shared;
};

HostExperts host_experts(BackendParity& p, WeightFormat f, int n, int64_t hidden, int64_t inter, int64_t shared_inter) {
  HostExperts h;
  const DType dt = f == WeightFormat::Nvfp4 ? DType::U8 : DType::BF16;
  const int total = n + (shared_inter > 0 ? 1 : 0);
  h.mats.reserve(size_t(3 * total));
  for (int e = 0; e < total; ++e) {
    const int64_t i = e < n ? inter : shared_inter;
    h.mats.push_back(p.host_linear(f, dt, i, hidden, false));
    h.mats.push_back(p.host_linear(f, dt, i, hidden, false));
    h.mats.push_back(p.host_linear(f, dt, hidden, i, false));
  }
  for (int e = 0; e < total; ++e) {
    const MlpWeights m{h.mats[size_t(3 * e)].view, h.mats[size_t(3 * e + 1)].view, h.mats[size_t(3 * e + 2)].view};
    if (e < n) h.views.push_back(m);
    else h.shared = m;
  }
  return h;
}

// `ids_of(t, j)` gives token t's j-th expert.
void moe_case(BackendParity& p, WeightFormat f, int n_experts, int64_t hidden, int64_t inter, int64_t shared_inter, int t,
              int k, const std::function<int(int, int)>& ids_of, const std::string& name) {
  HostExperts h = host_experts(p, f, n_experts, hidden, inter, shared_inter);
  const auto x = p.randn(int64_t(t) * hidden);
  std::vector<int32_t> ids(static_cast<size_t>(t * k));
  std::vector<float> w(static_cast<size_t>(t * k));
  for (int i = 0; i < t; ++i)
    for (int j = 0; j < k; ++j) ids[size_t(i * k + j)] = ids_of(i, j), w[size_t(i * k + j)] = 0.25f + 0.1f * float(j);
  std::vector<float> got, want;
  for (Side* s : {p.cpu.get(), p.gpu.get()}) {
    auto ex = s->b->prepare_experts(h.views, h.shared ? &*h.shared : nullptr);
    s->b->synchronize();
    const TensorView o = s->out_act({t, hidden});
    s->arena->reset();
    s->b->moe_experts(s->ctx, s->act(x, {t, hidden}), s->ints(ids, {t, k}), s->put(w, {t, k}, DType::F32), *ex, o);
    (s == p.cpu.get() ? want : got) = s->read(o);
  }
  const bool fast = hidden % 128 == 0 && inter % 128 == 0;
  report("moe " + name, nmse(got, want), fast ? kBf16Inner : kBf16Out);
}

TEST_F(BackendParity, MoeGeneralAndFastPaths) {
  // Distinct ids per token, spread over the experts: (3t + j) mod E with k <= E.
  auto spread = [](int n) { return [n](int t, int j) { return (t * 3 + j) % n; }; };
  moe_case(*this, WeightFormat::Dense, 8, 64, 24, 0, 1, 2, spread(8), "bf16 general, one token (H 64, I 24)");
  moe_case(*this, WeightFormat::Nvfp4, 8, 64, 32, 32, 37, 2, spread(8), "nvfp4 general + shared (H 64, I 32)");
  moe_case(*this, WeightFormat::Nvfp4, 16, 256, 128, 0, 1, 4, spread(16), "nvfp4 fast, one token");
  moe_case(*this, WeightFormat::Nvfp4, 16, 256, 128, 128, 77, 4, spread(16), "nvfp4 fast + shared, 77 tokens");
  moe_case(*this, WeightFormat::Dense, 16, 256, 128, 0, 50, 4, spread(16), "bf16 fast, 50 tokens");
  moe_case(*this, WeightFormat::Nvfp4, 16, 256, 128, 0, 300, 4, [](int, int j) { return 3 + j; },
           "nvfp4 fast, every token on experts 3-6 (the rest empty)");
  moe_case(*this, WeightFormat::Nvfp4, 8, 256, 128, 256, 9, 2, spread(8), "nvfp4 + shared of twice the width");
}

TEST_F(BackendParity, DummyWeightsAreTheSameOnBothBackends) {
  const RandomFill normal{}, near_one{.kind = RandomFill::NearOne}, bytes{.kind = RandomFill::Bytes, .lo = 0x30, .span = 8};
  for (const auto& [fill, dtype] : {std::pair{normal, DType::BF16}, std::pair{near_one, DType::BF16},
                                    std::pair{normal, DType::F32}, std::pair{bytes, DType::U8}}) {
    std::vector<float> v[2];
    for (Side* s : {cpu.get(), gpu.get()}) {
      auto buf = s->b->random_tensor(dtype, {333, 77}, fill, 42);
      const TensorView t = buf->view();
      if (dtype == DType::U8) {
        std::vector<uint8_t> h(static_cast<size_t>(t.numel()));
        s->b->copy_to_host(h.data(), t);
        v[s == gpu.get()].assign(h.begin(), h.end());
      } else {
        v[s == gpu.get()] = s->read(t);
      }
    }
    report(std::string("random_tensor ") + std::string(dtype_name(dtype)), nmse(v[1], v[0]), 1e-10);
  }
  // Dummy experts: the same MoE output from one seed (the CUDA fill writes the packed layout).
  for (WeightFormat f : {WeightFormat::Nvfp4, WeightFormat::Dense}) {
    const ExpertsSpec spec{.hidden = 256, .intermediate = 128, .n_experts = 8, .format = f, .shared_expert = true};
    const int t = 21, k = 2;
    const auto x = randn(t * 256);
    std::vector<int32_t> ids(static_cast<size_t>(t * k));
    for (int i = 0; i < t * k; ++i) ids[size_t(i)] = (i * 5 + i / k) % 8;
    for (int i = 0; i < t; ++i)
      if (ids[size_t(i * k)] == ids[size_t(i * k + 1)]) ids[size_t(i * k + 1)] = (ids[size_t(i * k)] + 1) % 8;
    std::vector<float> w(static_cast<size_t>(t * k), 0.5f), got, want;
    for (Side* s : {cpu.get(), gpu.get()}) {
      auto ex = s->b->random_experts(spec, 7);
      const TensorView o = s->out_act({t, 256});
      s->arena->reset();
      s->b->moe_experts(s->ctx, s->act(x, {t, 256}), s->ints(ids, {t, k}), s->put(w, {t, k}, DType::F32), *ex, o);
      (s == cpu.get() ? want : got) = s->read(o);
    }
    report(std::string("random_experts through moe (") + (f == WeightFormat::Nvfp4 ? "nvfp4)" : "bf16)"),
           nmse(got, want), kBf16Inner);
  }
}

TEST_F(BackendParity, SampleGreedyAndSeeded) {
  const int64_t rows = 6, vocab = 151936;
  const auto logits = randn(rows * vocab, 3.0f, false);
  std::vector<SamplingRow> recs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    recs[size_t(r)].temperature = r < 2 ? 0.0f : 0.7f;
    recs[size_t(r)].top_k = r == 3 ? 40 : 0;
    recs[size_t(r)].top_p = r == 4 ? 0.9f : 1.0f;
    recs[size_t(r)].n_top_logprobs = int32_t(r * 4);
    recs[size_t(r)].seed = uint64_t(1000 + r);
    recs[size_t(r)].position = 17 + r;
  }
  std::vector<SampledToken> out[2];
  for (Side* s : {cpu.get(), gpu.get()}) {
    const TensorView lv = s->put(logits, {rows, vocab}, DType::F32);
    s->keep.push_back(s->b->alloc(DType::U8, {rows * int64_t(sizeof(SamplingRow))}));
    const TensorView rv = s->keep.back()->view();
    s->b->copy_from_host(rv, recs.data());
    s->keep.push_back(s->b->alloc(DType::U8, {rows * int64_t(sizeof(SampledToken))}));
    const TensorView ov = s->keep.back()->view();
    const TensorView none = s->ints({}, {0});
    s->arena->reset();
    s->b->sample(s->ctx, lv, rv, none, none, ov);
    auto& o = out[s == gpu.get()];
    o.resize(size_t(rows));
    s->b->copy_to_host(o.data(), ov);
  }
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(out[0][size_t(r)].token, out[1][size_t(r)].token) << "row " << r;
    EXPECT_NEAR(out[0][size_t(r)].logprob, out[1][size_t(r)].logprob, 1e-4) << "row " << r;
    ASSERT_EQ(out[0][size_t(r)].n_top, out[1][size_t(r)].n_top) << "row " << r;
    for (int i = 0; i < out[0][size_t(r)].n_top; ++i)
      EXPECT_EQ(out[0][size_t(r)].top_ids[i], out[1][size_t(r)].top_ids[i]) << "row " << r << " alternative " << i;
  }
}

// Programmatic dependent launch (ops/cuda/launch.cuh): a decode-shaped chain of dependent
// kernels on the GPU alone (embedding, fused residual norms, q/k/v and MLP GEMVs, qk-norm and
// rope with the cache writes, split-KV attention and its combine, SiLU, a gather, the LM head,
// sampling; a memset and a host copy among them), each reading what the one before wrote and
// several rewriting their inputs in place, gives the plain launches' bits with PDL, eagerly
// and replayed from a CUDA graph. A kernel that touched global memory before its pdl_wait
// would read (or clobber) its predecessor's data while that still runs, and differ here
// sooner or later.
TEST_F(BackendParity, PdlChainGivesThePlainLaunchesBits) {
  ASSERT_TRUE(gpu->ctx.pdl) << "the CUDA backend turns PDL on for a compute capability 9.0 device";
  EXPECT_NE(gpu->b->name().find("PDL on"), std::string::npos) << gpu->b->name();
  Side& g = *gpu;
  const int64_t hidden = 512, heads = 8, kv_heads = 2, dim = 64, inter = 768, vocab = 1000;
  const int n_layers = 6, bs = 16;
  // One decode token a sequence over cached prefixes (split-KV plus combine): 1 sequence (the
  // linears on the GEMV), 4 and 12 (on the wgmma skinny kernel, in clusters).
  for (const int n_seqs : {1, 4, 12}) {
    SCOPED_TRACE(std::to_string(n_seqs) + " sequences");
    const int prefixes[] = {300, 37, 0, 1000};
    std::vector<SeqSpec> seqs;
    for (int i = 0; i < n_seqs; ++i) seqs.push_back({prefixes[i % 4] + (i >= 4 ? 3 * i : 0), 1});
    const PagedSteps steps = paged_steps(seqs, bs, rng);
    const int64_t t = steps.now.n;
    Arena arena(*g.b);  // its own: the previous case froze its arena at that case's size
    std::vector<HostLinear> hosts;  // uploads are queued: the host bytes stay until synchronize
    hosts.reserve(8);
    const auto weight = [&](int64_t n_out, int64_t n_in) {
      hosts.push_back(host_linear(WeightFormat::Dense, DType::BF16, n_out, n_in, false));
      return g.b->upload(hosts.back().view);
    };
    const LinearWeight wq = weight(heads * dim, hidden), wk = weight(kv_heads * dim, hidden),
                       wv = weight(kv_heads * dim, hidden), wo = weight(hidden, heads * dim),
                       w_gate = weight(inter, hidden), w_up = weight(inter, hidden), w_down = weight(hidden, inter),
                       lm_head = weight(vocab, hidden);
    g.b->synchronize();
    const TensorView table = g.put(randn(vocab * hidden), {vocab, hidden}, DType::BF16);
    const TensorView norm_attn = g.put(randn(hidden, 0.3f), {hidden}, DType::BF16),
                     norm_mlp = g.put(randn(hidden, 0.3f), {hidden}, DType::BF16),
                     norm_final = g.put(randn(hidden, 0.3f), {hidden}, DType::BF16),
                     q_norm = g.put(randn(dim, 0.5f), {dim}, DType::BF16),
                     k_norm = g.put(randn(dim, 0.5f), {dim}, DType::BF16);
    std::vector<float> inv(static_cast<size_t>(dim / 2));
    for (int i = 0; i < dim / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * i / dim));
    const RopeSpec rope{.inv_freq = g.put(inv, {dim / 2}, DType::F32), .rotary_dim = int(dim)};
    const Shape cache_shape{steps.total_blocks, bs, kv_heads, dim};
    const KvCacheLayer cache{g.out(cache_shape, g.b->kv_dtype()), g.out(cache_shape, g.b->kv_dtype()), {}};
    g.b->kv_write(g.ctx, g.act(randn(steps.pre.n * kv_heads * dim), {steps.pre.n, kv_heads, dim}),
                  g.act(randn(steps.pre.n * kv_heads * dim), {steps.pre.n, kv_heads, dim}),
                  steps.pre.on(g, bs, steps.mbps), cache);
    const AttentionBatch batch = steps.now.on(g, bs, steps.mbps);
    std::vector<int32_t> ids(static_cast<size_t>(t));
    for (auto& id : ids) id = int32_t(rng() % vocab);
    std::vector<int32_t> perm(static_cast<size_t>(t));  // a shuffle of the rows (5 is prime to 4 and 12)
    for (int64_t r = 0; r < t; ++r) perm[size_t(r)] = int32_t((5 * r + 3) % t);
    const TensorView ids_v = g.ints(ids, {t}), order = g.ints(perm, {t});
    const TensorView delta0 = g.act(randn(t * hidden), {t, hidden});
    const TensorView h = g.out_act({t, hidden}), delta = g.out_act({t, hidden}), x = g.out_act({t, hidden}),
                     xg = g.out_act({t, hidden}), q = g.out_act({t, heads, dim}), k = g.out_act({t, kv_heads, dim}),
                     v = g.out_act({t, kv_heads, dim}), attn = g.out_act({t, heads, dim}), gate = g.out_act({t, inter}),
                     up = g.out_act({t, inter}), logits = g.out({t, vocab}, DType::F32);
    const auto rows2d = [](TensorView a) {
      a.shape = Shape{a.dim(0), a.numel() / a.dim(0)};
      return a;
    };
    std::vector<SamplingRow> recs(static_cast<size_t>(t));
    for (int64_t r = 0; r < t; ++r) {
      recs[size_t(r)].temperature = r % 2 ? 0.8f : 0.0f;
      recs[size_t(r)].n_top_logprobs = 5;
      recs[size_t(r)].seed = uint64_t(7 + r);
      recs[size_t(r)].position = 100 + r;
    }
    g.keep.push_back(g.b->alloc(DType::U8, {t * int64_t(sizeof(SamplingRow))}));
    const TensorView rec_v = g.keep.back()->view();
    g.keep.push_back(g.b->alloc_host(rec_v.nbytes()));  // pinned: the chain uploads the rows
    void* recs_pinned = g.keep.back()->view().data;
    std::memcpy(recs_pinned, recs.data(), size_t(rec_v.nbytes()));
    g.keep.push_back(g.b->alloc(DType::U8, {t * int64_t(sizeof(SampledToken))}));
    const TensorView sampled = g.keep.back()->view();
    const TensorView none = g.ints({}, {0});

    const auto chain = [&](const Context& c) {
      arena.reset();
      g.b->embedding(c, table, ids_v, h);
      g.b->fill_zero(delta);  // a memset, then a PDL kernel rewriting what it set
      g.b->copy_columns(c, delta0, 0, delta, 0, hidden);
      for (int l = 0; l < n_layers; ++l) {
        g.b->add_rms_norm(c, h, delta, norm_attn, 1e-6f, x);
        const LinearPart qkv[] = {{&wq, rows2d(q)}, {&wk, rows2d(k)}, {&wv, rows2d(v)}};
        g.b->linears(c, x, qkv);
        g.b->qk_norm_rope_kv_write(c, q, k, v, q_norm, k_norm, 1e-6f, rope, batch, cache);
        g.b->attention(c, q, cache, batch, 0.125f, attn);
        g.b->linear(c, rows2d(attn), wo, delta);
        g.b->add_rms_norm(c, h, delta, norm_mlp, 1e-6f, x);
        const LinearPart gate_up[] = {{&w_gate, gate}, {&w_up, up}};
        g.b->linears(c, x, gate_up);
        g.b->silu_mul(c, gate, up, gate);
        g.b->linear(c, gate, w_down, delta);
        g.b->add(c, h, delta, h);
      }
      g.b->rms_norm(c, h, norm_final, 1e-6f, x);
      g.b->gather_rows(c, x, order, xg);
      g.b->linear(c, xg, lm_head, logits);
      g.b->copy_from_host_async(c, rec_v, recs_pinned);  // a copy, then a PDL kernel reading it
      g.b->sample(c, logits, rec_v, none, none, sampled);
    };
    // The chain's outputs as bytes: bit for bit, NaN-poisoned cache slots included.
    const auto bytes = [&](TensorView out) {
      std::vector<uint8_t> b(static_cast<size_t>(out.nbytes()));
      g.b->copy_to_host(b.data(), out);
      return b;
    };
    const TensorView outputs[] = {h, logits, cache.k, cache.v, sampled};
    const char* names[] = {"the hidden state", "the logits", "the K cache", "the V cache", "the sampled tokens"};
    std::vector<std::vector<uint8_t>> want;
    const auto expect_plain_bits = [&](const std::string& when) {
      for (size_t i = 0; i < std::size(outputs); ++i)
        EXPECT_TRUE(bytes(outputs[i]) == want[i]) << when << ": " << names[i];
    };
    Context plain = g.ctx, pdl = g.ctx;
    plain.arena = pdl.arena = &arena;
    plain.pdl = false;
    pdl.pdl = true;
    chain(plain);  // the measuring pass: the arena grows to the chain's scratch, then stays
    arena.freeze();
    chain(plain);
    for (const TensorView& o : outputs) want.push_back(bytes(o));
    for (int i = 0; i < 3; ++i) {
      chain(pdl);
      expect_plain_bits("eager run " + std::to_string(i) + " with PDL");
    }
    const std::unique_ptr<Graph> graph_plain = g.b->capture(plain, [&] { chain(plain); });
    const std::unique_ptr<Graph> graph_pdl = g.b->capture(pdl, [&] { chain(pdl); });
    ASSERT_TRUE(graph_plain && graph_pdl);
    EXPECT_EQ(graph_pdl->n_nodes(), graph_plain->n_nodes());
    graph_plain->replay(plain);
    expect_plain_bits("graph replay without PDL");
    for (int i = 0; i < 5; ++i) {
      graph_pdl->replay(pdl);
      expect_plain_bits("graph replay " + std::to_string(i) + " with PDL");
    }
  }
}

}  // namespace
}  // namespace tetra::ops

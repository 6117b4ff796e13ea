// `tetra bench linear` (see linear_bench.h). Protocol (docs/PERF.md): random weights and
// inputs, CUDA-graph replays timed with events after warm-up, median/min/max of `iters` runs,
// the weights rotated over enough copies that L2 cannot serve them. Reports; never judges.
#include "bench/linear_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/graph_timing.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/gemm_dense.h"
#include "ops/cuda/gemm_skinny.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/linear_path.h"

namespace tetra::bench {
namespace {

// The H200's measured device-copy ceiling (docs/GPU.md), as the other benchmarks use it.
constexpr double kBytesPerSecond = 4.24e12;

// One launch of the step: the parts share x (q/k/v is one launch of three).
struct LinearSpec {
  const char* name;
  std::vector<int64_t> n_out;
  int64_t n_in;
  DType out;
};
struct ShapeSpec {
  const char* name;
  std::vector<LinearSpec> linears;
};

// The published configs' dense decode linears (tests/fixtures/*-config).
const ShapeSpec kShapes[] = {
    {"qwen3-30b",
     {{"qkv", {4096, 512, 512}, 2048, DType::BF16},
      {"o_proj", {2048}, 4096, DType::BF16},
      {"router", {128}, 2048, DType::F32},
      {"lm_head", {151936}, 2048, DType::F32}}},
    {"glm5",
     {{"q_a+kv_a", {2048, 576}, 6144, DType::BF16},
      {"q_b", {16384}, 2048, DType::BF16},
      {"o_proj", {6144}, 16384, DType::BF16},
      {"router", {256}, 6144, DType::F32},
      {"lm_head", {154880}, 6144, DType::F32}}},
    {"deepseek-v3",
     {{"q_a+kv_a", {1536, 576}, 7168, DType::BF16},
      {"q_b", {24576}, 1536, DType::BF16},
      {"o_proj", {7168}, 16384, DType::BF16},
      {"router", {256}, 7168, DType::F32},
      {"lm_head", {129280}, 7168, DType::F32}}},
};

const ShapeSpec& find_shape(const std::string& name) {
  for (const ShapeSpec& s : kShapes)
    if (name == s.name) return s;
  fail("unknown linear shape '", name, "' (known: qwen3-30b, glm5, deepseek-v3)");
}

using ops::cuda::DenseLinearPath;
const char* path_name(DenseLinearPath p) {
  return p == DenseLinearPath::Gemv ? "gemv" : p == DenseLinearPath::Skinny ? "wgmma-skinny" : "cublaslt";
}

// One copy of a launch's weights.
struct Copy {
  std::vector<std::unique_ptr<DeviceMem>> w;
  std::vector<ops::LinearWeight> views;
};

TensorView device_view(void* p, DType dt, Shape shape) { return TensorView{p, dt, std::move(shape), Device::Cuda}; }

// Enqueues the launch through `path` (Library: cuBLASLt); false when that path does not take
// it (nothing runs).
bool enqueue(DenseLinearPath path, const ops::cuda::KernelLaunch& launch, ops::cuda::DenseGemm& gemm, TensorView x,
             const std::vector<ops::LinearPart>& parts) {
  switch (path) {
    case DenseLinearPath::Gemv: return ops::cuda::gemv_bf16(launch, x, parts);
    case DenseLinearPath::Skinny: return ops::cuda::gemm_skinny_bf16(launch, x, parts);
    case DenseLinearPath::Library:
      for (const ops::LinearPart& p : parts)
        if (!gemm.linear(launch.stream, x, *p.weight, p.out)) return false;
      return true;
  }
  return false;
}

std::vector<float> read_floats(TensorView t) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    TETRA_CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size() * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<uint16_t> h(out.size());
    TETRA_CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
  }
  return out;
}

struct Row {
  std::string shape, linear, path;
  bool picked = false;  // the path the engine takes (ops/cuda/linear_path.h)
  int tokens = 0, copies = 0;
  Stats st;  // per launch
  double bytes = 0, cublaslt_us = 0, max_rel = 0;
};

void print_row(const Row& r) {
  const double s = r.st.median_us * 1e-6;
  char speedup[16] = "-";
  if (r.cublaslt_us > 0) std::snprintf(speedup, sizeof speedup, "%.2fx", r.cublaslt_us / r.st.median_us);
  std::printf("%-11s %-9s %4d %-13s%s %9.2f %9.2f %9.2f %8.0f %6.1f%% %8s %10.2e %4d\n", r.shape.c_str(),
              r.linear.c_str(), r.tokens, r.path.c_str(), r.picked ? "*" : " ", r.st.median_us, r.st.min_us, r.st.max_us,
              r.bytes / s * 1e-9, 100.0 * r.bytes / kBytesPerSecond / s, speedup, r.max_rel, r.copies);
}

void bench_shape(const ShapeSpec& spec, const LinearBenchOptions& opt, const ops::DeviceProps& props,
                 cudaStream_t stream, ops::cuda::DenseGemm& gemm, nlohmann::json& rows) {
  const ops::cuda::KernelLaunch launch{stream, props.cc_major >= 9};  // as the engine launches them
  const int t_max = *std::max_element(opt.tokens.begin(), opt.tokens.end());
  for (const LinearSpec& lin : spec.linears) {
    int64_t rows_total = 0;
    for (int64_t n : lin.n_out) rows_total += n;
    const int64_t w_bytes = rows_total * lin.n_in * 2;
    const int copies = int(std::clamp<int64_t>(ops::cuda::ceil_div(3 * props.l2_bytes, w_bytes), 1, 64));
    std::vector<Copy> weights(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c)
      for (size_t i = 0; i < lin.n_out.size(); ++i) {
        auto& m = weights[size_t(c)].w.emplace_back(std::make_unique<DeviceMem>(size_t(lin.n_out[i] * lin.n_in * 2)));
        const TensorView wv = device_view(m->p, DType::BF16, {lin.n_out[i], lin.n_in});
        ops::cuda::fill_random(launch, wv, {}, uint64_t(1000 * c + i + 1));
        ops::LinearWeight lw;
        lw.weight = wv;
        lw.format = ops::WeightFormat::Dense;
        lw.n_out = lin.n_out[i];
        lw.n_in = lin.n_in;
        weights[size_t(c)].views.push_back(lw);
      }
    DeviceMem x_mem(size_t(t_max * lin.n_in * 2));
    ops::cuda::fill_random(launch, device_view(x_mem.p, DType::BF16, {t_max * lin.n_in}), {.scale = 1.0f}, 7);
    std::vector<std::unique_ptr<DeviceMem>> outs;
    for (int64_t n : lin.n_out) outs.push_back(std::make_unique<DeviceMem>(size_t(t_max * n * 4)));
    TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));

    for (const int T : opt.tokens) {
      const TensorView x = device_view(x_mem.p, DType::BF16, {T, lin.n_in});
      const auto parts_of = [&](int c) {
        std::vector<ops::LinearPart> parts;
        for (size_t i = 0; i < lin.n_out.size(); ++i)
          parts.push_back({&weights[size_t(c)].views[i], device_view(outs[i]->p, lin.out, {T, lin.n_out[i]})});
        return parts;
      };
      double bytes = double(w_bytes) + double(T) * lin.n_in * 2;
      for (int64_t n : lin.n_out) bytes += double(T) * n * (lin.out == DType::F32 ? 4 : 2);
      const DenseLinearPath engine = ops::cuda::dense_linear_path(T, parts_of(0));
      std::vector<float> reference;  // cuBLASLt's outputs of copy 0, every part in turn
      double reference_scale = 0, cublaslt_us = 0;
      for (const DenseLinearPath path : {DenseLinearPath::Library, DenseLinearPath::Gemv, DenseLinearPath::Skinny}) {
        if (!enqueue(path, launch, gemm, x, parts_of(0))) continue;  // also warms cuBLASLt's plan
        TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<float> got;
        for (size_t i = 0; i < lin.n_out.size(); ++i) {
          const std::vector<float> part = read_floats(device_view(outs[i]->p, lin.out, {T, lin.n_out[i]}));
          got.insert(got.end(), part.begin(), part.end());
        }
        double max_rel = 0;
        if (path == DenseLinearPath::Library) {
          reference = got;
          for (float v : reference) reference_scale = std::max(reference_scale, double(std::fabs(v)));
        } else {
          for (size_t i = 0; i < got.size(); ++i)
            max_rel = std::max(max_rel, std::fabs(double(got[i]) - reference[i]) / std::max(reference_scale, 1e-30));
        }
        std::vector<std::unique_ptr<Graph>> graphs;
        graphs.push_back(capture(stream, [&] {
          for (int c = 0; c < copies; ++c) enqueue(path, launch, gemm, x, parts_of(c));
        }));
        Stats st = time_graphs(stream, graphs, opt.iters);
        st.median_us /= copies, st.min_us /= copies, st.max_us /= copies;
        if (path == DenseLinearPath::Library) cublaslt_us = st.median_us;
        Row r{spec.name, lin.name, path_name(path), path == engine, T, copies, st, bytes,
              path == DenseLinearPath::Library ? 0.0 : cublaslt_us, max_rel};
        if (opt.json)
          rows.push_back({{"shape", r.shape}, {"linear", r.linear}, {"tokens", T}, {"path", r.path},
                          {"median_us", st.median_us}, {"min_us", st.min_us}, {"max_us", st.max_us},
                          {"bytes", bytes}, {"gbps", bytes / (st.median_us * 1e-6) * 1e-9},
                          {"copies", copies}, {"max_rel_diff_vs_cublaslt", max_rel},
                          {"engine_path", r.picked}});
        else
          print_row(r);
      }
    }
  }
}

}  // namespace

int run_linear_bench(const LinearBenchOptions& opt) {
  for (const std::string& s : opt.shapes) find_shape(s);
  TETRA_CHECK(!opt.tokens.empty(), "no token counts to measure");
  for (int t : opt.tokens) TETRA_CHECK(t >= 1 && t <= 4096, "token counts must be in 1..4096");
  // After the flags, so that a bad one is named even on a machine without a GPU.
  if (!ops::cuda::cuda_device_present()) {
    std::fprintf(stderr, "tetra bench linear: no CUDA device is visible\n");
    return 1;
  }
  const ops::DeviceProps props = ops::cuda::device_props(0);
  const BenchStream stream;
  nlohmann::json rows = nlohmann::json::array();
  if (!opt.json) {
    std::printf("tetra bench linear on %s (%d SMs): one launch of a step's linear (parts share x), CUDA graph "
                "replays over weight copies, median of %d; %%ceil against %.2f TB/s; maxrel: max |out - "
                "cuBLASLt's| / max |cuBLASLt's|; * the path the engine takes\n",
                props.name.c_str(), props.sm_count, opt.iters, kBytesPerSecond / 1e12);
    std::printf("%-11s %-9s %4s %-14s %9s %9s %9s %8s %7s %8s %10s %4s\n", "shape", "linear", "T", "path", "us(med)",
                "us(min)", "us(max)", "GB/s", "%ceil", "speedup", "maxrel", "cps");
  }
  ops::cuda::DenseGemm gemm;
  for (const std::string& s : opt.shapes) bench_shape(find_shape(s), opt, props, stream.s, gemm, rows);
  if (opt.json)
    std::printf("%s\n", nlohmann::json{{"bench", "linear"}, {"device", props.name}, {"rows", rows}}.dump(1).c_str());
  return 0;
}

}  // namespace tetra::bench

// `tetra bench moe` (see moe_bench.h). Protocol (docs GPU.md): random weights and inputs,
// CUDA-graph replays timed with events after warm-up, median/min/max of `iters` runs, expert
// weights rotated over enough layer copies that L2 cannot serve them, the baselines (BF16
// through cuBLAS; FP8 through cuBLASLt, its activation casts timed) in the same run. Reports;
// never judges.
#include "bench/moe_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "bench/event_timing.h"
#include "bench/graph_timing.h"
#include "bench/moe_baseline.h"
#include "bench/moe_baseline_fp8.h"
#include "bench/read_probe.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/moe_tune.h"
#include "ops/cuda/moe_internal.h"

namespace tetra::bench {
namespace {

using ops::cuda::MoeShape;

// Ceilings measured on the H200 (docs/GPU.md, 2026-11-29): device copy and bf16 dense GEMM.
constexpr double kBytesPerSecond = 4.24e12;
constexpr double kBf16FlopsPerSecond = 758e12;

struct ShapeSpec {
  const char* name;
  MoeShape shape;
  int top_k;
  ops::Scoring scoring;
  int n_group, topk_group;
  bool norm;
  float scaling;
};

const ShapeSpec kShapes[] = {
    {"glm5", {6144, 2048, 256, true}, 8, ops::Scoring::Sigmoid, 1, 1, true, 2.5f},
    {"deepseek-v3", {7168, 2048, 256, true}, 8, ops::Scoring::Sigmoid, 8, 4, true, 2.5f},
    {"qwen3-30b", {2048, 768, 128, false}, 8, ops::Scoring::Softmax, 1, 1, true, 1.0f},
};

// Router logits: standard normal, plus for "skewed" a popularity term -ln(1 + rank) over a
// random ranking of the experts (a few experts take most tokens, as real routers do).
std::vector<float> draw_logits(int T, int E, bool skewed, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> bias(static_cast<size_t>(E), 0.0f);
  if (skewed) {
    std::vector<int> rank(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) rank[size_t(e)] = e;
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int e = 0; e < E; ++e) bias[size_t(e)] = -1.5f * std::log1p(float(rank[size_t(e)]));
  }
  std::vector<float> l(size_t(T) * E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) l[size_t(t) * E + e] = nd(rng) + bias[size_t(e)];
  return l;
}

const ShapeSpec& find_shape(const std::string& name) {
  for (const ShapeSpec& s : kShapes)
    if (name == s.name) return s;
  fail("unknown MoE shape '", name, "' (known: glm5, deepseek-v3, qwen3-30b)");
}

struct Row {
  std::string shape, routing, config, why;
  int tokens = 0, distinct = 0;
  Stats nvfp4, bf16, fp8;  // a baseline not run (or not possible here) stays 0
  std::string fp8_na;      // why the FP8 baseline is missing from a row where it was asked for
  std::vector<std::pair<std::string, Stats>> sweep;  // (configuration, time)
  std::map<std::string, double> stage_us, stage_gbps;  // --breakdown
  double bytes = 0, flops = 0, floor_us = 0;
};

void print_header() {
  std::printf("%-11s %-7s %6s %5s %10s %10s %10s %8s %7s %7s %11s %11s %7s  %s\n", "shape", "routing",
              "T", "U", "us(med)", "us(min)", "us(max)", "GB/s", "%floor", "TFLOP/s", "bf16cuBLAS",
              "fp8cuBLASLt", "speedup", "config");
}

void print_row(const Row& r) {
  const double s = r.nvfp4.median_us * 1e-6;
  char fp8[32] = "n/a";
  if (r.fp8.median_us > 0) std::snprintf(fp8, sizeof fp8, "%.1f", r.fp8.median_us);
  std::printf("%-11s %-7s %6d %5d %10.1f %10.1f %10.1f %8.0f %6.1f%% %7.1f %11.1f %11s %6.2fx  %s\n",
              r.shape.c_str(), r.routing.c_str(), r.tokens, r.distinct, r.nvfp4.median_us,
              r.nvfp4.min_us, r.nvfp4.max_us, r.bytes / s * 1e-9, 100.0 * r.floor_us / r.nvfp4.median_us,
              r.flops / s * 1e-12, r.bf16.median_us, fp8,
              r.bf16.median_us > 0 ? r.bf16.median_us / r.nvfp4.median_us : 0.0, r.config.c_str());
  for (const auto& [config, st] : r.sweep)
    std::printf("%-11s %-7s %6s %5s %10.1f %10.1f %10.1f %8.0f %6.1f%%  (%s)\n", "", "", "", "", st.median_us,
                st.min_us, st.max_us, r.bytes / (st.median_us * 1e-6) * 1e-9, 100.0 * r.floor_us / st.median_us,
                config.c_str());
}

nlohmann::json to_json(const Row& r) {
  auto stats = [](const Stats& s) {
    return nlohmann::json{{"median_us", s.median_us}, {"min_us", s.min_us}, {"max_us", s.max_us}};
  };
  const double s = r.nvfp4.median_us * 1e-6;
  nlohmann::json j{{"shape", r.shape}, {"routing", r.routing}, {"tokens", r.tokens},
                   {"distinct_experts", r.distinct}, {"nvfp4", stats(r.nvfp4)},
                   {"bytes", r.bytes}, {"flops", r.flops}, {"effective_gbps", r.bytes / s * 1e-9},
                   {"floor_us", r.floor_us}, {"pct_of_floor", 100.0 * r.floor_us / r.nvfp4.median_us},
                   {"tflops", r.flops / s * 1e-12}, {"config", r.config}, {"why", r.why}};
  if (r.bf16.median_us > 0) j["bf16_cublas"] = stats(r.bf16);
  if (r.fp8.median_us > 0) j["fp8_cublaslt"] = stats(r.fp8);
  if (!r.fp8_na.empty()) j["fp8_cublaslt_na"] = r.fp8_na;
  for (const auto& [config, st] : r.sweep) j["sweep"][config] = stats(st);
  for (const auto& [stage, us] : r.stage_us) j["stages_us"][stage] = us;
  return j;
}

// fp8: null without the baselines.
void bench_shape(const ShapeSpec& spec, const MoeBenchOptions& opt, const ops::Context& base_ctx,
                 cublasHandle_t cublas, Fp8Baseline* fp8, cudaStream_t stream, nlohmann::json& json_rows) {
  const MoeShape& ms = spec.shape;
  const int H = int(ms.hidden), E = ms.n_experts, k = spec.top_k;
  const int kk = k + (ms.shared_expert ? 1 : 0);
  const int t_max = *std::max_element(opt.tokens.begin(), opt.tokens.end());

  // Layer copies: enough that one token's experts, rotated, exceed 3x the L2.
  const int64_t l2 = base_ctx.props->l2_bytes;
  auto probe = ops::cuda::random_experts(base_ctx, MoeShape{ms.hidden, ms.intermediate, 1, false},
                                         ops::WeightFormat::Nvfp4, 1);
  const int64_t expert_bytes = ops::cuda::experts_bytes_per_expert(*probe);
  probe.reset();
  int n_layers = int(std::clamp<int64_t>((3 * l2) / (kk * expert_bytes) + 1, 2, 16));
  // NVFP4 takes 4.5 bits a weight; the baselines' copies 16 (BF16) and 8 (FP8).
  const double layer_bytes =
      (E + (ms.shared_expert ? 1 : 0)) * expert_bytes * (opt.baseline ? 1 + (16 + 8) / 4.5 : 1.0);
  size_t free_b = 0, total_b = 0;
  TETRA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  n_layers = int(std::max<int64_t>(1, std::min<int64_t>(n_layers, int64_t(free_b * 0.6 / layer_bytes))));

  ops::cuda::MoeTuner tuner(opt.tune_cache);
  std::vector<std::unique_ptr<ops::MoeExperts>> fp4, bf16;
  std::vector<std::unique_ptr<Fp8Experts>> fp8_layers;
  for (int l = 0; l < n_layers; ++l) {
    fp4.push_back(ops::cuda::random_experts(base_ctx, ms, ops::WeightFormat::Nvfp4, 100 + 10 * l, &tuner));
    if (opt.baseline)
      bf16.push_back(ops::cuda::random_experts(base_ctx, ms, ops::WeightFormat::Dense, 500 + 10 * l));
    if (fp8) fp8_layers.push_back(std::make_unique<Fp8Experts>(stream, ms, 900 + 10 * l));
  }
  if (!opt.json)
    std::printf("\n%s: H %d, I %lld, %d experts, top-%d%s; NVFP4 %.1f MB/expert; weights rotated "
                "over %d layer copies (%.1f GB NVFP4), L2 %.0f MB\n",
                spec.name, H, (long long)ms.intermediate, E, k, ms.shared_expert ? " + shared" : "",
                expert_bytes / 1e6, n_layers, n_layers * (E + 1) * expert_bytes / 1e9, l2 / 1e6);

  DeviceMem x(size_t(t_max) * H * 2), logits(size_t(t_max) * E * 4), bias(size_t(E) * 4),
      ids(size_t(t_max) * k * 4), weights(size_t(t_max) * k * 4), out(size_t(t_max) * H * 2);
  ops::cuda::fill_random({.stream = stream}, TensorView{x.p, DType::BF16, {int64_t(t_max) * H}, Device::Cuda},
                         {.scale = 1.0f}, 7);
  std::vector<float> skew_bias(static_cast<size_t>(E));
  {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (auto& v : skew_bias) v = nd(rng);
  }
  const int64_t ws_bytes = ops::cuda::moe_workspace_bytes(*fp4[0], t_max, k);
  DeviceMem ws{static_cast<size_t>(ws_bytes)};
  ops::Context ctx = base_ctx;
  ctx.workspace = ops::Workspace{ws.p, ws_bytes};

  const int64_t rows_max = int64_t(t_max) * kk;
  std::unique_ptr<DeviceMem> b_rows, b_pos, b_xp, b_g13, b_h, b_y, b_xp8, b_h8;
  if (opt.baseline) {
    b_rows = std::make_unique<DeviceMem>(size_t(rows_max) * 4);
    b_pos = std::make_unique<DeviceMem>(size_t(rows_max) * 4);
    b_xp = std::make_unique<DeviceMem>(size_t(rows_max) * H * 2);
    b_g13 = std::make_unique<DeviceMem>(size_t(rows_max) * 2 * ms.intermediate * 2);
    b_h = std::make_unique<DeviceMem>(size_t(rows_max) * ms.intermediate * 2);
    b_y = std::make_unique<DeviceMem>(size_t(rows_max) * H * 4);
    b_xp8 = std::make_unique<DeviceMem>(size_t(rows_max) * H);  // E4M3; the rest is shared with BF16
    b_h8 = std::make_unique<DeviceMem>(size_t(rows_max) * ms.intermediate);
  }

  ops::RoutingSpec rs;
  rs.scoring = spec.scoring;
  rs.top_k = k;
  rs.norm_topk_prob = spec.norm;
  rs.routed_scaling_factor = spec.scaling;
  rs.n_group = spec.n_group;
  rs.topk_group = spec.topk_group;
  if (spec.scoring == ops::Scoring::Sigmoid) rs.correction_bias = {bias.p, DType::F32, {E}, Device::Cuda};

  for (const std::string& routing : opt.routings) {
    // The correction bias favours some experts for every token: the skewed routing gets a
    // random one, the uniform routing none.
    const std::vector<float> b = routing == "skewed" ? skew_bias : std::vector<float>(size_t(E), 0.0f);
    upload(stream, bias.p, b.data(), b.size() * 4);
    for (int T : opt.tokens) {
      const std::vector<float> hl = draw_logits(T, E, routing == "skewed", 11 + T);
      upload(stream, logits.p, hl.data(), hl.size() * 4);
      const TensorView v_logits{logits.p, DType::F32, {T, E}, Device::Cuda};
      const TensorView v_ids{ids.p, DType::I32, {T, k}, Device::Cuda};
      const TensorView v_w{weights.p, DType::F32, {T, k}, Device::Cuda};
      const TensorView v_x{x.p, DType::BF16, {T, H}, Device::Cuda};
      const TensorView v_out{out.p, DType::BF16, {T, H}, Device::Cuda};
      ops::cuda::route(ctx, v_logits, rs, v_ids, v_w);
      std::vector<int> hids(size_t(T) * k);
      ops::cuda::copy_and_wait(stream, hids.data(), ids.p, hids.size() * 4, cudaMemcpyDeviceToHost);

      Row r;
      r.shape = spec.name;
      r.routing = routing;
      r.tokens = T;
      r.distinct = int(std::set<int>(hids.begin(), hids.end()).size());
      r.bytes = double(r.distinct + (ms.shared_expert ? 1 : 0)) * double(expert_bytes);
      r.flops = 2.0 * T * kk * 3.0 * double(H) * double(ms.intermediate);
      r.floor_us = std::max(r.bytes / kBytesPerSecond, r.flops / kBf16FlopsPerSecond) * 1e6;

      auto time_fp4 = [&](ops::cuda::MoeConfig cfg) {
        std::vector<std::unique_ptr<Graph>> graphs;
        for (const auto& ex : fp4)
          graphs.push_back(capture(stream, [&] {
            ops::cuda::route(ctx, v_logits, rs, v_ids, v_w);
            ops::cuda::moe_experts(ctx, v_x, v_ids, v_w, *ex, v_out, cfg);
          }));
        return time_graphs(stream, graphs, opt.iters);
      };
      ops::cuda::MoeConfig cfg;
      if (opt.tile_tokens) {
        cfg.tile_tokens = opt.tile_tokens;
        cfg.fused = opt.fused;
        cfg.why = opt.fused ? "forced by --fused" : "forced by --tile";
      } else {
        // Outside capture: the tuner times its candidates unless the cache has this bucket.
        cfg = ops::cuda::pick_moe_config(ctx, *fp4[0], T, k);
        if (!cfg.tuned) cfg = ops::cuda::tune_moe(ctx, v_x, v_ids, v_w, *fp4[0], v_out);
      }
      r.config = cfg.str();
      r.why = cfg.why;
      r.nvfp4 = time_fp4(cfg);
      if (opt.breakdown && cfg.fused) {
        // One kernel: the route and the rest.
        r.stage_us["route"] = [&] {
          std::vector<std::unique_ptr<Graph>> g;
          g.push_back(capture(stream, [&] { ops::cuda::route(ctx, v_logits, rs, v_ids, v_w); }));
          return time_graphs(stream, g, opt.iters).median_us;
        }();
        r.stage_us["fused"] = r.nvfp4.median_us - r.stage_us["route"];
      } else if (opt.breakdown) {
        const ops::cuda::KernelLaunch ctx_launch = ops::cuda::kernel_launch(ctx);
        // Each stage alone, replayed from the state a full run left in the scratch (same
        // inputs, same work items), weights rotated as above: where the layer's time goes.
        ops::cuda::moe_experts(ctx, v_x, v_ids, v_w, *fp4[0], v_out, cfg);
        const auto& ex0 = dynamic_cast<const ops::cuda::CudaMoeExperts&>(*fp4[0]);
        const ops::cuda::MoeScratch sc = ops::cuda::moe_scratch_carve(ex0, ws.p, T, k, cfg.tile_tokens);
        auto one = [&](auto&& enqueue) {
          std::vector<std::unique_ptr<Graph>> g;
          g.push_back(capture(stream, enqueue));
          return time_graphs(stream, g, opt.iters).median_us;
        };
        auto per_layer = [&](auto&& enqueue) {
          std::vector<std::unique_ptr<Graph>> g;
          for (const auto& ex : fp4)
            g.push_back(capture(stream, [&] { enqueue(dynamic_cast<const ops::cuda::CudaMoeExperts&>(*ex)); }));
          return time_graphs(stream, g, opt.iters).median_us;
        };
        r.stage_us["route"] = one([&] { ops::cuda::route(ctx, v_logits, rs, v_ids, v_w); });
        r.stage_us["permute"] = one([&] {
          ops::cuda::launch_permute(ctx_launch, ids.as<int>(), T, k, 0, E, ms.shared_expert, cfg.tile_tokens,
                                    cfg.hot_tokens, sc);
        });
        r.stage_us["gate_up"] = per_layer([&](const ops::cuda::CudaMoeExperts& ex) {
          ops::cuda::launch_gate_up(ctx_launch, ex, x.as<uint16_t>(), sc, cfg.tile_tokens);
          if (cfg.hot_tokens) ops::cuda::launch_gate_up(ctx_launch, ex, x.as<uint16_t>(), sc.hot(), cfg.hot_tokens);
        });
        r.stage_us["down"] = per_layer([&](const ops::cuda::CudaMoeExperts& ex) {
          ops::cuda::launch_down(ctx_launch, ex, sc, cfg.tile_tokens);
          if (cfg.hot_tokens) ops::cuda::launch_down(ctx_launch, ex, sc.hot(), cfg.hot_tokens);
        });
        r.stage_us["combine"] = one([&] {
          ops::cuda::launch_combine(ctx_launch, sc.y, sc.pos, weights.as<float>(), T, k, ms.shared_expert, H,
                                    out.as<uint16_t>());
        });
        const double n_ex = r.distinct + (ms.shared_expert ? 1 : 0);
        r.stage_gbps["gate_up"] = n_ex * (ex0.w13_expert_bytes() + ex0.w13_scale_expert_bytes()) /
                                  (r.stage_us["gate_up"] * 1e-6) * 1e-9;
        r.stage_gbps["down"] = n_ex * (ex0.w2_expert_bytes() + ex0.w2_scale_expert_bytes()) /
                               (r.stage_us["down"] * 1e-6) * 1e-9;
      }
      if (opt.sweep_tiles) {
        std::vector<ops::cuda::MoeConfig> configs;
        for (int tile : ops::cuda::moe_tile_choices(ops::WeightFormat::Nvfp4))
          configs.push_back(ops::cuda::MoeConfig{tile, false, "sweep"});
        for (int hot : {16, 32, 64})  // tiles of 8, and a wider one for the experts with more rows
          configs.push_back(ops::cuda::MoeConfig{.tile_tokens = 8, .why = "sweep", .hot_tokens = hot});
        if (ops::cuda::moe_decode_takes(dynamic_cast<const ops::cuda::CudaMoeExperts&>(*fp4[0]), T, k)) configs.push_back(ops::cuda::MoeConfig{8, false, "sweep", true});
        for (const auto& c : configs) r.sweep.push_back({c.str(), time_fp4(c)});
      }

      const HostGrouping grouping =
          opt.baseline ? group_by_expert(hids, T, k, E, ms.shared_expert) : HostGrouping{};
      if (opt.baseline) {
        upload(stream, b_rows->p, grouping.row_token.data(), grouping.row_token.size() * 4);
        upload(stream, b_pos->p, grouping.pos.data(), grouping.pos.size() * 4);
        const Bf16LayerBuffers buf{b_rows->as<int>(), b_pos->as<int>(), b_xp->as<uint16_t>(),
                                   b_g13->as<uint16_t>(), b_h->as<uint16_t>(), b_y->as<float>()};
        std::vector<std::unique_ptr<Graph>> graphs;
        for (const auto& ex : bf16)
          graphs.push_back(capture(stream, [&] {
            ops::cuda::route(ctx, v_logits, rs, v_ids, v_w);
            bf16_layer_enqueue(cublas, stream, dynamic_cast<const ops::cuda::CudaMoeExperts&>(*ex),
                               x.as<uint16_t>(), T, k, weights.as<float>(), grouping, buf,
                               out.as<uint16_t>());
          }));
        r.bf16 = time_graphs(stream, graphs, opt.iters);
      }
      if (fp8) {
        // The same rows through cuBLASLt FP8, weights rotated over the same number of copies.
        // Plans are made here, outside capture; a shape cuBLASLt refuses leaves the column n/a.
        r.fp8_na = fp8->plan(ms, grouping);
        if (r.fp8_na.empty()) {
          const Fp8LayerBuffers buf{b_rows->as<int>(), b_pos->as<int>(), b_xp8->as<uint8_t>(),
                                    b_g13->as<uint16_t>(), b_h8->as<uint8_t>(), b_y->as<float>()};
          try {
            // One eager run first: cuBLASLt loads its kernels outside capture, and a call that
            // fails does so here.
            if (const std::string why = fp8->enqueue(stream, *fp8_layers[0], x.as<uint16_t>(), T, k,
                                                     weights.as<float>(), grouping, buf, out.as<uint16_t>());
                !why.empty())
              fail(why);
            TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
            std::vector<std::unique_ptr<Graph>> graphs;
            for (const auto& ex : fp8_layers)
              graphs.push_back(capture(stream, [&] {
                ops::cuda::route(ctx, v_logits, rs, v_ids, v_w);
                const std::string why = fp8->enqueue(stream, *ex, x.as<uint16_t>(), T, k, weights.as<float>(),
                                                     grouping, buf, out.as<uint16_t>());
                if (!why.empty()) fail(why);  // capture() ends the capture and passes this on
              }));
            r.fp8 = time_graphs(stream, graphs, opt.iters);
          } catch (const Error& e) {
            r.fp8_na = e.what();
          }
        }
        if (!r.fp8_na.empty())
          std::fprintf(stderr, "tetra bench moe: no FP8 baseline for %s %s T=%d: %s\n", spec.name,
                       routing.c_str(), T, r.fp8_na.c_str());
      }
      if (opt.json) {
        json_rows.push_back(to_json(r));
      } else {
        print_row(r);
        if (opt.verbose) std::printf("%-11s   config: %s (%s)\n", "", r.config.c_str(), r.why.c_str());
        if (r.stage_us.count("fused"))
          std::printf("%-11s   stages: route %.1f us, fused layer %.1f us (%.0f GB/s of weights)\n", "",
                      r.stage_us["route"], r.stage_us["fused"], r.bytes / (r.stage_us["fused"] * 1e-6) * 1e-9);
        else if (!r.stage_us.empty())
          std::printf("%-11s   stages: route %.1f us, permute %.1f us, gate_up %.1f us (%.0f GB/s), "
                      "down %.1f us (%.0f GB/s), combine %.1f us\n",
                      "", r.stage_us["route"], r.stage_us["permute"], r.stage_us["gate_up"],
                      r.stage_gbps["gate_up"], r.stage_us["down"], r.stage_gbps["down"], r.stage_us["combine"]);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int run_moe_bench(const MoeBenchOptions& opt) {
  for (const std::string& s : opt.shapes) find_shape(s);
  TETRA_CHECK(!opt.tokens.empty(), "no token counts to measure");
  for (int t : opt.tokens) TETRA_CHECK(t >= 1 && t <= 65536, "token counts must be in 1..65536");
  for (const std::string& r : opt.routings)
    TETRA_CHECK(r == "uniform" || r == "skewed", "routing must be uniform or skewed, not '", r, "'");

  // After the flags, so that a bad one is named even on a machine without a GPU.
  if (!ops::cuda::cuda_device_present()) {
    std::fprintf(stderr, "tetra bench moe: no CUDA device is visible\n");
    return 1;
  }
  const ops::DeviceProps props = ops::cuda::device_props(0);
  const BenchStream bench_stream;
  const cudaStream_t stream = bench_stream.s;
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS could not be initialized");
  cublasSetStream(cublas, stream);
  DeviceMem cublas_ws(64 << 20);  // a fixed workspace keeps cuBLAS from allocating mid-capture
  cublasSetWorkspace(cublas, cublas_ws.p, 64 << 20);

  ops::Context ctx;
  ctx.stream = stream;
  ctx.props = &props;
  ctx.pdl = props.cc_major >= 9;  // the layer's kernels launch as the engine launches them
  nlohmann::json rows = nlohmann::json::array();
  if (!opt.json) {
    std::printf("tetra bench moe on %s (%d SMs): whole layer from router logits, CUDA graph replays, "
                "median of %d; floor = max(expert bytes / %.2f TB/s, FLOPs / %.0f TFLOP/s)\n",
                props.name.c_str(), props.sm_count, opt.iters, kBytesPerSecond / 1e12,
                kBf16FlopsPerSecond / 1e12);
  }
  // The ceiling this run's floors can be held against: a plain stream of 2 GiB (34x the L2).
  const ReadCeiling ceiling = measure_read_ceiling(stream, props.sm_count, int64_t(2) << 30, 20);
  if (!opt.json) {
    std::printf("read ceiling (this run): %.2f TB/s median of 20 reads of %.1f GB (min %.2f, max %.2f); "
                "%%floor uses %.2f TB/s\n",
                ceiling.median_tbps, ceiling.bytes / 1e9, ceiling.min_tbps, ceiling.max_tbps, kBytesPerSecond / 1e12);
    print_header();
  }
  int rc = 0;
  try {
    // One cuBLASLt handle, workspace and plan cache for the whole run, as for cuBLAS above.
    std::unique_ptr<Fp8Baseline> fp8;
    if (opt.baseline) fp8 = std::make_unique<Fp8Baseline>(stream);
    for (const std::string& s : opt.shapes) bench_shape(find_shape(s), opt, ctx, cublas, fp8.get(), stream, rows);
  } catch (...) {
    cublasDestroy(cublas);
    throw;
  }
  cublasDestroy(cublas);
  if (opt.json)
    std::printf("%s\n", nlohmann::json{{"bench", "moe"},
                                       {"device", props.name},
                                       {"read_ceiling_tbps", {{"median", ceiling.median_tbps},
                                                              {"min", ceiling.min_tbps},
                                                              {"max", ceiling.max_tbps},
                                                              {"bytes", ceiling.bytes}}},
                                       {"rows", rows}}
                             .dump(1)
                             .c_str());
  return rc;
}

}  // namespace tetra::bench

// tetra bench decode: the serving engine in-process (no HTTP) on synthetic sequences. Per
// batch size: the decode step's time (as served: CUDA graphs where the backend has them), its
// byte floor (the weights the step touches and the KV it reads, over the bandwidth), and where
// the time goes, op class by op class, from an eager profiling pass. With --tp/--ep the model
// runs split over ranks as `tetra serve` runs it; the floor and the breakdown are rank 0's.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "device_options.h"
#include "model_summary.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/op_profile.h"
#include "runtime/ranks.h"
#include "parallel_flags.h"

namespace tetra::cli {
namespace {

using runtime::OpClass;

struct StepTimes {
  double median = 0, min = 0, max = 0;  // seconds
  // The median of a step's wall time less the engine's wait for the device in it: host work
  // (scheduling, inputs, launches, sampling's setup, outputs) while the device has nothing to
  // run; what overlapping the next step's host work with this one's forward would save.
  double host = 0;
};

StepTimes summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

// The bytes one decode step of `batch` sequences at `context` tokens must read: every dense
// weight (the embedding table only for the batch's rows, unless it is also the lm_head), the
// distinct routed experts the batch touches under uniform routing, and the KV cache rows it
// attends. Of one rank where the model is split: what it holds.
double step_floor_bytes(const model::Model& m, int64_t batch, int64_t context, DType kv_dtype) {
  const ModelConfig& c = m.config();
  const model::LoadStats s = m.load_stats();
  const double table = double(c.vocab_size) * double(c.hidden_size) * 2;
  double dense = double(s.bytes - s.routed_expert_bytes);
  if (!c.tie_word_embeddings) dense -= table - double(batch) * double(c.hidden_size) * 2;
  // Each expert (of the experts held) is touched with the same chance, so the touched share of
  // the experts' bytes is that chance.
  double experts = 0;
  if (c.n_routed_experts > 0) {
    const double e = double(c.n_routed_experts), k = double(c.n_experts_per_tok);
    experts = double(s.routed_expert_bytes) * (1 - std::pow(1 - k / e, double(batch)));
  }
  // The cache: every row of each layer, except that with the DSA (index_topk > 0) a token
  // reads only the index_topk latents its indexer chose, beside every index key.
  double kv = 0;
  const double elem = double(dtype_bits(kv_dtype)) / 8;
  const double attended = c.index_topk > 0 ? double(std::min<int64_t>(context, c.index_topk)) : double(context);
  for (const model::KvLayerShape& l : m.kv_layout())
    kv += (double(l.n_kv_heads) * double(l.k_dim + l.v_dim) * attended + double(l.index_dim) * double(context)) * elem;
  return dense + experts + double(batch) * kv;
}

struct Row {
  int64_t batch = 0, context = 0;
  StepTimes served, eager;
  double fill_s = 0;  // the prompts' prefill, to every sequence's first token
  // The prefill of the eager profiling pass, op by op (every prompt chunk's ops, summed).
  std::map<OpClass, double> fill_by_class;
  std::vector<std::pair<std::string, runtime::OpTime>> fill_top;  // slowest first
  double fill_eager_s = 0, fill_ops_s = 0;
  double floor_s = 0;
  std::map<OpClass, double> by_class;  // seconds a step
  double ops_s = 0;                    // all ops a step
  std::vector<std::pair<std::string, runtime::OpTime>> top;  // per step, slowest first
  int64_t graph_steps = 0;
};

using OpTimes = std::map<std::string, runtime::OpTime>;

// Runs `batch` requests of `context` random prompt tokens to their first token (the seconds
// that took in *fill_s), then times `steps` decode steps one by one; with `prof`, profiles
// the prefill (into *fill_profiled) and `profile_steps` more decode steps, one map each.
StepTimes run_engine(runtime::ModelRanks& ranks, runtime::EngineConfig config, int64_t batch, int64_t context,
                     int steps, runtime::ProfilingBackend* prof, int profile_steps, int64_t* graph_steps,
                     double* fill_s, std::vector<OpTimes>* profiled = nullptr, OpTimes* fill_profiled = nullptr) {
  config.max_running_requests = int(batch);
  config.enable_prefix_caching = false;
  const int64_t new_tokens = 2 + steps + profile_steps;
  config.kv_blocks = batch * ((context + new_tokens + config.block_size - 1) / config.block_size) + 1;
  runtime::Engine engine(ranks, config);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(ranks.model().config().vocab_size) - 1);
  std::map<uint64_t, int64_t> generated;
  for (int64_t i = 0; i < batch; ++i) {
    runtime::RequestParams p;
    p.prompt.resize(size_t(context));
    for (auto& t : p.prompt) t = pick(rng);
    p.max_new_tokens = new_tokens;
    p.ignore_eos = true;
    const auto r = engine.submit(std::move(p), [&generated](const runtime::RequestOutput& o) {
      generated[o.request_id] += int64_t(o.tokens.size());
    });
    TETRA_CHECK(r.error == runtime::SubmitError::None, "bench decode: a request was refused: ", r.message);
    generated[r.request_id] = 0;
  }
  auto all_started = [&] {
    return std::all_of(generated.begin(), generated.end(), [](const auto& g) { return g.second >= 1; });
  };
  if (prof && fill_profiled) {
    prof->reset();
    prof->enable(true);
  }
  const auto fill_start = std::chrono::steady_clock::now();
  while (!all_started()) TETRA_CHECK(engine.step(), "bench decode: the engine stopped before every prompt ran");
  const double filled = std::chrono::duration<double>(std::chrono::steady_clock::now() - fill_start).count();
  if (fill_s) *fill_s = filled;
  if (prof && fill_profiled) {
    prof->enable(false);
    *fill_profiled = prof->times();
    (*fill_profiled)[""] = runtime::OpTime{.calls = 0, .seconds = filled};  // the whole prefill, eager
  }
  const int64_t graph_steps_before = engine.stats().graph_steps;
  std::vector<double> t, host;
  for (int i = 0; i < steps; ++i) {
    const double wait0 = engine.stats().device_wait_s;
    const auto t0 = std::chrono::steady_clock::now();
    engine.step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    host.push_back(t.back() - (engine.stats().device_wait_s - wait0));
  }
  if (graph_steps) *graph_steps = engine.stats().graph_steps - graph_steps_before;
  if (prof) {
    for (int i = 0; i < profile_steps; ++i) {
      prof->reset();
      prof->enable(true);
      engine.step();
      prof->enable(false);
      profiled->push_back(prof->times());
    }
  }
  StepTimes times = summarize(t);
  times.host = summarize(host).median;
  return times;
}

std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      fail(flag, ": '", item, "' is not a number");
    }
    TETRA_CHECK(out.back() >= 1, flag, " takes numbers of at least 1, not ", out.back());
  }
  TETRA_CHECK(!out.empty(), flag, " is empty");
  return out;
}

}  // namespace

int cmd_bench_decode(int argc, char** argv) {
  CLI::App app{"Decode steps of the serving engine in-process: step time, its byte floor, and where the time goes.",
               "tetra bench decode"};
  std::string model_dir, batches = "1,16,64,256", json_path, hf_overrides;
  DeviceFlags dev;
  int64_t context = 1024;
  int steps = 50, profile_steps = 5;
  double bandwidth_tbs = 4.24;
  bool verbose = false, skip_prefill = false;
  runtime::EngineConfig config;
  config.chunked_prefill_size = 4096;  // fills the batch's prompts in fewer steps than serving's 512
  app.add_option("--model", model_dir, "model folder (config.json; safetensors unless --load-format dummy)")
      ->required();
  add_device_flags(app, dev);
  add_hf_overrides_flag(app, hf_overrides);
  app.add_option("--batch", batches, "comma-separated batch sizes (sequences decoding together)")
      ->capture_default_str();
  app.add_option("--context", context, "prompt tokens of every sequence")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24))
      ->capture_default_str();
  app.add_option("--steps", steps, "decode steps timed per batch size")->check(CLI::Range(3, 100000))->capture_default_str();
  app.add_option("--profile-steps", profile_steps, "eager steps profiled op by op (0: no breakdown)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app.add_option("--bandwidth", bandwidth_tbs, "memory bandwidth of the floor, TB/s (the H200's measured 4.24)")
      ->check(CLI::Range(0.01, 100.0))
      ->capture_default_str();
  app.add_option("--chunked-prefill-size", config.chunked_prefill_size, "prompt tokens per step while filling")
      ->check(CLI::Range(int64_t(16), int64_t(1) << 24))
      ->capture_default_str();
  app.add_flag("--skip-prefill", skip_prefill,
               "leave the prompts' KV cache random instead of running them (long contexts at once; no prefill "
               "figure, and the tokens mean nothing)");
  app.add_flag("--disable-cuda-graph", config.disable_cuda_graph, "time eager decode steps, without CUDA graphs");
  parallel::Parallelism par;
  add_parallel_flags(app, par);
  app.add_option("--json", json_path, "also write the figures as JSON to FILE");
  app.add_flag("--verbose", verbose, "also list the slowest ops of each batch size");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const std::vector<int64_t> batch_sizes = parse_list(batches, "--batch");
    check_parallel_flags(par);
    config.bench_skip_prompt_forward = skip_prefill;
    // Rank 0's backend is profiled (the others run as they serve).
    const ops::BackendOptions each0 = runtime::rank_backend_options(backend_options(dev), par).front();
    auto owned_prof = std::make_unique<runtime::ProfilingBackend>(ops::make_backend(each0));
    runtime::ProfilingBackend* prof = owned_prof.get();
    std::fprintf(stderr, "tetra bench decode: backend %s\n", prof->name().c_str());
    model::LoadOptions options;
    options.dummy = dev.load_format == "dummy";
    options.hf_overrides = hf_overrides;
    auto ranks = runtime::load_ranks(model_dir, backend_options(dev), par, options, std::move(owned_prof));
    if (ranks->size() > 1)
      std::fprintf(stderr, "tetra bench decode: %d ranks (--tp %d --ep %d); the floor and the breakdown are rank 0's\n",
                   ranks->size(), par.tp, par.ep);
    const model::Model* model = &ranks->model();
    const ModelConfig& mc = model->config();
    std::fprintf(stderr, "tetra bench decode: %s\n", describe_architecture(mc).c_str());
    TETRA_CHECK(context + 2 + steps + profile_steps <= mc.max_position_embeddings, "--context ", context, " plus ",
                2 + steps + profile_steps, " decode steps is more than the model's context of ",
                mc.max_position_embeddings, " tokens");
    std::vector<Row> rows;
    for (int64_t batch : batch_sizes) {
      Row r;
      r.batch = batch;
      r.context = context;
      r.served = run_engine(*ranks, config, batch, context, steps, nullptr, 0, &r.graph_steps, &r.fill_s);
      if (profile_steps > 0) {
        runtime::EngineConfig eager = config;
        eager.disable_cuda_graph = true;
        std::vector<OpTimes> profiled;
        OpTimes fill;
        r.eager = run_engine(*ranks, eager, batch, context, steps, prof, profile_steps, nullptr, nullptr, &profiled,
                             skip_prefill ? nullptr : &fill);
        for (const auto& [name, op] : fill) {
          if (name.empty()) {
            r.fill_eager_s = op.seconds;
            continue;
          }
          r.fill_by_class[op.cls] += op.seconds;
          r.fill_ops_s += op.seconds;
          r.fill_top.emplace_back(name, op);
        }
        std::sort(r.fill_top.begin(), r.fill_top.end(),
                  [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
        // Each op's median over the profiled steps (one stray wait does not skew it).
        for (const auto& [name, first] : profiled.front()) {
          std::vector<double> t;
          for (const OpTimes& step : profiled) t.push_back(step.count(name) ? step.at(name).seconds : 0.0);
          runtime::OpTime op = first;
          op.seconds = summarize(t).median;
          r.by_class[op.cls] += op.seconds;
          r.ops_s += op.seconds;
          r.top.emplace_back(name, op);
        }
        std::sort(r.top.begin(), r.top.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
      }
      // The mean context over the timed steps.
      r.floor_s = step_floor_bytes(*model, batch, context + 1 + steps / 2, prof->kv_dtype()) / (bandwidth_tbs * 1e12);
      rows.push_back(r);
    }

    std::printf("%s, context %lld, %d steps timed per batch (median, min-max); floor at %.2f TB/s\n",
                model_dir.c_str(), (long long)context, steps, bandwidth_tbs);
    std::printf("%6s %22s %10s %9s %8s %8s %9s", "batch", "step ms", "tok/s", "floor ms", "% floor", "host ms",
                "eager ms");
    const OpClass classes[] = {OpClass::Attention, OpClass::Moe, OpClass::DenseGemm, OpClass::NormRope,
                               OpClass::Elementwise, OpClass::Sampling};
    if (profile_steps > 0) {
      for (OpClass c : classes) std::printf(" %11s", runtime::op_class_name(c));
      std::printf(" %9s", "gaps");
    }
    std::printf("\n");
    for (const Row& r : rows) {
      char step[64];
      std::snprintf(step, sizeof step, "%.3f (%.3f-%.3f)", r.served.median * 1e3, r.served.min * 1e3, r.served.max * 1e3);
      std::printf("%6lld %22s %10.1f %9.3f %7.1f%% %8.3f %9.3f", (long long)r.batch, step,
                  double(r.batch) / r.served.median, r.floor_s * 1e3, 100 * r.floor_s / r.served.median,
                  r.served.host * 1e3, r.eager.median * 1e3);
      if (profile_steps > 0) {
        for (OpClass c : classes) std::printf(" %11.3f", (r.by_class.count(c) ? r.by_class.at(c) : 0.0) * 1e3);
        std::printf(" %9.3f", (r.eager.median - r.ops_s) * 1e3);
      }
      std::printf("\n");
      if (verbose)
        for (size_t i = 0; i < std::min<size_t>(r.top.size(), 12); ++i)
          std::printf("       %-32s %6lld calls %9.3f ms a step\n", r.top[i].first.c_str(),
                      (long long)r.top[i].second.calls, r.top[i].second.seconds * 1e3);
    }
    std::printf("prefill (the prompts to their first tokens, %lld tokens a step at most):", (long long)config.chunked_prefill_size);
    if (skip_prefill) {
      std::printf(" skipped (--skip-prefill: the cache holds random values)\n");
    } else {
      for (const Row& r : rows)
        std::printf("%s batch %lld %.1f ms (%.0f tok/s)", &r == &rows.front() ? "" : ";", (long long)r.batch,
                    r.fill_s * 1e3, double(r.batch * r.context) / r.fill_s);
      std::printf("\n");
      // Where a prefill's time goes, from the profiling pass (eager; each op between waits).
      for (const Row& r : rows) {
        if (r.fill_top.empty()) continue;
        std::printf("prefill breakdown, batch %lld (eager %.1f ms):", (long long)r.batch, r.fill_eager_s * 1e3);
        for (OpClass c : classes)
          std::printf(" %s %.1f,", runtime::op_class_name(c), (r.fill_by_class.count(c) ? r.fill_by_class.at(c) : 0.0) * 1e3);
        std::printf(" gaps %.1f ms\n", (r.fill_eager_s - r.fill_ops_s) * 1e3);
        if (verbose)
          for (size_t i = 0; i < std::min<size_t>(r.fill_top.size(), 12); ++i)
            std::printf("       %-32s %6lld calls %9.3f ms\n", r.fill_top[i].first.c_str(),
                        (long long)r.fill_top[i].second.calls, r.fill_top[i].second.seconds * 1e3);
      }
    }
    std::printf("host ms: a step's wall time less its wait for the device, the median (on a GPU: how long it idles "
                "a step)\n");
    if (profile_steps > 0)
      std::printf("breakdown: ms a step of the eager profiling pass (each op's median over the profiled steps), each "
                  "op timed between two waits for the device (%.1f us a wait taken off); gaps = eager step - its ops\n",
                  prof->sync_overhead() * 1e6);

    if (!json_path.empty()) {
      nlohmann::json j = nlohmann::json::array();
      for (const Row& r : rows) {
        nlohmann::json o = {{"batch", r.batch},
                            {"context", r.context},
                            {"step_ms_median", r.served.median * 1e3},
                            {"step_ms_min", r.served.min * 1e3},
                            {"step_ms_max", r.served.max * 1e3},
                            {"tokens_per_s", double(r.batch) / r.served.median},
                            {"floor_ms", r.floor_s * 1e3},
                            {"floor_fraction", r.floor_s / r.served.median},
                            {"host_ms_median", r.served.host * 1e3},
                            {"graph_steps", r.graph_steps}};
        if (!skip_prefill) {
          o["prefill_ms"] = r.fill_s * 1e3;
          o["prefill_tokens_per_s"] = double(r.batch * r.context) / r.fill_s;
          if (!r.fill_top.empty()) {
            nlohmann::json br;
            for (OpClass c : classes)
              br[runtime::op_class_name(c)] = (r.fill_by_class.count(c) ? r.fill_by_class.at(c) : 0.0) * 1e3;
            br["gaps"] = (r.fill_eager_s - r.fill_ops_s) * 1e3;
            o["prefill_eager_ms"] = r.fill_eager_s * 1e3;
            o["prefill_breakdown_ms"] = br;
          }
        }
        if (profile_steps > 0) {
          o["eager_step_ms_median"] = r.eager.median * 1e3;
          nlohmann::json br;
          for (OpClass c : classes) br[runtime::op_class_name(c)] = (r.by_class.count(c) ? r.by_class.at(c) : 0.0) * 1e3;
          br["gaps"] = (r.eager.median - r.ops_s) * 1e3;
          o["breakdown_ms"] = br;
          nlohmann::json ops = nlohmann::json::object();
          for (const auto& [name, t] : r.top) ops[name] = {{"calls_per_step", t.calls}, {"ms_per_step", t.seconds * 1e3}};
          o["ops"] = ops;
        }
        j.push_back(o);
      }
      std::ofstream(json_path) << j.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tetra bench decode: %s\n", e.what());
    return 1;
  }
}

}  // namespace tetra::cli

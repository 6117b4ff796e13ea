// The CUDA sampler against the CPU reference (ops/cpu/sampling), which shares its arithmetic:
// tokens must be equal exactly (a difference is a bug, never rounding), log-probs within 1e-4.
// Awkward cases: V = 7, rows outnumbering the kernel's blocks (workspace slots reused), rows of
// a few distinct values (ties at every threshold), masked (-inf) logits, the largest vocabulary,
// graph capture, repeat runs. A failing row is explained with the rule's intermediate values
// (theta_k, theta_p, masses, target, where the GPU's token sits) to say which step went wrong.
// The batch timing is printed, never asserted.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "ops/cpu/sampling.h"
#include "ops/cuda/sampling.h"
#include "cuda_test_util.h"
#include "../sampling_batch.h"

namespace tetra::ops::cuda {
namespace {

using testing_util::DevBuf;
using testing_util::have_gpu;

constexpr float kInf = std::numeric_limits<float>::infinity();

using Batch = ops::testing_util::SamplingBatch;

// The batch on the device, launched as the backend would.
struct DeviceBatch {
  const Batch& b;
  DevBuf logits, rows, ids, counts, out, workspace;
  explicit DeviceBatch(const Batch& batch)
      : b(batch),
        logits(batch.logits.size() * sizeof(float)),
        rows(batch.rows.size() * sizeof(SamplingRow)),
        ids(batch.penalty_ids.size() * sizeof(int32_t)),
        counts(batch.penalty_counts.size() * sizeof(int32_t)),
        out(batch.rows.size() * sizeof(SampledToken)),
        workspace(size_t(sample_workspace_bytes(batch.n_rows(), batch.vocab))) {
    cudaMemcpy(logits.p, b.logits.data(), b.logits.size() * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(rows.p, b.rows.data(), b.rows.size() * sizeof(SamplingRow), cudaMemcpyHostToDevice);
    cudaMemcpy(ids.p, b.penalty_ids.data(), b.penalty_ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    cudaMemcpy(counts.p, b.penalty_counts.data(), b.penalty_counts.size() * sizeof(int32_t),
               cudaMemcpyHostToDevice);
    cudaMemset(out.p, 0xff, b.rows.size() * sizeof(SampledToken));  // nothing left over passes
  }
  bool ready() const { return logits.p && rows.p && ids.p && counts.p && out.p && workspace.p; }
  void launch(cudaStream_t stream) {
    launch_sample({.stream = stream}, logits.as<float>(), b.n_rows(), b.vocab, rows.as<SamplingRow>(),
                  ids.as<int32_t>(), counts.as<int32_t>(), int64_t(b.penalty_ids.size()), out.as<SampledToken>(),
                  workspace.p);
  }
  std::vector<SampledToken> result() const {
    std::vector<SampledToken> host(b.rows.size());
    cudaMemcpy(host.data(), out.p, host.size() * sizeof(SampledToken), cudaMemcpyDeviceToHost);
    return host;
  }
};

std::vector<SampledToken> run_gpu(const Batch& b) {
  DeviceBatch d(b);
  EXPECT_TRUE(d.ready()) << "device allocation failed";
  if (!d.ready()) return {};
  d.launch(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.result();
}

std::vector<SampledToken> run_cpu(const Batch& b) {
  static ThreadPool pool(0);
  std::vector<SampledToken> out(b.rows.size());
  cpu::sample_rows(&pool, TensorView{const_cast<float*>(b.logits.data()), DType::F32, {b.n_rows(), b.vocab}},
                   b.rows.data(), b.penalty_ids.data(), b.penalty_counts.data(), int64_t(b.penalty_ids.size()),
                   out.data());
  return out;
}

// --- diagnostics: the rule's steps done the slow way ---------------------------------------

std::string explain(const Batch& b, int64_t r, int32_t cpu_token, int32_t gpu_token) {
  const SamplingRow& row = b.rows[size_t(r)];
  const std::vector<float> z = b.penalized_row(r);
  std::vector<float> sorted = z;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  std::ostringstream s;
  s << "row " << r << ": T " << row.temperature << " top_k " << row.top_k << " top_p " << row.top_p
    << " penalties " << row.penalty_count << " (repetition " << row.repetition_penalty << ") seed " << row.seed << " position " << row.position
    << " | max z " << sorted[0];
  if (gpu_token < 0 || gpu_token >= b.vocab) {
    s << " | GPU token " << gpu_token << " is outside the vocabulary";
    return s.str();
  }
  s << " | z[cpu " << cpu_token << "] " << z[size_t(cpu_token)] << ", z[gpu " << gpu_token << "] "
    << z[size_t(gpu_token)];
  if (row.temperature <= 0) return s.str() + " (greedy: the first max of z wins)";
  const int64_t k = row.top_k > 0 && row.top_k < b.vocab ? row.top_k : b.vocab;
  const float theta_k = sorted[size_t(k - 1)], max_z = sorted[0];
  const float inv_t = sampling::inverse_temperature(row.temperature);
  uint64_t total = 0;
  for (float v : z)
    if (v >= theta_k) total += sampling::token_mass(v, max_z, inv_t);
  float theta = theta_k;
  if (row.top_p < 1.0f) {
    const uint64_t need = sampling::top_p_need(row.top_p, total);
    uint64_t acc = 0;
    for (size_t i = 0; i < sorted.size() && sorted[i] >= theta_k;) {
      const float v = sorted[i];
      for (; i < sorted.size() && sorted[i] == v; ++i) acc += sampling::token_mass(v, max_z, inv_t);
      if (acc >= need) {
        theta = v;
        break;
      }
    }
    s << " | need " << need << " of C's " << total;
  }
  uint64_t kept = 0, before_gpu = 0;
  int64_t n_kept = 0;
  for (int64_t i = 0; i < b.vocab; ++i) {
    if (!(z[size_t(i)] >= theta)) continue;
    if (i == gpu_token) before_gpu = kept;
    kept += sampling::token_mass(z[size_t(i)], max_z, inv_t);
    ++n_kept;
  }
  const uint64_t target = sampling::draw_target(uniform_double(row.seed, row.position), kept);
  s << " | theta_k " << theta_k << " theta " << theta << " |N| " << n_kept << " mass(N) " << kept << " target "
    << target;
  if (!(z[size_t(gpu_token)] >= theta))
    s << " | the GPU token is outside N: a threshold (top-k or top-p) is wrong";
  else
    s << " | the GPU token is in N, its running mass spans [" << before_gpu << ", "
      << before_gpu + sampling::token_mass(z[size_t(gpu_token)], max_z, inv_t)
      << "): the draw (tile masses or the scan) is wrong";
  return s.str();
}

bool close(float a, float b, float tolerance) { return a == b || std::abs(a - b) <= tolerance; }

// GPU against CPU, row by row; stops reporting after a few failing rows.
void expect_parity(const Batch& b, const std::string& what) {
  const std::vector<SampledToken> gpu = run_gpu(b), cpu = run_cpu(b);
  ASSERT_EQ(gpu.size(), cpu.size());
  int failures = 0;
  for (int64_t r = 0; r < b.n_rows() && failures < 8; ++r) {
    const SampledToken &g = gpu[size_t(r)], &c = cpu[size_t(r)];
    bool ok = true;
    if (g.token != c.token) {
      ADD_FAILURE() << what << ": token GPU " << g.token << " CPU " << c.token << "\n  "
                    << explain(b, r, c.token, g.token);
      ok = false;
    } else if (!close(g.logprob, c.logprob, 1e-4f)) {
      ADD_FAILURE() << what << " row " << r << ": logprob GPU " << g.logprob << " CPU " << c.logprob;
      ok = false;
    }
    if (g.n_top != c.n_top) {
      ADD_FAILURE() << what << " row " << r << ": n_top GPU " << g.n_top << " CPU " << c.n_top;
      ok = false;
    } else {
      for (int j = 0; j < c.n_top && ok; ++j) {
        if (g.top_ids[j] != c.top_ids[j] || !close(g.top_logprobs[j], c.top_logprobs[j], 1e-4f)) {
          ADD_FAILURE() << what << " row " << r << ": top " << j << " GPU (" << g.top_ids[j] << ", "
                        << g.top_logprobs[j] << ") CPU (" << c.top_ids[j] << ", " << c.top_logprobs[j]
                        << "), n_top " << c.n_top;
          ok = false;
        }
      }
    }
    failures += ok ? 0 : 1;
  }
}

// --- batches --------------------------------------------------------------------------------

std::vector<float> normal_logits(int64_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

enum class Logits { Normal, FewValues, Masked };

// Rows cycling through every option: greedy and sampled, temperatures, top-k from 1 past V,
// top-p from 0.05 to 1, penalties on every third row (presence and frequency, repetition over
// prompt entries of count 0 too, or both), 0 / 5 / 20 top logprobs, random seeds
// and positions.
Batch mixed_batch(int64_t v, int n_rows, Logits kind, std::mt19937& rng) {
  Batch b(v);
  std::uniform_int_distribution<int> pick(0, 1 << 30);
  const float temperatures[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.0f, 1.5f};
  const int top_ks[] = {0, 0, 1, 2, 7, 50, int(v) - 1, int(v), int(v) + 3};
  const float top_ps[] = {1.0f, 1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.05f};
  const int n_tops[] = {0, 5, 20};
  for (int i = 0; i < n_rows; ++i) {
    SamplingRow r;
    r.temperature = temperatures[pick(rng) % 6];
    r.top_k = top_ks[pick(rng) % 9];
    r.top_p = top_ps[pick(rng) % 7];
    r.n_top_logprobs = n_tops[pick(rng) % 3];
    r.seed = uint64_t(pick(rng)) << 34 ^ uint64_t(pick(rng));
    r.position = pick(rng) % 200000;
    std::vector<float> l = normal_logits(v, 2.0f + float(pick(rng) % 4), rng);
    if (kind == Logits::FewValues)
      for (float& x : l) x = std::round(x / 3);  // a handful of values: exact ties everywhere
    if (kind == Logits::Masked)
      for (size_t j = 0; j < l.size(); ++j)
        if (j % 3 != 0 && j != l.size() - 1) l[j] = -kInf;
    std::vector<std::pair<int32_t, int32_t>> penalties;
    if (i % 3 == 1) {
      const int kind = pick(rng) % 3;  // 0: presence and frequency, 1: repetition, 2: all three
      r.presence_penalty = kind == 1 ? 0.0f : 0.5f * float(pick(rng) % 3);
      r.frequency_penalty = kind == 1 ? 0.0f : 0.25f * float(pick(rng) % 3) - 0.25f;
      const float repetitions[] = {0.6f, 1.1f, 1.5f, 3.0f};
      r.repetition_penalty = kind == 0 ? 1.0f : repetitions[pick(rng) % 4];
      std::vector<int32_t> ids(static_cast<size_t>(v));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      const int n_pen = std::min<int>(int(v), 1 + pick(rng) % 300);
      for (int e = 0; e < n_pen; ++e)
        penalties.push_back({ids[size_t(e)], kind == 0 ? 1 + pick(rng) % 5 : pick(rng) % 5});
    }
    b.add(l, r, penalties);
  }
  return b;
}

// --- tests ---------------------------------------------------------------------------------

// Small enough for compute-sanitizer's memcheck, racecheck and synccheck.
TEST(SamplingCuda, MatchesOnASmallBatchOfEveryKind) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(20);
  for (Logits kind : {Logits::Normal, Logits::FewValues, Logits::Masked})
    for (auto [v, n] : {std::pair<int64_t, int>{7, 24}, {1000, 24}, {5000, 12}})
      expect_parity(mixed_batch(v, n, kind, rng), "small, V " + std::to_string(v));
}

TEST(SamplingCuda, RepetitionPenaltyGivesTheWorkedTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const ops::testing_util::WorkedRepetition worked;
  const std::vector<SampledToken> gpu = run_gpu(worked.batch);
  ASSERT_EQ(gpu.size(), worked.tokens.size());
  for (size_t r = 0; r < gpu.size(); ++r) EXPECT_EQ(gpu[r].token, worked.tokens[r]) << "row " << r;
  expect_parity(worked.batch, "worked repetition");
}

TEST(SamplingCuda, MatchesTheCpuReferenceExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(21);
  for (auto [v, n] : {std::pair<int64_t, int>{7, 600}, {1000, 600}, {151936, 96}}) {
    expect_parity(mixed_batch(v, n, Logits::Normal, rng), "V " + std::to_string(v));
  }
}

TEST(SamplingCuda, MatchesWithTiesAtEveryThreshold) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(22);
  for (auto [v, n] : {std::pair<int64_t, int>{7, 300}, {1000, 300}, {151936, 48}})
    expect_parity(mixed_batch(v, n, Logits::FewValues, rng), "ties, V " + std::to_string(v));
}

TEST(SamplingCuda, MatchesWithMaskedLogits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(23);
  for (auto [v, n] : {std::pair<int64_t, int>{7, 200}, {1000, 200}, {151936, 24}})
    expect_parity(mixed_batch(v, n, Logits::Masked, rng), "masked, V " + std::to_string(v));
}

TEST(SamplingCuda, ReusesWorkspaceSlotsWhenRowsOutnumberBlocks) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(24);
  expect_parity(mixed_batch(1000, 1500, Logits::Normal, rng), "1500 rows");
  expect_parity(mixed_batch(50, 4096, Logits::FewValues, rng), "4096 rows");
}

TEST(SamplingCuda, MatchesAtTheLargestVocabulary) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(25);
  expect_parity(mixed_batch(kSampleMaxVocab, 12, Logits::Normal, rng), "V 2^20");
  expect_parity(mixed_batch(kSampleMaxVocab - 3, 6, Logits::FewValues, rng), "V 2^20 - 3, ties");
}

TEST(SamplingCuda, IsDeterministicAndReplaysFromAGraph) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(26);
  const Batch b = mixed_batch(151936, 32, Logits::Normal, rng);
  const std::vector<SampledToken> first = run_gpu(b);
  DeviceBatch d(b);
  ASSERT_TRUE(d.ready());
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  d.launch(stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, stream));
  CK(cudaStreamSynchronize(stream));
  const std::vector<SampledToken> replayed = d.result();
  ASSERT_EQ(first.size(), replayed.size());
  EXPECT_EQ(std::memcmp(first.data(), replayed.data(), first.size() * sizeof(SampledToken)), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(SamplingCuda, RejectsBadSizes) {
  EXPECT_THROW(sample_workspace_bytes(4, 0), Error);
  EXPECT_THROW(sample_workspace_bytes(4, kSampleMaxVocab + 1), Error);
  EXPECT_THROW(sample_workspace_bytes(-1, 10), Error);
  EXPECT_EQ(sample_workspace_bytes(0, 10), 0);
  EXPECT_THROW(launch_sample({}, nullptr, 1, 0, nullptr, nullptr, nullptr, 0, nullptr, nullptr), Error);
  EXPECT_THROW(launch_sample({}, nullptr, 1, 10, nullptr, nullptr, nullptr, 0, nullptr, nullptr), Error);
  EXPECT_NO_THROW(launch_sample({}, nullptr, 0, 10, nullptr, nullptr, nullptr, 0, nullptr, nullptr));
}

// --- timing ----------------------------------------------------------------------------------

TEST(SamplingCuda, PrintsTheTimeOfABatchOf256Rows) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kVocab = 151936, kRows = 256;
  std::mt19937 rng(27);
  Batch b(kVocab);
  for (int64_t r = 0; r < kRows; ++r) b.add(normal_logits(kVocab, 3.0f, rng), SamplingRow{});
  DeviceBatch d(b);
  ASSERT_TRUE(d.ready());
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  struct Mode {
    const char* name;
    float temperature, top_p;
    int top_k, n_top;
  };
  const Mode modes[] = {{"greedy", 0.0f, 1.0f, 0, 0},
                        {"greedy + 5 logprobs", 0.0f, 1.0f, 0, 5},
                        {"T 0.7", 0.7f, 1.0f, 0, 0},
                        {"top_p 0.9", 0.7f, 0.9f, 0, 0},
                        {"top_k 50 + top_p 0.95", 0.7f, 0.95f, 50, 0},
                        {"top_p 0.9 + 5 logprobs", 0.7f, 0.9f, 0, 5}};
  const double bytes = double(kRows * kVocab) * sizeof(float);
  for (const Mode& m : modes) {
    std::vector<SamplingRow> rows(static_cast<size_t>(kRows));
    for (int64_t r = 0; r < kRows; ++r) {
      rows[size_t(r)].temperature = m.temperature;
      rows[size_t(r)].top_p = m.top_p;
      rows[size_t(r)].top_k = m.top_k;
      rows[size_t(r)].n_top_logprobs = m.n_top;
      rows[size_t(r)].seed = uint64_t(r);
      rows[size_t(r)].position = 1000;
    }
    CK(cudaMemcpy(d.rows.p, rows.data(), rows.size() * sizeof(SamplingRow), cudaMemcpyHostToDevice));
    d.launch(nullptr);  // warm-up
    constexpr int kReps = 10;
    CK(cudaEventRecord(start));
    for (int i = 0; i < kReps; ++i) d.launch(nullptr);
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    ms /= kReps;
    std::printf("sample %lld x %lld, %-24s %8.3f ms (%.2f us per row; one read of the logits at %.0f GB/s)\n",
                (long long)kRows, (long long)kVocab, m.name, ms, 1e3 * ms / kRows, bytes / (ms * 1e6));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace tetra::ops::cuda

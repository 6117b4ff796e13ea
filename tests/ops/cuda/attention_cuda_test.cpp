// The CUDA paged GQA attention against a host reference in double precision on the same BF16
// inputs, so the test measures the kernels, not the rounding of the data. Every case scatters
// each sequence's keys over randomly permuted cache blocks (the unused block-table entries
// point far past the cache, so reading one faults), poisons the output and a guard band past
// it with NaN (unwritten or overrun elements show), and prints the path the host chose with
// the error it got, so a failure names its shape, path and size at once.
//
// Error budget. What is left against a double reference on the same inputs is (1) the one
// rounding of the output to BF16: a relative error up to 2^-9 per element, an NMSE of about
// 1e-6 to 3e-6 (printed per case as "floor": the NMSE of the reference itself rounded to
// BF16); (2) P rounded to BF16 for the P V product, relative 2^-9 per weight and averaging
// over keys: the same order; (3) f32 sums and ex2.approx: far below. A correct kernel lands at
// 1-3x the floor; the bound of 1e-4 leaves a wide margin and still catches a dropped or doubled
// 32-key tile of a 32k context (1/1024 of its weight: NMSE ~1e-3), a wrong mask or a wrong
// slot. The largest error is held to 1e-2 of the largest |ref| (2.5 BF16 ulps at the top).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/attention_gqa.h"
#include "ops/ops.h"
#include "cuda_test_util.h"

namespace tetra::ops::cuda {
namespace {

using testing_util::DevBuf;
using testing_util::have_gpu;

constexpr double kMaxNmse = 1e-4;
constexpr double kMaxErrOfMaxRef = 1e-2;
constexpr uint16_t kPoison = 0xffff;  // a BF16 NaN no kernel writes
constexpr int kGuard = 256;           // poisoned elements past the output

int device_sm_count() {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 0;
  return n;
}

// splitmix64: fast enough for the half gigabyte of cache the timing cases fill.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * 0x1p-24f; }
  int below(int n) { return int(next() % uint64_t(n)); }
};

// Uniform in [-amp, amp], never zero: zeros hide unwritten outputs and wrong indexing.
uint16_t random_bf16(Rng& rng, float amp) {
  const uint16_t h = f32_to_bf16(rng.uniform(-amp, amp));
  return (h & 0x7fff) == 0 ? f32_to_bf16(amp / 16) : h;
}

uint64_t name_seed(const char* name) {  // FNV-1a: each case draws its own data
  uint64_t h = 1469598103934665603ull;
  for (const char* c = name; *c; ++c) h = (h ^ uint8_t(*c)) * 1099511628211ull;
  return h;
}

template <class F>
void parallel_for(int64_t n, F&& f) {
  const int n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < n_threads; ++i)
    pool.emplace_back([&] {
      for (int64_t j; (j = next++) < n;) f(j);
    });
  for (auto& t : pool) t.join();
}

struct SeqSpec {
  int context;  // tokens of the sequence in the cache once this step is written (seq_lens)
  int n_new;    // its tokens in the batch: positions context - n_new .. context - 1
};

enum class Expect : uint8_t { Any, Decode, Prefill, PrefillWgmma, Fallback };

struct AttnCase {
  const char* name;
  int n_heads, n_kv_heads, d_k, d_v, block_size;
  std::vector<SeqSpec> seqs;
  Expect expect = Expect::Any;
  int min_splits = 1;       // the plan must split the keys at least this many ways
  bool misalign_q = false;  // q 2 bytes off 16-byte alignment: only the fallback may take it
  float scale_mult = 1.0f;  // scale = scale_mult / sqrt(d_k); > 1 sharpens the softmax
  // An FP8 (E4M3) cache holding k / k_scale and v / v_scale; the reference reads the same bytes.
  bool fp8 = false;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Row r of q (a token's head) times 2^((5r) % 17 - 12): magnitudes 2^-12 .. 2^4 apart, so a
  // kernel that scales each row on its own (an FP8 cache's FP16 Q) must keep every row's scale.
  bool q_row_scales = false;
};

void PrintTo(const AttnCase& c, std::ostream* os) { *os << c.name; }

const char* path_name(PagedAttentionPath p) {
  switch (p) {
    case PagedAttentionPath::Decode: return "decode";
    case PagedAttentionPath::Prefill: return "prefill";
    case PagedAttentionPath::PrefillWgmma: return "wgmma";
    case PagedAttentionPath::Fallback: return "fallback";
  }
  return "?";
}

// A batch on the host; `p` has the sizes, its pointers are set on upload.
struct HostBatch {
  PagedAttentionParams p{};
  int64_t n_blocks = 0;
  std::vector<uint16_t> q, k_cache, v_cache;   // BF16; with an FP8 cache, the values before quantization
  std::vector<uint8_t> k8, v8;                  // the FP8 cache's bytes
  std::vector<int32_t> positions, seq_starts, seq_lens, block_tables;

  bool fp8() const { return p.fp8_cache; }
  double k_at(size_t i) const { return fp8() ? double(e4m3_to_f32(k8[i])) * p.k_scale : bf16_to_f32(k_cache[i]); }
  double v_at(size_t i) const { return fp8() ? double(e4m3_to_f32(v8[i])) * p.v_scale : bf16_to_f32(v_cache[i]); }
  size_t cache_bytes(const std::vector<uint16_t>& c) const { return c.size() * (fp8() ? 1 : 2); }
};

HostBatch make_batch(const AttnCase& c, uint64_t seed) {
  Rng rng{seed};
  HostBatch b;
  PagedAttentionParams& p = b.p;
  p.n_seqs = int(c.seqs.size());
  p.n_heads = c.n_heads;
  p.n_kv_heads = c.n_kv_heads;
  p.d_k = c.d_k;
  p.d_v = c.d_v;
  p.block_size = c.block_size;
  p.scale = c.scale_mult / std::sqrt(float(c.d_k));
  p.fp8_cache = c.fp8;
  if (c.fp8) p.k_scale = c.k_scale, p.v_scale = c.v_scale;

  int max_blocks = 1;
  for (const SeqSpec& s : c.seqs) {
    const int n = (s.context + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, n);
    b.n_blocks += n;
  }
  p.max_blocks_per_seq = max_blocks + 2;  // every row ends in garbage
  b.n_blocks += 3;                        // blocks no sequence owns
  std::vector<int32_t> ids(size_t(b.n_blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[size_t(rng.below(int(i + 1)))]);
  // Far past the cache (but slot * block_size still fits int32): a read of one faults.
  const int32_t garbage = int32_t(b.n_blocks + (1 << 20));
  b.block_tables.assign(size_t(p.n_seqs) * p.max_blocks_per_seq, garbage);
  size_t next_block = 0;
  b.seq_starts.push_back(0);
  for (int s = 0; s < p.n_seqs; ++s) {
    const SeqSpec& spec = c.seqs[size_t(s)];
    for (int i = 0; i < (spec.context + c.block_size - 1) / c.block_size; ++i)
      b.block_tables[size_t(s) * p.max_blocks_per_seq + i] = ids[next_block++];
    for (int i = 0; i < spec.n_new; ++i) b.positions.push_back(spec.context - spec.n_new + i);
    b.seq_starts.push_back(int32_t(b.positions.size()));
    b.seq_lens.push_back(spec.context);
    p.max_query_len = std::max(p.max_query_len, spec.n_new);
    p.max_seq_len = std::max(p.max_seq_len, spec.context);
  }
  p.n_tokens = int(b.positions.size());

  b.q.resize(size_t(p.n_tokens) * p.n_heads * p.d_k);
  b.k_cache.resize(size_t(b.n_blocks) * p.block_size * p.n_kv_heads * p.d_k);
  b.v_cache.resize(size_t(b.n_blocks) * p.block_size * p.n_kv_heads * p.d_v);
  // q . k over [-2, 2] gives scores of standard deviation ~1.3 at scale 1/sqrt(d): a softmax
  // neither flat nor one-hot.
  for (auto& x : b.q) x = random_bf16(rng, 2.0f);
  if (c.q_row_scales)
    for (size_t i = 0; i < b.q.size(); ++i) {
      const int row = int(i / size_t(p.d_k));
      b.q[i] = f32_to_bf16(std::ldexp(bf16_to_f32(b.q[i]), (5 * row) % 17 - 12));  // exact: a power of 2
    }
  for (auto& x : b.k_cache) x = random_bf16(rng, 2.0f);
  for (auto& x : b.v_cache) x = random_bf16(rng, 1.0f);
  if (c.fp8) {
    for (uint16_t x : b.k_cache) b.k8.push_back(f32_to_e4m3(bf16_to_f32(x) / c.k_scale));
    for (uint16_t x : b.v_cache) b.v8.push_back(f32_to_e4m3(bf16_to_f32(x) / c.v_scale));
  }
  return b;
}

// The definition, in double: for token t of sequence s and head h, softmax over the keys
// 0 .. positions[t] of s in KV head h / group, gathered through the block table.
std::vector<double> reference(const HostBatch& b) {
  const PagedAttentionParams& p = b.p;
  const int group = p.n_heads / p.n_kv_heads;
  std::vector<double> out(size_t(p.n_tokens) * p.n_heads * p.d_v);
  for (int s = 0; s < p.n_seqs; ++s) {
    const int t0 = b.seq_starts[size_t(s)], t1 = b.seq_starts[size_t(s) + 1];
    int n_keys = 0;
    for (int t = t0; t < t1; ++t) n_keys = std::max(n_keys, b.positions[size_t(t)] + 1);
    // This sequence's keys and values in position order, [key][kv head][dim].
    std::vector<double> k(size_t(n_keys) * p.n_kv_heads * p.d_k), v(size_t(n_keys) * p.n_kv_heads * p.d_v);
    for (int j = 0; j < n_keys; ++j) {
      const int64_t block = b.block_tables[size_t(s) * p.max_blocks_per_seq + j / p.block_size];
      const int64_t slot = block * p.block_size + j % p.block_size;
      for (int i = 0; i < p.n_kv_heads * p.d_k; ++i)
        k[size_t(j) * p.n_kv_heads * p.d_k + i] = b.k_at(size_t(slot * p.n_kv_heads * p.d_k + i));
      for (int i = 0; i < p.n_kv_heads * p.d_v; ++i)
        v[size_t(j) * p.n_kv_heads * p.d_v + i] = b.v_at(size_t(slot * p.n_kv_heads * p.d_v + i));
    }
    parallel_for(int64_t(t1 - t0) * p.n_heads, [&](int64_t i) {
      const int t = t0 + int(i / p.n_heads), h = int(i % p.n_heads), g = h / group;
      const int n = b.positions[size_t(t)] + 1;
      const uint16_t* q = &b.q[(size_t(t) * p.n_heads + h) * p.d_k];
      std::vector<double> score(static_cast<size_t>(n));
      double max_score = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const double* kj = &k[(size_t(j) * p.n_kv_heads + g) * p.d_k];
        double dot = 0;
        for (int d = 0; d < p.d_k; ++d) dot += double(bf16_to_f32(q[d])) * kj[d];
        score[size_t(j)] = dot * double(p.scale);
        max_score = std::max(max_score, score[size_t(j)]);
      }
      double denom = 0;
      for (double& x : score) denom += (x = std::exp(x - max_score));
      double* o = &out[(size_t(t) * p.n_heads + h) * p.d_v];
      for (int d = 0; d < p.d_v; ++d) o[d] = 0;
      for (int j = 0; j < n; ++j) {
        const double* vj = &v[(size_t(j) * p.n_kv_heads + g) * p.d_v];
        const double w = score[size_t(j)] / denom;
        for (int d = 0; d < p.d_v; ++d) o[d] += w * vj[d];
      }
    });
  }
  return out;
}

struct Comparison {
  double nmse = 0, floor_nmse = 0, max_err_of_max_ref = 0;
  int64_t n_unwritten = 0;  // NaN in the output: never written (the poison) or computed NaN
};

Comparison compare(const std::vector<uint16_t>& out, const std::vector<double>& ref) {
  Comparison c;
  double err2 = 0, floor2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = bf16_to_f32(out[i]);
    if (std::isnan(o)) {
      ++c.n_unwritten;
      continue;
    }
    const double e = o - ref[i], f = double(bf16_to_f32(f32_to_bf16(float(ref[i])))) - ref[i];
    err2 += e * e;
    floor2 += f * f;
    ref2 += ref[i] * ref[i];
    max_err = std::max(max_err, std::abs(e));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  c.nmse = err2 / ref2;
  c.floor_nmse = floor2 / ref2;
  c.max_err_of_max_ref = max_err / max_ref;
  return c;
}

// The batch on the device; q is placed 2 bytes off alignment when asked.
struct DeviceBatch {
  DevBuf q, k, v, out, positions, seq_starts, seq_lens, tables;
  PagedAttentionParams p;
  int64_t n_out;

  DeviceBatch(const HostBatch& b, bool misalign_q)
      : q(b.q.size() * 2 + 16),
        k(b.cache_bytes(b.k_cache)),
        v(b.cache_bytes(b.v_cache)),
        out((size_t(b.p.n_tokens) * b.p.n_heads * b.p.d_v + kGuard) * 2),
        positions(b.positions.size() * 4),
        seq_starts(b.seq_starts.size() * 4),
        seq_lens(b.seq_lens.size() * 4),
        tables(b.block_tables.size() * 4),
        p(b.p),
        n_out(int64_t(b.p.n_tokens) * b.p.n_heads * b.p.d_v) {
    p.q = reinterpret_cast<const uint16_t*>(static_cast<uint8_t*>(q.p) + (misalign_q ? 2 : 0));
    p.k_cache = k.p;
    p.v_cache = v.p;
    p.out = static_cast<uint16_t*>(out.p);
    p.positions = static_cast<const int32_t*>(positions.p);
    p.seq_starts = static_cast<const int32_t*>(seq_starts.p);
    p.seq_lens = static_cast<const int32_t*>(seq_lens.p);
    p.block_tables = static_cast<const int32_t*>(tables.p);
  }
  bool allocated() const {
    return q.p && k.p && v.p && out.p && positions.p && seq_starts.p && seq_lens.p && tables.p;
  }
};

void upload(const HostBatch& b, DeviceBatch& d) {
  ASSERT_TRUE(d.allocated()) << "cudaMalloc failed";
  CK(cudaMemcpy(const_cast<uint16_t*>(d.p.q), b.q.data(), b.q.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.k.p, b.fp8() ? static_cast<const void*>(b.k8.data()) : b.k_cache.data(), b.cache_bytes(b.k_cache),
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.v.p, b.fp8() ? static_cast<const void*>(b.v8.data()) : b.v_cache.data(), b.cache_bytes(b.v_cache),
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.positions.p, b.positions.data(), b.positions.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.seq_starts.p, b.seq_starts.data(), b.seq_starts.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.seq_lens.p, b.seq_lens.data(), b.seq_lens.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.tables.p, b.block_tables.data(), b.block_tables.size() * 4, cudaMemcpyHostToDevice));
}

void poison_output(DeviceBatch& d) {
  std::vector<uint16_t> poison(size_t(d.n_out + kGuard), kPoison);
  CK(cudaMemcpy(d.out.p, poison.data(), poison.size() * 2, cudaMemcpyHostToDevice));
}

// Runs paged_attention on `stream` (a tetra::Error becomes a test failure).
void launch(cudaStream_t stream, const DeviceBatch& d, void* ws, int64_t ws_bytes, int sm_count) {
  try {
    paged_attention({.stream = stream}, d.p, ws, ws_bytes, sm_count);
  } catch (const Error& e) {
    FAIL() << "paged_attention threw: " << e.what();
  }
}

void check_plan(const AttnCase& c, const PagedAttentionPlan& plan) {
  switch (c.expect) {
    case Expect::Any: break;
    case Expect::Decode: EXPECT_EQ(plan.path, PagedAttentionPath::Decode); break;
    case Expect::Prefill: EXPECT_EQ(plan.path, PagedAttentionPath::Prefill); break;
    case Expect::PrefillWgmma: EXPECT_EQ(plan.path, PagedAttentionPath::PrefillWgmma); break;
    case Expect::Fallback: EXPECT_EQ(plan.path, PagedAttentionPath::Fallback); break;
  }
  EXPECT_GE(plan.n_splits, c.min_splits) << "the keys are split " << plan.n_splits << " ways";
}

void run_case(const AttnCase& c) {
  const int sm_count = device_sm_count();
  ASSERT_GT(sm_count, 0);
  const HostBatch b = make_batch(c, name_seed(c.name));
  DeviceBatch d(b, c.misalign_q);
  upload(b, d);
  poison_output(d);
  if (testing::Test::HasFatalFailure()) return;

  const PagedAttentionPlan plan = paged_attention_plan(d.p, sm_count);
  check_plan(c, plan);
  const int64_t ws_bytes = paged_attention_workspace_bytes(d.p, sm_count);
  DevBuf ws{size_t(ws_bytes)};
  ASSERT_TRUE(ws.p);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  launch(stream, d, ws_bytes ? ws.p : nullptr, ws_bytes, sm_count);
  const cudaError_t run = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  ASSERT_EQ(run, cudaSuccess) << "the kernels faulted: " << cudaGetErrorString(run);

  std::vector<uint16_t> out(size_t(d.n_out + kGuard));
  CK(cudaMemcpy(out.data(), d.out.p, out.size() * 2, cudaMemcpyDeviceToHost));
  int64_t n_overrun = 0;
  for (int i = 0; i < kGuard; ++i) n_overrun += out[size_t(d.n_out + i)] != kPoison;
  out.resize(size_t(d.n_out));
  const Comparison cmp = compare(out, reference(b));
  std::printf("[attention] %-26s %-8s D %3d row tiles %4d splits %3d x %5d keys | nmse %.2e (floor %.2e) "
              "max err %.2e of max |ref|, unwritten %lld\n",
              c.name, path_name(plan.path), plan.head_dim_tile, plan.n_row_tiles, plan.n_splits,
              plan.keys_per_split, cmp.nmse, cmp.floor_nmse, cmp.max_err_of_max_ref,
              static_cast<long long>(cmp.n_unwritten));
  EXPECT_EQ(cmp.n_unwritten, 0) << "output elements left unwritten (or NaN)";
  EXPECT_EQ(n_overrun, 0) << "elements written past the output";
  EXPECT_LE(cmp.nmse, kMaxNmse);
  EXPECT_LE(cmp.max_err_of_max_ref, kMaxErrOfMaxRef);
}

class AttentionCudaTest : public testing::TestWithParam<AttnCase> {};

TEST_P(AttentionCudaTest, MatchesDoubleReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_case(GetParam());
}

// Three sequences: a decode at 300, a 40-token chunk at 60..99 (crossing blocks), a decode at 33.
std::vector<SeqSpec> small_mix() { return {{300, 1}, {100, 40}, {33, 1}}; }
std::vector<SeqSpec> small_decodes() { return {{300, 1}, {1, 1}, {47, 1}}; }

// gtest copies the cases; their names must outlive the vector that made them.
const char* keep_name(std::string name) {
  static std::deque<std::string> names;
  return names.emplace_back(std::move(name)).c_str();
}

std::vector<AttnCase> all_cases() {
  using E = Expect;
  std::vector<AttnCase> cases = {
      {"context_1", 8, 2, 64, 64, 16, {{1, 1}}, E::Decode},
      {"decode_ctx_17", 32, 4, 128, 128, 16, {{17, 1}}, E::Decode},
      {"decode_ctx_1000", 32, 4, 128, 128, 16, {{1000, 1}}, E::Decode, 2},
      {"decode_ctx_4096", 32, 4, 128, 128, 16, {{4096, 1}}, E::Decode, 8},
      {"decode_ctx_32768", 32, 4, 128, 128, 16, {{32768, 1}}, E::Decode, 32},
      {"decode_ctx_mixed", 32, 4, 128, 128, 16, {{1, 1}, {17, 1}, {1000, 1}, {4096, 1}}, E::Decode, 2},
      // 160 x 4 work items fill the GPU: no split, the kernel writes BF16 itself.
      {"decode_160_seqs", 32, 4, 128, 128, 16, {}, E::Decode},
      // Speculative-style decodes: 4 tokens x group 4 = 16 rows still fit one decode tile.
      {"decode_4_tokens", 16, 4, 128, 128, 16, {{500, 4}, {64, 4}, {2000, 4}}, E::Decode},
      {"prefill_300", 8, 2, 128, 128, 16, {{300, 300}}, E::PrefillWgmma},
      {"prefill_prefix_cached", 8, 2, 128, 128, 16, {{200, 77}}, E::PrefillWgmma},
      // Nine sequences: long decodes, chunks crossing block boundaries, a 1-token context,
      // a 2-token decode; the few row tiles split the long contexts.
      {"mixed_9_seqs", 16, 4, 128, 128, 16,
       {{5000, 1}, {52, 37}, {100, 100}, {3000, 1}, {1, 1}, {264, 64}, {2049, 1}, {700, 2}, {17, 17}},
       E::PrefillWgmma, 2},
      {"mixed_sharp_softmax", 16, 4, 128, 128, 16, {{5000, 1}, {52, 37}, {3000, 1}, {264, 64}}, E::PrefillWgmma,
       1, false, 4.0f},
      {"empty_sequence", 8, 2, 64, 64, 16, {{40, 3}, {10, 0}, {90, 20}}, E::Prefill},
      {"prefill_2048", 32, 4, 128, 128, 16, {{2048, 2048}}, E::PrefillWgmma},
      // The wgmma prefill's awkward shapes: a group of 3 (row tiles cut a token's heads), KV
      // blocks of 1 and 7 keys (tiles across blocks), an empty sequence, few row tiles over
      // long contexts (split keys), a softmax sharp enough that a row's maximum jumps by more
      // than the kernel's rescale slack within a prompt.
      {"wgmma_group_3", 12, 4, 128, 128, 16, {{300, 130}, {77, 77}, {5, 1}}, E::PrefillWgmma},
      {"wgmma_block_size_7", 16, 4, 128, 128, 7, {{600, 200}, {100, 40}, {33, 1}}, E::PrefillWgmma},
      {"wgmma_block_size_1", 8, 2, 128, 128, 1, {{300, 150}}, E::PrefillWgmma},
      {"wgmma_empty_sequence", 8, 2, 128, 128, 16, {{40, 3}, {10, 0}, {90, 20}}, E::PrefillWgmma},
      {"wgmma_long_split", 32, 4, 128, 128, 16, {{6000, 64}, {3000, 17}}, E::PrefillWgmma, 2},
      {"wgmma_sharper_softmax", 32, 4, 128, 128, 16, {{1500, 700}}, E::PrefillWgmma, 1, false, 12.0f},
      {"dk192_dv128_prefill", 16, 4, 192, 128, 16, small_mix(), E::Prefill},
      {"dk192_dv128_decode", 16, 4, 192, 128, 16, {{3000, 1}, {70, 1}}, E::Decode, 2},
      {"d256_decode_long", 8, 1, 256, 256, 16, {{6000, 1}}, E::Decode, 8},
  };
  cases[6].seqs.clear();
  for (int s = 0; s < 160; ++s) cases[6].seqs.push_back({1 + (s * 97) % 1500, 1});
  AttnCase row_scales{"decode_q_row_scales", 32, 4, 128, 128, 16, {{1000, 1}, {37, 1}, {4096, 1}}, E::Decode, 2};
  row_scales.q_row_scales = true;
  cases.push_back(row_scales);

  // Head dims: the mma paths zero-pad multiples of 8; 20 takes the fallback.
  for (int d : {8, 20, 24, 32, 64, 128, 256}) {
    const std::string dim = "dim_" + std::to_string(d);
    const bool mma = d % 8 == 0;
    const Expect prefill = d == 128 ? E::PrefillWgmma : E::Prefill;
    cases.push_back({keep_name(dim + "_mix"), 8, 2, d, d, 16, small_mix(), mma ? prefill : E::Fallback});
    cases.push_back({keep_name(dim + "_decode"), 8, 2, d, d, 16, small_decodes(), mma ? E::Decode : E::Fallback});
  }
  // GQA groups 1 .. 16.
  for (auto [h, kv] : {std::pair{8, 8}, {8, 4}, {16, 4}, {32, 4}, {32, 2}}) {
    const std::string group = "group_" + std::to_string(h / kv);
    cases.push_back({keep_name(group + "_mix"), h, kv, 128, 128, 16, small_mix(), E::PrefillWgmma});
    cases.push_back({keep_name(group + "_decode"), h, kv, 128, 128, 16, small_decodes(), E::Decode});
  }
  // Block sizes: 1 and 7 put almost every key tile across blocks; 64 holds whole tiles.
  for (int bs : {16, 1, 7, 64}) {
    const std::string block = "block_size_" + std::to_string(bs);
    cases.push_back({keep_name(block + "_mix"), 16, 4, 64, 64, bs, small_mix(), E::Prefill});
    cases.push_back({keep_name(block + "_decode"), 16, 4, 64, 64, bs, small_decodes(), E::Decode});
  }
  // The fallback on shapes the mma paths would take: q 2 bytes off alignment.
  cases.push_back({"fallback_d64_mix", 16, 4, 64, 64, 16, small_mix(), E::Fallback, 1, true});
  cases.push_back({"fallback_d128_bs7_long", 32, 4, 128, 128, 7, {{5000, 1}, {52, 37}, {1, 1}}, E::Fallback, 1, true});
  cases.push_back({"fallback_d256_mix", 16, 4, 256, 256, 16, small_mix(), E::Fallback, 1, true});
  cases.push_back({"fallback_dk192_dv128_mix", 16, 4, 192, 128, 16, small_mix(), E::Fallback, 1, true});
  // An FP8 cache (--kv-cache-dtype fp8_e4m3) on every path: the cases above that take each
  // tile shape, scales that are no powers of 2. d 24 is whole 16-byte chunks in BF16 but not
  // in FP8: the fallback takes it.
  for (const char* name : {"decode_ctx_1000", "decode_ctx_32768", "decode_q_row_scales", "decode_160_seqs", "decode_4_tokens", "prefill_300",
                           "prefill_prefix_cached", "mixed_9_seqs", "empty_sequence", "dk192_dv128_prefill",
                           "dk192_dv128_decode", "d256_decode_long", "dim_64_mix", "dim_64_decode", "dim_256_mix",
                           "dim_24_decode", "block_size_7_mix", "block_size_1_decode", "fallback_d128_bs7_long",
                           "fallback_dk192_dv128_mix"}) {
    const auto it = std::find_if(cases.begin(), cases.end(), [&](const AttnCase& c) { return std::string(c.name) == name; });
    TETRA_CHECK(it != cases.end(), "no attention case ", name);
    AttnCase c = *it;
    c.name = keep_name(std::string("fp8_") + name);
    c.fp8 = true;
    c.k_scale = 0.37f;
    c.v_scale = 1.7f;
    if (std::string(name) == "dim_24_decode") c.expect = E::Fallback;
    if (c.expect == E::PrefillWgmma) c.expect = E::Prefill;  // the mma.sync kernel widens FP8 tiles
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCudaTest, testing::ValuesIn(all_cases()),
                         [](const testing::TestParamInfo<AttnCase>& i) { return std::string(i.param.name); });

// The launch records into a CUDA graph (no host sync, no allocation) and replays to the same
// bits as a direct launch: the kernels are deterministic.
TEST(AttentionCudaGraph, CaptureReplaysBitExact) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int sm_count = device_sm_count();
  for (const AttnCase& c : {AttnCase{"graph_decode_split", 32, 4, 128, 128, 16, {{20000, 1}, {3000, 1}}},
                            AttnCase{"graph_mixed", 16, 4, 64, 64, 16, small_mix()},
                            AttnCase{"graph_wgmma_split", 32, 4, 128, 128, 16, {{6000, 64}, {300, 300}}}}) {
    SCOPED_TRACE(c.name);
    const HostBatch b = make_batch(c, name_seed(c.name));
    DeviceBatch d(b, false);
    upload(b, d);
    const int64_t ws_bytes = paged_attention_workspace_bytes(d.p, sm_count);
    DevBuf ws{size_t(ws_bytes)};
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    poison_output(d);
    launch(stream, d, ws.p, ws_bytes, sm_count);
    CK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> direct(size_t(d.n_out)), replayed(size_t(d.n_out));
    CK(cudaMemcpy(direct.data(), d.out.p, direct.size() * 2, cudaMemcpyDeviceToHost));

    poison_output(d);
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    launch(stream, d, ws.p, ws_bytes, sm_count);
    CK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(replayed.data(), d.out.p, replayed.size() * 2, cudaMemcpyDeviceToHost));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    EXPECT_TRUE(direct == replayed) << "graph replay differs from the direct launch";
  }
}

// ---- timing: reported, never asserted ----

// Median of `reps` timed launches after 3 warm-ups, in microseconds.
double median_launch_us(cudaStream_t stream, const DeviceBatch& d, void* ws, int64_t ws_bytes, int sm_count,
                        int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) launch(stream, d, ws, ws_bytes, sm_count);
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, stream);
    launch(stream, d, ws, ws_bytes, sm_count);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    us.push_back(ms * 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void time_case(const AttnCase& c, bool report_flops) {
  const int sm_count = device_sm_count();
  const HostBatch b = make_batch(c, name_seed(c.name));
  DeviceBatch d(b, false);
  upload(b, d);
  const PagedAttentionPlan plan = paged_attention_plan(d.p, sm_count);
  const int64_t ws_bytes = paged_attention_workspace_bytes(d.p, sm_count);
  DevBuf ws{size_t(ws_bytes)};
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double us = median_launch_us(stream, d, ws.p, ws_bytes, sm_count, 20);
  CK(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  std::vector<uint16_t> out(size_t(d.n_out));
  CK(cudaMemcpy(out.data(), d.out.p, out.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::none_of(out.begin(), out.end(), [](uint16_t x) { return std::isnan(bf16_to_f32(x)); }));

  int64_t kv_bytes = 0;
  double flops = 0;
  for (const SeqSpec& s : c.seqs) {
    kv_bytes += int64_t(s.context) * c.n_kv_heads * (c.d_k + c.d_v) * (c.fp8 ? 1 : 2);
    flops += 4.0 * double(s.n_new) * s.n_new / 2 * c.d_k * c.n_heads;  // causal: half of Q K^T and P V
  }
  std::printf("[attention timing] %-22s %-8s splits %3d: %9.1f us", c.name, path_name(plan.path), plan.n_splits, us);
  if (report_flops)
    std::printf(", %.1f TFLOP/s (4 T^2/2 d heads)\n", flops / us * 1e-6);
  else
    std::printf(", %.0f GB/s of K+V read\n", double(kv_bytes) / us * 1e-3);
}

TEST(AttentionCudaTiming, Decode64Seqs4096) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  AttnCase c{"decode_64x4096", 32, 4, 128, 128, 16, {}};
  c.seqs.assign(64, SeqSpec{4096, 1});
  time_case(c, false);
}

// One long sequence: the split-KV case (the grid is its splits).
TEST(AttentionCudaTiming, Decode1Seq32768) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  time_case(AttnCase{"decode_1x32768", 32, 4, 128, 128, 16, {{32768, 1}}}, false);
}

// The same two decodes over an FP8 cache: half the bytes.
TEST(AttentionCudaTiming, Decode64Seqs4096Fp8) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  AttnCase c{"fp8_decode_64x4096", 32, 4, 128, 128, 16, {}};
  c.seqs.assign(64, SeqSpec{4096, 1});
  c.fp8 = true;
  time_case(c, false);
}

TEST(AttentionCudaTiming, Decode1Seq32768Fp8) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  AttnCase c{"fp8_decode_1x32768", 32, 4, 128, 128, 16, {{32768, 1}}};
  c.fp8 = true;
  time_case(c, false);
}

// Batches that fill less than one wave of work items, where the split count sets the waves:
// one and sixteen sequences of 8,192 (Qwen3-30B-A3B's shape), each in BF16 and FP8.
TEST(AttentionCudaTiming, DecodeFewSeqs8192) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const int n_seqs : {1, 16})
    for (const bool fp8 : {false, true}) {
      const std::string name = std::string(fp8 ? "fp8_" : "") + "decode_" + std::to_string(n_seqs) + "x8192";
      AttnCase c{keep_name(name), 32, 4, 128, 128, 16, {}};
      c.seqs.assign(size_t(n_seqs), SeqSpec{8192, 1});
      c.fp8 = fp8;
      time_case(c, false);
    }
}

TEST(AttentionCudaTiming, Prefill4096) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  time_case(AttnCase{"prefill_1x4096", 32, 4, 128, 128, 16, {{4096, 4096}}}, true);
}

// One 8,192-token prompt of Qwen3-30B-A3B's shape (the TTFT goal's), BF16 on the wgmma kernel
// and an FP8 cache on the mma.sync kernel.
TEST(AttentionCudaTiming, Prefill8192) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const bool fp8 : {false, true}) {
    AttnCase c{fp8 ? "fp8_prefill_1x8192" : "prefill_1x8192", 32, 4, 128, 128, 16, {{8192, 8192}}};
    c.fp8 = fp8;
    time_case(c, true);
  }
}

// --kv-cache-dtype fp8_e4m3: the CUDA backend keeps an E4M3 cache (BackendParityFp8Kv holds its
// MLA and DSA kernels to the CPU's); a latent or index-key cache of another dtype is refused in
// one sentence before any launch.
TEST(AttentionCudaKvDtype, Fp8CacheIsTheKvDtypeAndOtherLatentDtypesAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto b = make_backend({.device = "cuda", .kv_cache_dtype = DType::F8_E4M3});
  EXPECT_EQ(b->kv_dtype(), DType::F8_E4M3);
  auto latent = b->alloc(DType::F32, {4, 16, 1, 576});
  auto q_latent = b->alloc(DType::BF16, {1, 4, 512}), q_rope = b->alloc(DType::BF16, {1, 4, 64});
  auto index_q = b->alloc(DType::BF16, {1, 4, 576}), weights = b->alloc(DType::F32, {1, 4});
  const KvCacheLayer layer{latent->view(), {}, latent->view()};
  const auto expect_refusal = [](const std::function<void()>& op, const char* name, const char* says) {
    try {
      op();
      ADD_FAILURE() << name << " took an F32 latent cache";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_refusal([&] { b->mla_attention(b->context(), q_latent->view(), q_rope->view(), layer, {}, 1.0f, {}, {}); },
                 "mla_attention", "a BF16 or F8_E4M3 latent cache, not F32");
  expect_refusal([&] { b->dsa_select(b->context(), index_q->view(), weights->view(), layer, {}, 1.0f, 1.0f, {}); },
                 "dsa_select", "a BF16 or F8_E4M3 index-key cache");
}

}  // namespace
}  // namespace tetra::ops::cuda

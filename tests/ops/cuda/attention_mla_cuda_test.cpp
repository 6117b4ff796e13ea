// Timing of the CUDA MLA attention and DSA select at GLM-5's and DeepSeek-V3's shapes
// (reported, never asserted; their correctness is backend_parity_test's). Each case fills a
// latent cache with random BF16 rows (or E4M3 ones: --kv-cache-dtype fp8_e4m3), scatters its sequences' blocks, and prints the median
// (min-max) of 20 replays of a CUDA graph of the op, per call, with the bytes the kernel must
// read per second: the latent rows of every key each token attends (or of the keys the DSA
// chose), and for DSA the index keys it scores. Caches small enough for L2 are rotated.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/attention_mla.h"
#include "cuda_test_util.h"

namespace tetra::ops::cuda {
namespace {

using testing_util::DevBuf;
using testing_util::have_gpu;

constexpr int kBlockSize = 64;

int sm_count() {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
  return n;
}

// B decode tokens, each the last of a sequence of `context` keys, blocks shuffled.
struct DecodeBatch {
  int n_seqs, context, mbps;
  std::vector<int32_t> positions, seq_starts, tables;
  int64_t n_blocks;

  DecodeBatch(int b, int ctx) : n_seqs(b), context(ctx), mbps((ctx + kBlockSize - 1) / kBlockSize) {
    n_blocks = int64_t(b) * mbps;
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    tables = perm;
    for (int s = 0; s < b; ++s) {
      positions.push_back(ctx - 1);
      seq_starts.push_back(s);
    }
    seq_starts.push_back(b);
  }
};

template <class T>
T* upload(DevBuf& buf, const std::vector<T>& host) {
  EXPECT_EQ(cudaMemcpy(buf.p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return buf.as<T>();
}

// Uniform in [-1, 1) from xorshift64: hundreds of millions of values in about a second.
std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = f32_to_bf16(float(int64_t(x >> 40) - (1 << 23)) * 0x1p-23f);
  }
  return v;
}

// Random E4M3 bytes of values in [-1, 1]: a random bf16's value rounded, so no NaN.
std::vector<uint8_t> random_e4m3(int64_t n, uint64_t seed) {
  const std::vector<uint16_t> v = random_bf16(n, seed);
  std::vector<uint8_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_e4m3(bf16_to_f32(v[i]));
  return out;
}

// The cache rows of `values` values on the device: BF16, or E4M3 when fp8.
std::unique_ptr<DevBuf> random_cache(int64_t values, bool fp8, uint64_t seed) {
  auto buf = std::make_unique<DevBuf>(size_t(values) * (fp8 ? 1 : 2));
  if (fp8) upload(*buf, random_e4m3(values, seed));
  else upload(*buf, random_bf16(values, seed));
  return buf;
}

// Copies of a kernel's big input to rotate through, so that no call finds its data in the
// 60 MB L2 left by the call before (a decode step streams gigabytes between two layers).
int copies_for(int64_t bytes) { return int(std::clamp<int64_t>((int64_t(160) << 20) / std::max<int64_t>(bytes, 1) + 1, 1, 16)); }

struct Timing { double median, min, max; };

// The calls (call(stream, i) for i < n_calls) captured in one CUDA graph, as a decode step runs
// them, and replayed back to back: the median, min and max of 20 replays, per call.
Timing graph_us(int n_calls, const std::function<void(cudaStream_t, int)>& call) {
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  call(stream, 0);  // once eagerly: first-call setup (kernel attributes) stays out of the capture
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (int i = 0; i < n_calls; ++i) call(stream, i);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);
  std::vector<double> us;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    us.push_back(ms * 1e3 / n_calls);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back()};
}

// Calls a graph holds: enough to hide one graph launch, at least one per copy.
constexpr int kMinCalls = 8;

void time_mla(const char* name, int heads, int b, int ctx, int top_k, bool fp8 = false) {
  constexpr int kRank = 512, kRope = 64;
  const DecodeBatch batch(b, ctx);
  const int64_t cache_values = batch.n_blocks * kBlockSize * (kRank + kRope), value_bytes = fp8 ? 1 : 2;
  std::vector<std::unique_ptr<DevBuf>> caches(size_t(copies_for(cache_values * value_bytes)));
  for (size_t c = 0; c < caches.size(); ++c) caches[c] = random_cache(cache_values, fp8, 1 + c);
  DevBuf ql(size_t(b) * heads * kRank * 2), qr(size_t(b) * heads * kRope * 2), out(size_t(b) * heads * kRank * 2);
  DevBuf pos(size_t(b) * 4), starts(size_t(b + 1) * 4), tables(batch.tables.size() * 4), sel(size_t(b) * std::max(top_k, 1) * 4);
  MlaAttentionParams p{};
  p.q_latent = upload(ql, random_bf16(int64_t(b) * heads * kRank, 2));
  p.q_rope = upload(qr, random_bf16(int64_t(b) * heads * kRope, 3));
  p.cache = caches[0]->p;
  p.fp8_cache = fp8;
  p.out = out.as<uint16_t>();
  p.positions = upload(pos, batch.positions);
  p.seq_starts = upload(starts, batch.seq_starts);
  p.block_tables = upload(tables, batch.tables);
  if (top_k > 0) {
    std::vector<int32_t> chosen;
    std::mt19937 rng(4);
    for (int t = 0; t < b; ++t) {
      std::vector<int32_t> keys(static_cast<size_t>(ctx));
      std::iota(keys.begin(), keys.end(), 0);
      std::shuffle(keys.begin(), keys.end(), rng);
      chosen.insert(chosen.end(), keys.begin(), keys.begin() + top_k);
    }
    p.selected = upload(sel, chosen);
    p.top_k = top_k;
  }
  p.n_tokens = b;
  p.n_seqs = b;
  p.n_heads = heads;
  p.rank = kRank;
  p.d_rope = kRope;
  p.block_size = kBlockSize;
  p.max_blocks_per_seq = batch.mbps;
  p.max_query_len = 1;
  p.scale = 0.05f;
  const int sms = sm_count();
  const MlaAttentionPlan plan = mla_attention_plan(p, sms);
  const int64_t ws_bytes = mla_attention_workspace_bytes(p, sms);
  DevBuf ws(size_t(std::max<int64_t>(ws_bytes, 1)));
  const int n_copies = int(caches.size());
  const Timing t = graph_us(std::max(kMinCalls, n_copies), [&](cudaStream_t s, int i) {
    MlaAttentionParams pi = p;
    pi.cache = caches[size_t(i % n_copies)]->p;
    mla_attention({.stream = s}, pi, ws.p, ws_bytes, sms);
  });
  const double us = t.median;
  const double keys = double(b) * (top_k > 0 ? top_k : ctx);
  const double bytes = keys * (kRank + kRope) * double(value_bytes);
  const double flops = keys * heads * 2.0 * (kRank + kRope + kRank);
  const char* path = plan.path == MlaAttentionPath::Wgmma ? (plan.cluster_merge ? "wgmma+cluster" : "wgmma")
                     : plan.path == MlaAttentionPath::Tiled ? "tiled" : "fallback";
  std::printf("[mla timing] %-28s %s heads %3d %-13s splits %3d: %8.1f us (%.1f-%.1f), %5.0f GB/s of latent read, %5.1f TFLOP/s\n",
              name, fp8 ? "fp8 " : "bf16", heads, path, plan.n_splits, us, t.min, t.max, bytes / us * 1e-3,
              flops / us * 1e-6);
}

void time_dsa(const char* name, int b, int ctx, bool fp8 = false) {
  constexpr int kHeads = 32, kDim = 128, kTopK = 2048;
  const DecodeBatch batch(b, ctx);
  const int64_t key_values = batch.n_blocks * kBlockSize * kDim, value_bytes = fp8 ? 1 : 2;
  std::vector<std::unique_ptr<DevBuf>> keys(size_t(copies_for(key_values * value_bytes)));
  for (size_t c = 0; c < keys.size(); ++c) keys[c] = random_cache(key_values, fp8, 6 + c);
  DevBuf q(size_t(b) * kHeads * kDim * 2);
  DevBuf w(size_t(b) * kHeads * 4), sel(size_t(b) * kTopK * 4);
  DevBuf pos(size_t(b) * 4), starts(size_t(b + 1) * 4), tables(batch.tables.size() * 4);
  std::vector<float> weights(size_t(b) * kHeads);
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& x : weights) x = d(rng);
  DsaSelectParams p{};
  p.index_k = keys[0]->p;
  p.fp8_keys = fp8;
  p.q = upload(q, random_bf16(int64_t(b) * kHeads * kDim, 7));
  p.weights = upload(w, weights);
  p.selected = sel.as<int32_t>();
  p.positions = upload(pos, batch.positions);
  p.seq_starts = upload(starts, batch.seq_starts);
  p.block_tables = upload(tables, batch.tables);
  p.n_tokens = b;
  p.n_seqs = b;
  p.n_heads = kHeads;
  p.dim = kDim;
  p.top_k = kTopK;
  p.block_size = kBlockSize;
  p.max_blocks_per_seq = batch.mbps;
  p.q_scale = 1.0f / std::sqrt(float(kDim));
  p.weight_scale = 1.0f / std::sqrt(float(kHeads));
  const int64_t ws_bytes = dsa_select_workspace_bytes(p);
  DevBuf ws{size_t(ws_bytes)};
  const int n_copies = int(keys.size());
  const Timing t = graph_us(std::max(kMinCalls, n_copies), [&](cudaStream_t s, int i) {
    DsaSelectParams pi = p;
    pi.index_k = keys[size_t(i % n_copies)]->p;
    dsa_select({.stream = s}, pi, ws.p, ws_bytes);
  });
  const double us = t.median;
  const double bytes = double(b) * ctx * kDim * double(value_bytes);
  std::printf("[dsa timing] %-28s %s %8.1f us (%.1f-%.1f; %.2f us a token), %5.0f GB/s of index keys read\n", name,
              fp8 ? "fp8 " : "bf16", us, t.min, t.max, us / b, bytes / us * 1e-3);
}

TEST(MlaCudaTiming, Glm5Decode) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  time_mla("glm5 B=1 ctx=4096", 64, 1, 4096, 0);
  time_mla("glm5 B=1 ctx=32768", 64, 1, 32768, 0);
  time_mla("glm5 B=1 ctx=131072", 64, 1, 131072, 0);
  time_mla("glm5 B=16 ctx=4096", 64, 16, 4096, 0);
  time_mla("glm5 B=64 ctx=4096", 64, 64, 4096, 0);
  time_mla("glm5 B=16 ctx=32768", 64, 16, 32768, 0);
  time_mla("glm5 B=64 ctx=8192 top 2048", 64, 64, 8192, 2048);
  time_mla("deepseek B=64 ctx=4096", 128, 64, 4096, 0);
  // An E4M3 cache: half the bytes, one widening pass a tile.
  time_mla("glm5 B=1 ctx=32768", 64, 1, 32768, 0, true);
  time_mla("glm5 B=64 ctx=4096", 64, 64, 4096, 0, true);
  time_mla("glm5 B=64 ctx=8192 top 2048", 64, 64, 8192, 2048, true);
  time_mla("narrow B=1 ctx=32768", 16, 1, 32768, 0, false);
  time_mla("narrow B=1 ctx=32768", 16, 1, 32768, 0, true);
}

TEST(MlaCudaTiming, DsaSelect) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  time_dsa("B=1 ctx=32768", 1, 32768);
  time_dsa("B=64 ctx=4096", 64, 4096);
  time_dsa("B=64 ctx=32768", 64, 32768);
  time_dsa("B=1 ctx=131072", 1, 131072);
  time_dsa("B=16 ctx=131072", 16, 131072);
  time_dsa("B=64 ctx=32768", 64, 32768, true);
  time_dsa("B=16 ctx=131072", 16, 131072, true);
}

}  // namespace
}  // namespace tetra::ops::cuda

#include "bench/collective_bench.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/graph_timing.h"
#include "core/error.h"
#include "ops/communicator.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/device_props.h"
#include "ops/cuda/peer_all_reduce.h"
#include "ops/ops.h"
#include "parallel/cuda_peer_communicator.h"
#include "parallel/rank_threads.h"
#ifdef TETRA_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace tetra::bench {
namespace {

// One rank: its backend (stream, PDL) and its communicators.
struct Rank {
  std::unique_ptr<ops::Backend> backend;
  ops::Context ctx;
  std::unique_ptr<ops::Communicator> peer, nccl;
};

// A rank's tensors for one size: the partial sum, the residual, the norm's weight and output.
struct Tensors {
  std::unique_ptr<ops::Buffer> delta, h, weight, out;
};

enum class Method { Fused, PeerThenNorm, NcclThenNorm, NormAlone };
const char* method_name(Method m) {
  switch (m) {
    case Method::Fused: return "peer fused";
    case Method::PeerThenNorm: return "peer + norm";
    case Method::NcclThenNorm: return "nccl + norm";
    default: return "norm alone";
  }
}

void enqueue(Method m, Rank& r, const Tensors& t) {
  const TensorView delta = t.delta->view(), h = t.h->view(), w = t.weight->view(), out = t.out->view();
  switch (m) {
    case Method::Fused:
      TETRA_CHECK(r.peer->all_reduce_sum_add_rms_norm(r.ctx, delta, h, w, 1e-6f, out),
                  "the peer communicator did not fuse a ", delta.shape.str(), " sum");
      return;
    case Method::PeerThenNorm: r.peer->all_reduce_sum(r.ctx, delta); break;
    case Method::NcclThenNorm: r.nccl->all_reduce_sum(r.ctx, delta); break;
    case Method::NormAlone: break;
  }
  r.backend->add_rms_norm(r.ctx, h, delta, w, 1e-6f, out);
}

}  // namespace

int run_collective_bench(const CollectiveBenchOptions& opt) {
  TETRA_CHECK(opt.ranks >= 2 && opt.ranks <= 8, "--ranks takes 2 to 8, not ", opt.ranks);
  TETRA_CHECK(!opt.tokens.empty() && !opt.hidden.empty(), "no sizes to measure");
  for (int t : opt.tokens) TETRA_CHECK(t >= 1 && t <= 4096, "token counts must be in 1..4096");
  for (int d : opt.hidden) TETRA_CHECK(d >= 512 && d <= 8192, "hidden sizes must be in 512..8192");
  if (!ops::cuda::cuda_device_present()) {
    std::fprintf(stderr, "tetra bench collective: no CUDA device is visible\n");
    return 1;
  }
  int gpus = 0;
  TETRA_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  std::vector<int> devices;
  for (int r = 0; r < opt.ranks; ++r) devices.push_back(gpus >= opt.ranks ? r : 0);
  const bool shared = gpus < opt.ranks;

  std::vector<Rank> ranks(static_cast<size_t>(opt.ranks));
  auto peers = parallel::make_cuda_peer_communicators(devices);
  std::vector<std::unique_ptr<ops::Communicator>> nccls;
  std::string nccl_note = shared ? "ranks share a GPU" : "this build has no NCCL";
#ifdef TETRA_HAVE_NCCL
  if (!shared) {
    std::string why_not;
    if (parallel::nccl_loads(&why_not, &nccl_note)) nccls = parallel::make_nccl_communicators(devices);
    else nccl_note = why_not;
  }
#endif
  for (int r = 0; r < opt.ranks; ++r) {
    Rank& k = ranks[size_t(r)];
    k.backend = ops::make_backend({.device = "cuda", .device_index = devices[size_t(r)]});
    k.ctx = k.backend->context();
    k.peer = std::move(peers[size_t(r)]);
    if (!nccls.empty()) k.nccl = std::move(nccls[size_t(r)]);
  }
  parallel::RankThreads threads(opt.ranks, [&](const std::string& why) {
    for (Rank& k : ranks) {
      k.peer->abort(why);
      if (k.nccl) k.nccl->abort(why);
    }
  });

  const ops::DeviceProps props = ops::cuda::device_props(0);
  nlohmann::json rows = nlohmann::json::array();
  if (!opt.json) {
    std::printf("tetra bench collective on %d x %s, %d ranks (%s): the all-reduce of a [tokens, hidden] BF16 "
                "partial sum, then h += sum and RMSNorm; us a collective, graphs of %d, median of %d replays; "
                "NCCL: %s\n",
                shared ? 1 : opt.ranks, props.name.c_str(), opt.ranks,
                shared ? "all on GPU 0: no link, only the kernels and the flags" : "one a GPU", opt.reps, opt.iters,
                nccl_note.c_str());
    std::printf("%6s %6s %10s %-12s %9s %9s %9s\n", "tokens", "hidden", "bytes", "method", "us(med)", "us(min)",
                "us(max)");
  }
  for (int d : opt.hidden)
    for (int t : opt.tokens) {
      const Shape shape{t, d};
      // The fused kernel takes a row a block; more rows go to the sum and the norm apart.
      std::vector<Method> methods{Method::PeerThenNorm, Method::NormAlone};
      if (t <= ops::cuda::kPeerBlocks) methods.insert(methods.begin(), Method::Fused);
      if (ranks[0].nccl) methods.insert(methods.end() - 1, Method::NcclThenNorm);
      std::vector<Tensors> tensors(static_cast<size_t>(opt.ranks));
      // graphs[m][r]: method m's graph on rank r (one, as time_graphs takes them).
      std::vector<std::vector<std::vector<std::unique_ptr<Graph>>>> graphs(methods.size());
      for (auto& g : graphs) g.resize(static_cast<size_t>(opt.ranks));
      threads.run([&](int r) {
        Rank& k = ranks[size_t(r)];
        k.backend->make_current();
        Tensors& x = tensors[size_t(r)];
        for (auto* b : {&x.delta, &x.h, &x.out}) {
          *b = k.backend->alloc(DType::BF16, shape);
          TETRA_CUDA_CHECK(cudaMemset((*b)->view().data, 0, size_t((*b)->view().nbytes())));
        }
        x.weight = k.backend->alloc(DType::BF16, {d});
        TETRA_CUDA_CHECK(cudaMemset(x.weight->view().data, 0, size_t(d) * 2));
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      });
      // Captured once every rank's tensors are set: no device-wide call may meet a capture.
      threads.run([&](int r) {
        Rank& k = ranks[size_t(r)];
        const Tensors& x = tensors[size_t(r)];
        const auto stream = static_cast<cudaStream_t>(k.ctx.stream);
        for (size_t m = 0; m < methods.size(); ++m)
          graphs[m][size_t(r)].push_back(capture(stream, [&] {
            for (int i = 0; i < opt.reps; ++i) enqueue(methods[m], k, x);
          }));
      });
      for (size_t m = 0; m < methods.size(); ++m) {
        // Every rank replays its graph as often; rank 0's replays are timed.
        Stats st;
        threads.run([&](int r) {
          const auto stream = static_cast<cudaStream_t>(ranks[size_t(r)].ctx.stream);
          if (r == 0) {
            st = time_graphs(stream, graphs[m][0], opt.iters);
          } else {
            for (int i = 0; i < opt.iters + 2; ++i)
              TETRA_CUDA_CHECK(cudaGraphLaunch(graphs[m][size_t(r)].front()->exec, stream));
            TETRA_CUDA_CHECK(cudaStreamSynchronize(stream));
          }
        });
        st.median_us /= opt.reps, st.min_us /= opt.reps, st.max_us /= opt.reps;
        const int64_t bytes = int64_t(t) * d * 2;
        if (opt.json)
          rows.push_back({{"tokens", t}, {"hidden", d}, {"bytes", bytes}, {"method", method_name(methods[m])},
                          {"median_us", st.median_us}, {"min_us", st.min_us}, {"max_us", st.max_us}});
        else
          std::printf("%6d %6d %10lld %-12s %9.2f %9.2f %9.2f\n", t, d, static_cast<long long>(bytes),
                      method_name(methods[m]), st.median_us, st.min_us, st.max_us);
      }
      graphs.clear();
      threads.run([&](int r) {
        ranks[size_t(r)].backend->make_current();
        tensors[size_t(r)] = {};
      });
    }
  if (opt.json)
    std::printf("%s\n", nlohmann::json{{"bench", "collective"},
                                       {"device", props.name},
                                       {"ranks", opt.ranks},
                                       {"shared_gpu", shared},
                                       {"nccl", nccl_note},
                                       {"rows", rows}}
                            .dump(1)
                            .c_str());
  return 0;
}

}  // namespace tetra::bench

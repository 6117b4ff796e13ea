#include "runtime/ranks.h"

#include <algorithm>
#include <set>
#include <thread>

#include "core/log.h"
#include "parallel/cpu_communicator.h"
#include "parallel/tcp_communicator.h"
#ifdef TETRA_HAVE_CUDA_COMMUNICATOR
#include "parallel/cuda_devices.h"
#include "parallel/cuda_peer_communicator.h"
#endif
#ifdef TETRA_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace tetra::runtime {

ModelRanks::ModelRanks(model::Model& model, ops::Backend& backend)
    : backends_{&backend}, models_{&model} {}

ModelRanks::ModelRanks(std::vector<std::unique_ptr<ops::Backend>> backends,
                       std::vector<std::unique_ptr<model::Model>> models,
                       std::vector<std::unique_ptr<ops::Communicator>> comms,
                       std::unique_ptr<parallel::NodeGroup> nodes, int first_rank)
    : nodes_(std::move(nodes)), first_rank_(first_rank), own_backends_(std::move(backends)),
      own_models_(std::move(models)), comms_(std::move(comms)) {
  TETRA_CHECK(!own_models_.empty() && own_models_.size() == own_backends_.size() &&
                  (comms_.empty() ? own_models_.size() == 1 && !nodes_ : comms_.size() == own_models_.size()),
              "model ranks need a backend, a model and (with more than one) a communicator each");
  for (auto& b : own_backends_) backends_.push_back(b.get());
  for (auto& m : own_models_) models_.push_back(m.get());
  TETRA_CHECK(nodes_ ? first_rank_ == nodes_->node_rank() * size() : first_rank_ == 0,
              "a node's ranks start at its node rank times the ranks a node");
  // A node's single rank of several nodes takes the threads too: its failure must end the
  // others' collectives as any rank's does.
  if (size() > 1 || nodes_)
    threads_ = std::make_unique<parallel::RankThreads>(
        size(), [this](const std::string& reason) { abort(reason); }, first_rank_);
  if (nodes_) nodes_->on_abort([this](const std::string& reason) { abort(reason); });
}

ModelRanks::~ModelRanks() {
  threads_.reset();  // before the models the threads' last job may have touched
}

void ModelRanks::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(failure_mu_);
    if (!failure_.empty()) return;
    failure_ = reason.empty() ? "a rank failed" : reason;
  }
  if (nodes_) nodes_->abort(reason);  // first: the other nodes hear the cause before their collectives break
  for (auto& c : comms_) c->abort(reason);
}

std::string ModelRanks::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

void ModelRanks::run(const std::function<void(int)>& fn) {
  if (!threads_) {
    backends_[0]->make_current();
    return fn(0);
  }
  if (const std::string why = failure(); !why.empty()) fail("the ranks stopped after a failure (", why, ")");
  threads_->run([&](int r) {
    backends_[size_t(r)]->make_current();
    fn(r);
  });
}

void ModelRanks::run_step(std::string_view order, const std::function<void(int)>& fn) {
  if (!nodes_ || nodes_->node_rank() != 0) return run(fn);
  nodes_->send_order(order);
  std::exception_ptr first;
  try {
    run(fn);
  } catch (...) {
    first = std::current_exception();
  }
  try {
    nodes_->wait_answers();  // even after a local failure: the answers stay in step
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  if (first) std::rethrow_exception(first);
}

void ModelRanks::each_in_turn(const std::function<void(int)>& fn) const {
  for (int r = 0; r < size(); ++r) {
    backends_[size_t(r)]->make_current();
    fn(r);
  }
  backends_[0]->make_current();
}

std::vector<ops::BackendOptions> rank_backend_options(const ops::BackendOptions& backend,
                                                      const parallel::Parallelism& p,
                                                      const std::vector<int>& cuda_devices, int nnodes) {
  parallel::check_parallelism(p);
  TETRA_CHECK(nnodes >= 1 && p.world() % nnodes == 0, "--nnodes ", nnodes, " must divide the ", p.world(), " ranks");
  const int n = p.world() / nnodes;
  if (n == 1) return {backend};
  std::vector<ops::BackendOptions> each(size_t(n), backend);
  const bool cuda = backend.device == "cuda" || (backend.device == "auto" && ops::cuda_device_available());
  if (!cuda) {
    for (auto& o : each) {
      o.device = "cpu";
      if (o.n_threads == 0) o.n_threads = std::max(1, int(std::thread::hardware_concurrency()) / n);
    }
    return each;
  }
  std::vector<int> devices = cuda_devices;
  if (devices.empty()) {
    const int available = ops::cuda_device_count();
    TETRA_CHECK(backend.device_index >= 0 && backend.device_index + n <= available, "--tp ", p.tp, " --ep ", p.ep,
                nnodes > 1 ? str_cat(" over ", nnodes, " nodes") : "", " runs ", n, " ranks here, one a GPU from cuda:",
                backend.device_index, " on; this machine has ", available, " CUDA device", available == 1 ? "" : "s");
    for (int r = 0; r < n; ++r) devices.push_back(backend.device_index + r);
  }
  TETRA_CHECK(int(devices.size()) == n, n, " CUDA ranks need as many devices, not ", devices.size());
  for (int r = 0; r < n; ++r) {
    each[size_t(r)].device = "cuda";
    each[size_t(r)].device_index = devices[size_t(r)];
  }
  return each;
}

namespace {

// This node's ranks of several nodes: NCCL for GPUs (the peer communicator joins one host's
// GPUs only), TCP for CPU ranks.
std::vector<std::unique_ptr<ops::Communicator>> make_node_communicators(const std::vector<ops::BackendOptions>& each,
                                                                        parallel::NodeGroup& nodes, int first_rank) {
  const int n = int(each.size()), world = n * nodes.nnodes();
  if (each.front().device != "cuda") {
    log_info("ranks ", first_rank, " .. ", first_rank + n - 1, " of ", world, " joined over TCP");
    return parallel::make_tcp_communicators(nodes, first_rank, n, world);
  }
#ifdef TETRA_HAVE_NCCL
  std::vector<int> devices;
  for (const auto& o : each) devices.push_back(o.device_index);
  std::string why_not, nccl;
  TETRA_CHECK(parallel::nccl_loads(&why_not, &nccl), "--nnodes on CUDA needs NCCL: ", why_not);
  log_info("ranks ", first_rank, " .. ", first_rank + n - 1, " of ", world, " joined by ", nccl);
  return parallel::make_nccl_communicators(devices, nodes, first_rank, world);
#else
  fail("--nnodes on CUDA: this build has no NCCL (nccl.h was not found when it was built)");
#endif
}

std::vector<std::unique_ptr<ops::Communicator>> make_communicators(const std::vector<ops::BackendOptions>& each) {
  const int n = int(each.size());
  if (each.front().device != "cuda") return parallel::make_cpu_communicators(n);
  std::vector<int> devices;
  for (const auto& o : each) devices.push_back(o.device_index);
  // Small messages (decode steps) meet through peer memory: one-shot, fused with the norm after
  // them, capturable. Large ones go to NCCL where the GPUs differ and it loads (ranks sharing
  // a GPU, in tests, cannot use NCCL; there the peer communicator takes everything).
  std::vector<std::unique_ptr<ops::Communicator>> large;
  std::string which = "peer memory";
#ifdef TETRA_HAVE_NCCL
  if (std::set<int>(devices.begin(), devices.end()).size() == devices.size()) {
    std::string why_not, nccl;
    if (parallel::nccl_loads(&why_not, &nccl)) {
      large = parallel::make_nccl_communicators(devices);
      which = str_cat("peer memory (messages up to ", parallel::kPeerMessageBytes >> 20, " MiB) and ", nccl);
    } else {
      log_warn(why_not, "; every collective goes through peer memory, which is slower for large ones");
    }
  }
#endif
#ifdef TETRA_HAVE_CUDA_COMMUNICATOR
  if (!parallel::peers_reach_each_other(devices)) {
    TETRA_CHECK(!large.empty(), "the GPUs of these ranks cannot read each other's memory (no peer access), so they "
                "need NCCL (libnccl.so.2, or the file TETRA_NCCL_LIBRARY names)");
    log_info("ranks joined by NCCL alone (no peer access between the GPUs; decode graphs capture NCCL)");
    return large;
  }
  log_info("ranks joined by ", which);
  return parallel::make_cuda_peer_communicators(devices, std::move(large));
#else
  fail("--tp/--ep on CUDA: this build has no communicator for GPUs");
#endif
}

}  // namespace

std::unique_ptr<ModelRanks> load_ranks(const std::filesystem::path& dir, const ops::BackendOptions& backend,
                                       const parallel::Parallelism& p, const model::LoadOptions& options,
                                       std::unique_ptr<ops::Backend> rank0, const std::vector<int>& cuda_devices,
                                       std::unique_ptr<parallel::NodeGroup> nodes) {
  const int nnodes = nodes ? nodes->nnodes() : 1;
  const std::vector<ops::BackendOptions> each = rank_backend_options(backend, p, cuda_devices, nnodes);
  const int n = p.world() / nnodes;
  const int first = nodes ? nodes->node_rank() * n : 0;
  std::vector<std::unique_ptr<ops::Backend>> backends;
  std::vector<std::unique_ptr<model::Model>> models(static_cast<size_t>(n));
  std::vector<std::unique_ptr<ops::Communicator>> comms;
  backends.push_back(rank0 ? std::move(rank0) : ops::make_backend(each[0]));
  if (n == 1 && !nodes) {
    models[0] = model::load_model(dir, *backends[0], options);
    return std::make_unique<ModelRanks>(std::move(backends), std::move(models), std::move(comms));
  }
  for (int r = 1; r < n; ++r) backends.push_back(ops::make_backend(each[size_t(r)]));
  comms = nodes ? make_node_communicators(each, *nodes, first) : make_communicators(each);
  // Every rank loads its shard at once; progress is rank 0's (the others' are alike).
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> loaders;
  for (int r = 0; r < n; ++r)
    loaders.emplace_back([&, r] {
      try {
        model::LoadOptions o = options;
        o.shard = {.rank = first + r, .p = p};
        if (r > 0) o.on_progress = nullptr;
        backends[size_t(r)]->make_current();
        models[size_t(r)] = model::load_model(dir, *backends[size_t(r)], o);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : loaders) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  backends[0]->make_current();  // the caller's thread drives rank 0
  return std::make_unique<ModelRanks>(std::move(backends), std::move(models), std::move(comms), std::move(nodes),
                                      first);
}

RankCaches::RankCaches(const ModelRanks& ranks, int block_size, int64_t n_blocks,
                       std::optional<uint64_t> random_seed) {
  ranks.each_in_turn([&](int r) {
    caches_.push_back(std::make_unique<KvCache>(ranks.backend(r), ranks.model(r).kv_layout(), block_size, n_blocks,
                                                random_seed));
  });
}

RankSteps::RankSteps(ModelRanks& ranks, int block_size, StepCapacity capacity) : ranks_(ranks) {
  ranks.each_in_turn([&](int r) {
    State s;
    s.arena = std::make_unique<ops::Arena>(ranks.backend(r));
    s.builder = std::make_unique<StepBuilder>(ranks.backend(r), block_size, capacity);
    s.ctx = ranks.backend(r).context();
    s.ctx.arena = s.arena.get();
    s.ctx.comm = ranks.comm(r);
    ranks_state_.push_back(std::move(s));
  });
}

RankSteps::~RankSteps() = default;

void RankSteps::freeze() {
  // Freezing may replace an arena's chunks with one: each rank's on its own device.
  ranks_.each_in_turn([&](int r) { ranks_state_[size_t(r)].arena->freeze(); });
}

void RankSteps::forward(const std::vector<SeqChunk>& chunks, const RankCaches& caches, TensorView logits,
                        const std::function<void(model::StepInputs&)>& prepare) {
  ranks_.run([&](int r) { forward_rank(r, chunks, caches, logits, prepare); });
}

void RankSteps::forward_rank(int r, const std::vector<SeqChunk>& chunks, const RankCaches& caches, TensorView logits,
                             const std::function<void(model::StepInputs&)>& prepare) {
  State& s = ranks_state_[size_t(r)];
  s.arena->reset();
  model::StepInputs in = s.builder->build(s.ctx, chunks);
  if (prepare) prepare(in);
  ranks_.model(r).forward(s.ctx, in, caches.layers(r), ranks_.global_rank(r) == 0 ? logits : TensorView{});
}

}  // namespace tetra::runtime

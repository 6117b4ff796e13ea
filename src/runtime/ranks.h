// The ranks one model runs on under --tp/--ep: a backend and a model shard each (what a rank
// holds: parallel/sharding.h), joined by communicators, each driven by a thread of its own so
// their forwards meet in the collectives. One rank is the plain case: the caller's model and
// backend, run on the caller's thread, no communicator. The scheduler, the block manager and
// the sampler stay single: every rank runs the same step over the same block tables, and the
// tokens are sampled from rank 0's logits.
//
// Over several nodes (--nnodes; parallel/node_group.h) a ModelRanks holds this node's ranks,
// global ranks first_rank() on. Every node builds the same things in the same order (each
// run() is matched by one on every node, so their collectives meet); steps go from node 0 to
// the others through run_step, and the other nodes take them in Engine::follow.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "ops/communicator.h"
#include "ops/ops.h"
#include "parallel/node_group.h"
#include "parallel/rank_threads.h"
#include "parallel/sharding.h"
#include "runtime/kv_cache.h"
#include "runtime/step_builder.h"

namespace tetra::runtime {

class ModelRanks {
 public:
  // One rank: the caller's model and backend.
  ModelRanks(model::Model& model, ops::Backend& backend);
  // Rank i holds models[i] on backends[i] and talks through comms[i]; this object owns them.
  // With `nodes` they are this node's ranks, global ranks first_rank on.
  ModelRanks(std::vector<std::unique_ptr<ops::Backend>> backends,
             std::vector<std::unique_ptr<model::Model>> models,
             std::vector<std::unique_ptr<ops::Communicator>> comms,
             std::unique_ptr<parallel::NodeGroup> nodes = nullptr, int first_rank = 0);
  ~ModelRanks();

  int size() const { return int(models_.size()); }  // this node's ranks
  int world() const { return nodes_ ? size() * nodes_->nnodes() : size(); }
  int first_rank() const { return first_rank_; }
  int global_rank(int rank) const { return first_rank_ + rank; }
  bool holds_rank0() const { return first_rank_ == 0; }  // node 0: the logits, the sampler
  parallel::NodeGroup* nodes() const { return nodes_.get(); }
  model::Model& model(int rank = 0) const { return *models_[size_t(rank)]; }
  ops::Backend& backend(int rank = 0) const { return *backends_[size_t(rank)]; }
  ops::Communicator* comm(int rank) const { return comms_.empty() ? nullptr : comms_[size_t(rank)].get(); }

  // fn(rank) on every rank at once (rank 0 on this thread); returns when all have. A rank
  // that throws aborts the communicators, so a rank waiting in a collective throws too and
  // none hangs; the first failure is rethrown here. A failed rank is the end of the group:
  // every later run throws at once (a graph's collectives, replayed without the host, would
  // otherwise run on an aborted group).
  void run(const std::function<void(int rank)>& fn);
  // A step: on node 0 with other nodes, `order` goes to them (they run it in Engine::follow)
  // while fn runs here, and their answers are awaited; the first failure is rethrown.
  // Anywhere else it is run(fn).
  void run_step(std::string_view order, const std::function<void(int rank)>& fn);
  // Ends the group (every rank's communicator, every node): the run in progress and every
  // later one throw with `reason`. The first reason stays.
  void abort(const std::string& reason);
  std::string failure() const;  // why the group ended; empty while it stands
  // fn(rank) for each rank in turn on this thread, with that rank's device current; rank 0's is
  // current again after (for building what each rank holds: caches, arenas).
  void each_in_turn(const std::function<void(int rank)>& fn) const;

 private:
  std::unique_ptr<parallel::NodeGroup> nodes_;  // destroyed last: node 0 tells the others to stop
  int first_rank_ = 0;
  std::vector<std::unique_ptr<ops::Backend>> own_backends_;
  std::vector<std::unique_ptr<model::Model>> own_models_;
  std::vector<std::unique_ptr<ops::Communicator>> comms_;
  std::vector<ops::Backend*> backends_;
  std::vector<model::Model*> models_;
  std::unique_ptr<parallel::RankThreads> threads_;  // null with one rank on one node
  mutable std::mutex failure_mu_;
  std::string failure_;  // why the group was aborted; empty while it stands
};

// The backend options of each of p.world() ranks. CPU ranks share out the CPU threads (where
// not given). CUDA ranks run on the GPUs `cuda_devices` lists, or where it is empty on one GPU
// each from backend.device_index on (--device cuda:N); too few GPUs is one sentence, thrown.
// A GPU listed twice holds two ranks: for testing the sharded kernels on one GPU.
// With nnodes, this node's p.world() / nnodes ranks.
std::vector<ops::BackendOptions> rank_backend_options(const ops::BackendOptions& backend,
                                                      const parallel::Parallelism& p,
                                                      const std::vector<int>& cuda_devices = {}, int nnodes = 1);

// Loads `dir` on p.world() ranks, each its own backend (rank_backend_options; rank 0's may be
// given, made earlier from rank_backend_options(...)[0]) holding its shard; the ranks load at
// once. CUDA ranks meet through peer memory (parallel/cuda_peer_communicator.h), with NCCL for
// large messages where the GPUs differ and libnccl loads. With `nodes` (joined, several) this
// node's share of the ranks is loaded; CUDA ranks then meet through NCCL alone, CPU ranks
// through TCP (parallel/tcp_communicator.h).
std::unique_ptr<ModelRanks> load_ranks(const std::filesystem::path& dir, const ops::BackendOptions& backend,
                                       const parallel::Parallelism& p, const model::LoadOptions& options,
                                       std::unique_ptr<ops::Backend> rank0 = nullptr,
                                       const std::vector<int>& cuda_devices = {},
                                       std::unique_ptr<parallel::NodeGroup> nodes = nullptr);

// The KV cache of every rank, each holding its own heads (MLA's latent whole on every rank),
// one block numbering for all.
class RankCaches {
 public:
  // random_seed: see KvCache (benchmarks only).
  RankCaches(const ModelRanks& ranks, int block_size, int64_t n_blocks,
             std::optional<uint64_t> random_seed = std::nullopt);
  int block_size() const { return caches_.front()->block_size(); }
  int64_t n_blocks() const { return caches_.front()->n_blocks(); }
  const std::vector<ops::KvCacheLayer>& layers(int rank = 0) const { return caches_[size_t(rank)]->layers(); }

 private:
  std::vector<std::unique_ptr<KvCache>> caches_;
};

// Each rank's step arena, step builder and context (carrying its arena and communicator).
class RankSteps {
 public:
  RankSteps(ModelRanks& ranks, int block_size, StepCapacity capacity);
  ~RankSteps();

  ops::Arena& arena(int rank = 0) { return *ranks_state_[size_t(rank)].arena; }
  const ops::Context& context(int rank = 0) const { return ranks_state_[size_t(rank)].ctx; }
  StepBuilder& builder(int rank = 0) { return *ranks_state_[size_t(rank)].builder; }
  void freeze();  // every rank's arena

  // Every rank's forward over the same chunks (arenas reset first); rank 0 writes the logits
  // (on its device), the others none. `prepare` may adjust a rank's inputs before its
  // forward (the measuring pass plans for the longest context).
  void forward(const std::vector<SeqChunk>& chunks, const RankCaches& caches, TensorView logits,
               const std::function<void(model::StepInputs&)>& prepare = {});
  // One rank's part of forward(), on that rank's thread (inside ModelRanks::run).
  void forward_rank(int rank, const std::vector<SeqChunk>& chunks, const RankCaches& caches, TensorView logits,
                    const std::function<void(model::StepInputs&)>& prepare = {});

 private:
  struct State {
    std::unique_ptr<ops::Arena> arena;
    std::unique_ptr<StepBuilder> builder;
    ops::Context ctx;
  };
  ModelRanks& ranks_;
  std::vector<State> ranks_state_;
};

}  // namespace tetra::runtime

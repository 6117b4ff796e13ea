#include "runtime/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <span>
#include <sstream>

#include "formats/safetensors.h"
#include "model/model.h"
#include "ops/forwarding_backend.h"
#include "ops/ops.h"
#include "runtime/kv_cache.h"
#include "runtime/step_runner.h"

namespace tetra::runtime {
namespace {

namespace fs = std::filesystem;
using ops::Backend;
using ops::Context;
using ops::LinearWeight;
using ops::MlpWeights;
using ops::MoeExperts;

// max |x| of an activation tensor (F32, BF16 or F16), copied to the host first.
float activation_amax(Backend& backend, TensorView x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0f;
  std::vector<uint8_t> raw(static_cast<size_t>(x.nbytes()));
  backend.copy_to_host(raw.data(), x);
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    switch (x.dtype) {
      case DType::F32: v = reinterpret_cast<const float*>(raw.data())[i]; break;
      case DType::BF16: v = bf16_to_f32(reinterpret_cast<const uint16_t*>(raw.data())[i]); break;
      case DType::F16: v = f16_to_f32(reinterpret_cast<const uint16_t*>(raw.data())[i]); break;
      default: fail("calibration reads F32, BF16 or F16 activations, not ", dtype_name(x.dtype));
    }
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

// Experts as the inner backend prepared them, plus the weights, for the calibration pass.
class CalibExperts : public MoeExperts {
 public:
  CalibExperts(std::unique_ptr<MoeExperts> inner, std::vector<MlpWeights> weights)
      : inner_(std::move(inner)), weights_(std::move(weights)) {}
  int64_t n_experts() const override { return inner_->n_experts(); }
  const MoeExperts& inner() const { return *inner_; }
  const std::vector<MlpWeights>& weights() const { return weights_; }

 private:
  std::unique_ptr<MoeExperts> inner_;
  std::vector<MlpWeights> weights_;
};

// Forwards every call to the inner backend and records, per weight (keyed by the address of
// its data), the largest |input| any linear or expert MLP received.
class CalibratingBackend : public ops::ForwardingBackend {
 public:
  explicit CalibratingBackend(std::unique_ptr<Backend> inner)
      : ForwardingBackend(*inner), owned_(std::move(inner)) {}
  const std::map<const void*, float>& amax() const { return amax_; }

  std::string name() const override { return owned_->name() + " (calibrating)"; }
  std::unique_ptr<MoeExperts> prepare_experts(const std::vector<MlpWeights>& experts,
                                              const MlpWeights* shared) override {
    // The shared expert sees every token, as ModelOpt calibrates it: one more expert here.
    std::vector<MlpWeights> all = experts;
    if (shared) all.push_back(*shared);
    return std::make_unique<CalibExperts>(inner().prepare_experts(experts, shared), std::move(all));
  }
  std::unique_ptr<ops::Buffer> random_tensor(DType, Shape, const ops::RandomFill&, uint64_t) override {
    fail("calibration reads a checkpoint; it cannot run on dummy weights");
  }
  std::unique_ptr<MoeExperts> random_experts(const ops::ExpertsSpec&, uint64_t) override {
    fail("calibration reads a checkpoint; it cannot run on dummy weights");
  }
  void linear(const Context& c, TensorView x, const LinearWeight& w, TensorView out) override {
    record(w, activation_amax(inner(), x));
    inner().linear(c, x, w, out);
  }
  void linears(const Context& c, TensorView x, std::span<const ops::LinearPart> parts) override {
    for (const ops::LinearPart& p : parts) linear(c, x, *p.weight, p.out);  // each one recorded
  }
  void moe_experts(const Context& c, TensorView x, TensorView ids, TensorView weights,
                   const MoeExperts& experts, TensorView out) override {
    const auto& ce = static_cast<const CalibExperts&>(experts);
    // ModelOpt's calibration sends every token to every expert: gate and up all see x, and
    // each expert's down_proj sees silu(x Wg^T) * (x Wu^T) for every token.
    const float x_amax = activation_amax(inner(), x);
    const int64_t n_tokens = x.dim(0);
    for (const MlpWeights& e : ce.weights()) {
      record(e.gate, x_amax);
      record(e.up, x_amax);
      const TensorView g = c.arena->alloc(inner().activation_dtype(), {n_tokens, e.gate.n_out});
      const TensorView u = c.arena->alloc(inner().activation_dtype(), {n_tokens, e.up.n_out});
      inner().linear(c, x, e.gate, g);
      inner().linear(c, x, e.up, u);
      inner().silu_mul(c, g, u, g);
      record(e.down, activation_amax(inner(), g));
    }
    inner().moe_experts(c, x, ids, weights, ce.inner(), out);
  }

 private:
  void record(const LinearWeight& w, float a) {
    float& slot = amax_[w.weight.data];
    slot = std::max(slot, a);
  }

  std::unique_ptr<Backend> owned_;
  std::map<const void*, float> amax_;
};

// Which checkpoint tensor a weight address belongs to. The CPU backend keeps views of the
// model's own mapping of the safetensors files, which this process sees in /proc/self/maps:
// address -> (file, file offset) -> the tensor whose data starts there.
class AddressNames {
 public:
  explicit AddressNames(const fs::path& dir) {
    auto ckpt = Checkpoint::open(dir);
    std::map<std::string, uint64_t> data_offset;  // canonical file -> start of its data
    for (const std::string& name : ckpt->names()) {
      const std::string file = fs::canonical(ckpt->file_of(name)).string();
      if (!data_offset.count(file))
        data_offset[file] = SafetensorsFile::open(file)->data_offset();
      names_[{file, data_offset[file] + ckpt->find(name)->begin}] = name;
    }
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      std::istringstream in(line);
      std::string range, perms, offset, dev, inode, path;
      in >> range >> perms >> offset >> dev >> inode;
      std::getline(in >> std::ws, path);
      if (path.empty() || path[0] != '/') continue;
      const size_t dash = range.find('-');
      Mapping m;
      m.start = std::stoull(range.substr(0, dash), nullptr, 16);
      m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
      m.offset = std::stoull(offset, nullptr, 16);
      m.path = path;
      maps_.push_back(m);
    }
  }

  // The tensor name, or "" when the address is not the start of a tensor in a mapped file.
  std::string name_of(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const Mapping& m : maps_) {
      if (a < m.start || a >= m.end) continue;
      auto it = names_.find({m.path, m.offset + (a - m.start)});
      return it == names_.end() ? "" : it->second;
    }
    return "";
  }

 private:
  struct Mapping {
    uintptr_t start = 0, end = 0;
    uint64_t offset = 0;
    std::string path;
  };
  std::map<std::pair<std::string, uint64_t>, std::string> names_;
  std::vector<Mapping> maps_;
};

}  // namespace

std::map<std::string, float> calibrate_input_amax(const fs::path& model_dir,
                                                  const std::vector<int32_t>& tokens,
                                                  const CalibrateOptions& options) {
  TETRA_CHECK(!tokens.empty(), "the calibration text has no tokens");
  CalibratingBackend backend(ops::make_cpu_backend(options.n_threads));
  auto model = model::load_model(model_dir, backend);
  const ModelConfig& c = model->config();
  for (int32_t t : tokens)
    TETRA_CHECK(t >= 0 && t < c.vocab_size, "calibration token id ", t,
                " is outside the vocabulary of ", c.vocab_size);
  const int64_t window = std::max<int64_t>(1, std::min(options.window, c.max_position_embeddings));
  const int block_size = 16;
  const int64_t n = int64_t(tokens.size());
  auto logits = backend.alloc(DType::F32, {1, c.vocab_size});
  const int64_t max_blocks = (std::min(window, n) + block_size - 1) / block_size;
  StepRunner runner(*model, backend, block_size,
                    {.max_tokens = std::min(window, n), .max_seqs = 1, .max_blocks_per_seq = max_blocks});
  for (int64_t w0 = 0; w0 < n; w0 += window) {
    const int64_t len = std::min(window, n - w0);
    const int64_t n_blocks = (len + block_size - 1) / block_size;
    KvCache cache(backend, model->kv_layout(), block_size, n_blocks);
    std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) blocks[size_t(b)] = int32_t(b);
    const std::span<const int32_t> win(tokens.data() + w0, size_t(len));
    runner.forward({SeqChunk{.tokens = win, .start_position = 0, .blocks = blocks}}, cache.layers(),
                   logits->view());
    if (options.on_progress) options.on_progress(w0 + len, n);
  }
  const AddressNames names(model_dir);
  std::map<std::string, float> out;
  for (const auto& [address, amax] : backend.amax()) {
    const std::string name = names.name_of(address);
    TETRA_CHECK(!name.empty(), model_dir.string(),
                ": calibration could not tell which checkpoint tensor a weight came from "
                "(the backend must keep views of the mapped safetensors files)");
    TETRA_CHECK(name.ends_with(".weight"), model_dir.string(), ": calibrated tensor ", name,
                " is not a linear weight");
    out[name.substr(0, name.size() - 7)] = amax;
  }
  return out;
}

}  // namespace tetra::runtime

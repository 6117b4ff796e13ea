// The feed-forward half of a decoder layer, shared by every family: a dense gated MLP, or a
// routed MoE with an optional shared expert.
#pragma once

#include <memory>

#include "model/weights.h"
#include "ops/ops.h"

namespace tetra::model {

struct FfnLayer {
  bool is_moe = false;
  ops::MlpWeights dense;                     // dense layers
  ops::LinearWeight router;                  // MoE: [E, hidden]
  ops::RoutingSpec routing;
  std::unique_ptr<ops::MoeExperts> experts;  // with the shared expert, when the layer has one
  bool partial = false;  // sharded: each rank's output is its part of the sum, all-reduced
};

// x = the sum of every rank's x (ctx.comm), for the outputs of row-parallel layers.
void all_reduce(const ops::Context& ctx, TensorView x);

// h += delta, then out = rms_norm(h) * weight, where delta is this rank's part of the sum when
// `partial`: the all-reduce and the norm in one step where the communicator fuses them.
void add_rms_norm_of_parts(ops::Backend& backend, const ops::Context& ctx, bool partial, TensorView h,
                           TensorView delta, TensorView weight, float eps, TensorView out);

// Names of one family's FFN tensors under `model.layers.L.`.
struct FfnNames {
  const char* moe_prefix;       // "mlp." or "block_sparse_moe."
  const char* router;           // "gate"
  const char* experts;          // "experts."
  const char* gate;             // "gate_proj" / "w1"
  const char* up;               // "up_proj" / "w3"
  const char* down;             // "down_proj" / "w2"
  const char* shared;           // "shared_experts." or nullptr
};

FfnLayer load_ffn(WeightLoader& loader, const ModelConfig& c, int layer, const FfnNames& names);

// out [T, hidden] = ffn(x [T, hidden]); where ffn.partial, this rank's part of the sum (the
// caller all-reduces it, with the norm after it where it can: add_rms_norm_of_parts).
void run_ffn(ops::Backend& backend, const ops::Context& ctx, const FfnLayer& ffn, TensorView x,
             TensorView out);

}  // namespace tetra::model

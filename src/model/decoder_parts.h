// The parts every decoder family shares: token embeddings, the final norm and the LM head
// (tied to the embeddings or not), and the rotary frequencies on the device.
#pragma once

#include <memory>

#include "model/weights.h"
#include "ops/ops.h"

namespace tetra::model {

struct TokenIo {
  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  ops::LinearWeight lm_head;
};

TokenIo load_token_io(WeightLoader& loader, const ModelConfig& c);

// logits [R, vocab] of the final hidden states h [T, hidden] at `rows` (I32 [R]). The final
// norm is row-wise, so only the rows whose logits are wanted go through it.
void project_logits(ops::Backend& backend, const ops::Context& ctx, const TokenIo& io, float eps,
                    TensorView h, TensorView rows, TensorView logits);

struct DeviceRope {
  std::unique_ptr<ops::Buffer> inv_freq;  // owns spec.inv_freq
  ops::RopeSpec spec;
};

DeviceRope upload_rope(ops::Backend& backend, const RopeConfig& rope);

}  // namespace tetra::model

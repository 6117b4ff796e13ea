// One forward step at a time for the plain loops (generate, evaluate, calibrate, tests): the
// step arena, the step builder and the context they travel in. The serving engine does the
// same with a measured, frozen arena.
#pragma once

#include <vector>

#include "model/model.h"
#include "ops/ops.h"
#include "runtime/step_builder.h"

namespace tetra::runtime {

class StepRunner {
 public:
  StepRunner(model::Model& model, ops::Backend& backend, int block_size, StepCapacity capacity)
      : model_(model), arena_(backend), builder_(backend, block_size, capacity), ctx_(backend.context()) {
    ctx_.arena = &arena_;
  }

  // Runs the chunks through the model; logits F32 [rows wanted, vocab] on the device.
  void forward(const std::vector<SeqChunk>& chunks, const std::vector<ops::KvCacheLayer>& cache,
               TensorView logits) {
    arena_.reset();
    model_.forward(ctx_, builder_.build(ctx_, chunks), cache, logits);
  }

  const ops::Context& context() const { return ctx_; }
  ops::Arena& arena() { return arena_; }

 private:
  model::Model& model_;
  ops::Arena arena_;
  StepBuilder builder_;
  ops::Context ctx_;
};

}  // namespace tetra::runtime

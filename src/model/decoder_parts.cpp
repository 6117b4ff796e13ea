#include "model/decoder_parts.h"

#include "model/rope.h"

namespace tetra::model {

TokenIo load_token_io(WeightLoader& loader, const ModelConfig& c) {
  TokenIo io;
  io.embed = loader.floats("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  io.final_norm = loader.floats("model.norm.weight", {c.hidden_size});
  if (c.tie_word_embeddings) {
    io.lm_head.weight = io.embed;
    io.lm_head.n_out = c.vocab_size;
    io.lm_head.n_in = c.hidden_size;
  } else {
    io.lm_head = loader.linear("lm_head", c.vocab_size, c.hidden_size, false);
  }
  return io;
}

void project_logits(ops::Backend& backend, const ops::Context& ctx, const TokenIo& io, float eps,
                    TensorView h, TensorView rows, TensorView logits) {
  ops::Arena& arena = *ctx.arena;
  TensorView x = arena.alloc(backend.activation_dtype(), {rows.numel(), h.dim(1)});
  backend.gather_rows(ctx, h, rows, x);
  backend.rms_norm(ctx, x, io.final_norm, eps, x);
  backend.linear(ctx, x, io.lm_head, logits);
}

DeviceRope upload_rope(ops::Backend& backend, const RopeConfig& rope) {
  const RopeFrequencies freqs = rope_frequencies(rope);
  DeviceRope r;
  r.inv_freq = backend.alloc(DType::F32, {int64_t(freqs.inv_freq.size())});
  backend.copy_from_host(r.inv_freq->view(), freqs.inv_freq.data());
  r.spec.inv_freq = r.inv_freq->view();
  r.spec.attention_scaling = freqs.attention_scaling;
  r.spec.rotary_dim = rope.rotary_dim;
  r.spec.interleaved = rope.interleaved;
  return r;
}

}  // namespace tetra::model

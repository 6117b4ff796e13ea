#include "parallel/sharding.h"

#include "core/error.h"

namespace tetra::parallel {

void check_parallelism(const Parallelism& p) {
  TETRA_CHECK(p.tp >= 1 && p.ep >= 1, "--tp and --ep must be at least 1, not ", p.tp, " and ", p.ep);
  TETRA_CHECK(p.tp == 1 || p.tp % p.ep == 0, "--ep ", p.ep, " must divide --tp ", p.tp,
              " (or --tp be 1): the MoE layer runs on the tensor-parallel ranks");
}

Range split(int64_t n, int parts, int index, int64_t granule) {
  TETRA_CHECK(parts >= 1 && index >= 0 && index < parts, "split: part ", index, " of ", parts);
  TETRA_CHECK(granule >= 1 && n % granule == 0, "split: ", n, " is not a multiple of ", granule);
  const int64_t units = n / granule, base = units / parts, extra = units % parts;
  const int64_t begin = index * base + (index < extra ? index : extra);
  const int64_t count = base + (index < extra ? 1 : 0);
  return {begin * granule, (begin + count) * granule};
}

HeadShard split_heads(int64_t n_heads, int64_t n_kv_heads, Part tp) {
  const int64_t t = tp.parts;
  TETRA_CHECK(n_heads % t == 0, "--tp ", t, " must divide the model's ", n_heads, " attention heads");
  TETRA_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "the model's ", n_heads,
              " attention heads are not a multiple of its ", n_kv_heads, " KV heads");
  HeadShard s;
  s.n_q = n_heads / t;
  s.q_begin = tp.index * s.n_q;
  if (n_kv_heads % t == 0) {
    s.n_kv = n_kv_heads / t;
    s.kv_begin = tp.index * s.n_kv;
  } else {
    TETRA_CHECK(t % n_kv_heads == 0, "--tp ", t, " must divide the model's ", n_kv_heads,
                " KV heads or be a multiple of them (each KV head then replicated)");
    s.n_kv = 1;
    s.kv_begin = tp.index / (t / n_kv_heads);
  }
  return s;
}

}  // namespace tetra::parallel

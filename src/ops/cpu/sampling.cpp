// The sampling rule on the CPU (the rule itself is written out in sampling.h). Every step is
// O(V) and nothing sorts the vocabulary: top-k and the top logprobs come from a bounded
// selection buffer, top-p from one pass of mass into buckets of (z - max z) / T followed by a
// weighted quickselect inside the one bucket where the nucleus ends, and the draw walks the
// candidates in id order. Each row computes the exps of its raw logits once; a row at
// temperature 1 without penalties reuses them as its weights.
#include "ops/cpu/sampling.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tetra::ops::cpu {
namespace {

using sampling::exp_nonpositive;
using sampling::mass_of;
using sampling::scaled_logit;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A logit and its id, ordered best first: value descending, then id ascending.
struct ScoredId {
  float value;
  int32_t id;
};
bool better(const ScoredId& a, const ScoredId& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

struct ValueMass {
  float value;
  uint64_t mass;
};

// Top-p buckets: (z - max z) / T in steps of 1/4 from 0 down; the last one takes everything
// below -63.75, where no weight survives rounding to 2^-40 anyway.
constexpr int kBucketsPerUnit = 4;
constexpr int kBuckets = 256;

int bucket_of(float scaled) {
  const float s = -scaled * float(kBucketsPerUnit);  // >= 0, since scaled <= 0
  return s < float(kBuckets - 1) ? int(s) : kBuckets - 1;
}

// Buffers reused across rows and calls. Each pool thread keeps its own, so a step allocates
// nothing once they have grown to the vocabulary.
struct RowScratch {
  std::vector<float> penalized;  // [V] the row with penalties applied
  std::vector<ScoredId> best;
  // The candidates after a top-k cut, in id order (C is the whole row otherwise).
  std::vector<int32_t> candidate_id;
  std::vector<float> candidate_z;
  // Per candidate: its weight and, for top-p, its bucket.
  std::vector<uint64_t> candidate_mass;
  std::vector<uint8_t> candidate_bucket;
  std::vector<uint64_t> bucket_mass = std::vector<uint64_t>(kBuckets);
  std::vector<ValueMass> bucket;  // the members of the bucket where the nucleus ends
};

RowScratch& thread_scratch() {
  thread_local RowScratch scratch;
  return scratch;
}

void keep_best(std::vector<ScoredId>& buf, size_t k) {
  std::nth_element(buf.begin(), buf.begin() + ptrdiff_t(k - 1), buf.end(), better);
  buf.resize(k);
}

// Leaves in `buf` the k best of v[0, n) (1 <= k <= n), unordered. Once the buffer has been cut
// back to k, a value enters only if it beats the k-th best (an equal value has a later id, so
// it loses); the cut repeats each time the buffer fills, which keeps the work O(n) for any k.
void select_best(const float* v, int64_t n, int64_t k, std::vector<ScoredId>& buf) {
  const size_t keep = size_t(k);
  const size_t capacity = std::max(2 * keep, keep + 1024);
  buf.clear();
  bool cut = false;
  float kth = kNegInf;
  for (int64_t i = 0; i < n; ++i) {
    if (cut && !(v[i] > kth)) continue;
    buf.push_back({v[i], int32_t(i)});
    if (buf.size() == capacity) {
      keep_best(buf, keep);
      kth = buf[keep - 1].value;
      cut = true;
    }
  }
  if (buf.size() > keep) keep_best(buf, keep);
}

// The k-th largest value of v[0, n), counting multiplicity.
float kth_largest(const float* v, int64_t n, int64_t k, std::vector<ScoredId>& buf) {
  select_best(v, n, k, buf);
  float kth = buf[0].value;
  for (const ScoredId& s : buf) kth = std::min(kth, s.value);
  return kth;
}

struct MassThreshold {
  float value;
  uint64_t mass_at_or_above;
};

// The largest value v among items whose mass at or above v reaches need (1 <= need <= the
// items' mass), by quickselect with three-way partitions; reorders items.
MassThreshold mass_threshold(std::span<ValueMass> items, uint64_t need) {
  if (items.empty()) return {kNegInf, 0};  // unreachable when need is within the mass
  size_t lo = 0, hi = items.size();
  uint64_t above = 0;  // mass of the items known to lie above [lo, hi); always < need
  for (;;) {
    const float a = items[lo].value, b = items[lo + (hi - lo) / 2].value, c = items[hi - 1].value;
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    // [lo, gt): above the pivot; [gt, i): equal; [lt, hi): below.
    size_t gt = lo, i = lo, lt = hi;
    uint64_t mass_gt = 0, mass_eq = 0;
    while (i < lt) {
      if (items[i].value > pivot) {
        mass_gt += items[i].mass;
        std::swap(items[gt++], items[i++]);
      } else if (items[i].value < pivot) {
        std::swap(items[i], items[--lt]);
      } else {
        mass_eq += items[i].mass;
        ++i;
      }
    }
    if (above + mass_gt >= need) {
      hi = gt;  // not empty: its mass is positive
    } else if (above + mass_gt + mass_eq >= need || lt == hi) {
      return {pivot, above + mass_gt + mass_eq};
    } else {
      above += mass_gt + mass_eq;
      lo = lt;
    }
  }
}

struct RawStats {
  float max_logit;
  double log_sum_exp;
};

// The largest of x[0, n) over 8 lanes (GCC vectorizes it), then its first index.
ScoredId first_max(const float* x, int64_t n) {
  float lane_max[8];
  for (int lane = 0; lane < 8; ++lane) lane_max[lane] = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) lane_max[lane] = x[i + lane] > lane_max[lane] ? x[i + lane] : lane_max[lane];
  float best = *std::max_element(lane_max, lane_max + 8);
  for (; i < n; ++i) best = x[i] > best ? x[i] : best;
  int64_t at = 0;
  while (at + 1 < n && !(x[at] == best)) ++at;
  return {best, int32_t(at)};
}

// A row the rule can use: no NaN, no +inf, and not all -inf. Compares bits, branch-free, so
// GCC vectorizes it: NaN and +inf are the floats whose bits above the sign are 0x7f800000 or
// more, except -inf itself.
bool usable_row(const float* l, int64_t n) {
  uint32_t bad = 0, finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = sampling::bits_of(l[i]);
    const uint32_t magnitude = bits & 0x7fffffffu;
    bad |= uint32_t(magnitude > 0x7f800000u) | uint32_t(bits == 0x7f800000u);
    finite |= uint32_t(magnitude < 0x7f800000u);
  }
  return !bad && finite;
}

// Exps run over blocks in branch-free loops, which GCC vectorizes (4 lanes on baseline x86-64).
constexpr int kBlock = 512;

// out[j] = e^(x[j] - shift), x[j] <= shift.
void exp_block(const float* x, int n, float shift, float* out) {
  for (int j = 0; j < n; ++j) out[j] = exp_nonpositive(x[j] - shift);
}

// out[j] = (z[j] - max z) * (1 / T).
void scaled_block(const float* z, int n, float max_z, float inv_temperature, float* out) {
  for (int j = 0; j < n; ++j) out[j] = scaled_logit(z[j], max_z, inv_temperature);
}

// The sum in double over 8 interleaved accumulators: a fixed order, so repeatable.
double sum_block(const float* x, int n) {
  double acc[8] = {};
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int lane = 0; lane < 8; ++lane) acc[lane] += x[j + lane];
  for (; j < n; ++j) acc[0] += x[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

int block_size(int64_t begin, int64_t n) { return int(std::min<int64_t>(kBlock, n - begin)); }

double log_sum_exp(const float* l, int64_t n, float max_logit) {
  float e[kBlock];
  double sum = 0;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int m = block_size(i, n);
    exp_block(l + i, m, max_logit, e);
    sum += sum_block(e, m);
  }
  return double(max_logit) + std::log(sum);
}

float logprob_of(float logit, const RawStats& raw) { return float(double(logit) - raw.log_sum_exp); }

bool has_penalties(const SamplingRow& r) {
  return r.repetition_penalty != 1.0f || r.presence_penalty != 0 || r.frequency_penalty != 0;
}

// z: the row with its penalties, in scratch, or the logits themselves when it has none.
const float* apply_penalties(const float* l, int64_t vocab, const SamplingRow& r, const int32_t* ids,
                             const int32_t* counts, RowScratch& scratch) {
  if (r.penalty_count == 0 || !has_penalties(r)) return l;
  scratch.penalized.assign(l, l + vocab);
  for (int32_t e = r.penalty_begin; e < r.penalty_begin + r.penalty_count; ++e)
    scratch.penalized[size_t(ids[e])] = sampling::penalized(l[ids[e]], counts[e], r.repetition_penalty,
                                                            r.presence_penalty, r.frequency_penalty);
  return scratch.penalized.data();
}

// The candidate set C in id order, as parallel arrays. Without a top-k cut C is the whole row:
// ids are then the positions and z is the row itself.
struct Candidates {
  int64_t size = 0;
  const int32_t* ids = nullptr;  // null: ids are 0 .. size - 1
  const float* z = nullptr;
  const uint64_t* mass = nullptr;
  const uint8_t* bucket = nullptr;  // top-p only
  uint64_t total = 0;               // C's mass

  int32_t id(int64_t c) const { return ids ? ids[c] : int32_t(c); }
};

// What a row's weighing pass reads. The weigh functions also add sum e^(l - max l) to raw_sum.
struct WeighPass {
  const float* l;
  const float* z;
  int64_t vocab;
  float max_z, inv_temperature, max_logit;
  bool with_buckets;
  // At temperature 1 without penalties a weight is exactly the raw exp already computed.
  bool reuse_raw() const { return z == l && inv_temperature == 1.0f; }
};

// C = the whole row: weights a block at a time, in vectorized loops.
Candidates weigh_row(const WeighPass& w, double& raw_sum, RowScratch& scratch) {
  scratch.candidate_mass.resize(size_t(w.vocab));
  if (w.with_buckets) scratch.candidate_bucket.resize(size_t(w.vocab));
  std::fill(scratch.bucket_mass.begin(), scratch.bucket_mass.end(), 0);
  const bool reuse = w.reuse_raw();
  Candidates c{w.vocab, nullptr, w.z, scratch.candidate_mass.data(),
               w.with_buckets ? scratch.candidate_bucket.data() : nullptr, 0};
  float raw[kBlock], scaled[kBlock], weight[kBlock];
  for (int64_t i = 0; i < w.vocab; i += kBlock) {
    const int m = block_size(i, w.vocab);
    exp_block(w.l + i, m, w.max_logit, raw);
    raw_sum += sum_block(raw, m);
    if (w.with_buckets || !reuse) scaled_block(w.z + i, m, w.max_z, w.inv_temperature, scaled);
    if (!reuse) exp_block(scaled, m, 0.0f, weight);
    const float* p = reuse ? raw : weight;
    uint64_t* mass = scratch.candidate_mass.data() + i;
    for (int j = 0; j < m; ++j) mass[j] = mass_of(p[j]);
    for (int j = 0; j < m; ++j) c.total += mass[j];
    if (!w.with_buckets) continue;
    uint8_t* bucket = scratch.candidate_bucket.data() + i;
    for (int j = 0; j < m; ++j) bucket[j] = uint8_t(bucket_of(scaled[j]));
    for (int j = 0; j < m; ++j) scratch.bucket_mass[bucket[j]] += mass[j];
  }
  return c;
}

// C = { z >= theta_k } after a top-k cut: weights for the few candidates only.
Candidates weigh_candidates(const WeighPass& w, float theta_k, double& raw_sum, RowScratch& scratch) {
  scratch.candidate_id.clear();
  scratch.candidate_z.clear();
  scratch.candidate_mass.clear();
  scratch.candidate_bucket.clear();
  std::fill(scratch.bucket_mass.begin(), scratch.bucket_mass.end(), 0);
  const bool reuse = w.reuse_raw();
  uint64_t total = 0;
  float raw[kBlock];
  for (int64_t i = 0; i < w.vocab; i += kBlock) {
    const int m = block_size(i, w.vocab);
    exp_block(w.l + i, m, w.max_logit, raw);
    raw_sum += sum_block(raw, m);
    for (int j = 0; j < m; ++j) {
      const float z = w.z[i + j];
      if (!(z >= theta_k)) continue;
      const float a = scaled_logit(z, w.max_z, w.inv_temperature);
      const uint64_t mass = mass_of(reuse ? raw[j] : exp_nonpositive(a));
      scratch.candidate_id.push_back(int32_t(i + j));
      scratch.candidate_z.push_back(z);
      scratch.candidate_mass.push_back(mass);
      total += mass;
      if (!w.with_buckets) continue;
      scratch.candidate_bucket.push_back(uint8_t(bucket_of(a)));
      scratch.bucket_mass[size_t(bucket_of(a))] += mass;
    }
  }
  return {int64_t(scratch.candidate_id.size()), scratch.candidate_id.data(), scratch.candidate_z.data(),
          scratch.candidate_mass.data(), w.with_buckets ? scratch.candidate_bucket.data() : nullptr, total};
}

struct Nucleus {
  float theta;
  uint64_t kept_mass;
};

// theta_p and the mass of N = { z in C >= theta_p }.
Nucleus top_p_nucleus(float top_p, const Candidates& c, RowScratch& scratch) {
  const uint64_t need = sampling::top_p_need(top_p, c.total);
  int b = 0;
  uint64_t above = 0;  // mass of the buckets before b, all of whose values lie above bucket b's
  while (b + 1 < kBuckets && above + scratch.bucket_mass[size_t(b)] < need) above += scratch.bucket_mass[size_t(b++)];
  scratch.bucket.clear();
  for (int64_t i = 0; i < c.size; ++i)
    if (c.bucket[i] == b) scratch.bucket.push_back({c.z[i], c.mass[i]});
  const MassThreshold t = mass_threshold(scratch.bucket, need - above);
  return {t.value, above + t.mass_at_or_above};
}

// The first candidate z >= theta, in id order, whose running mass exceeds the target; the last
// such candidate if none does.
int32_t draw(const Candidates& c, float theta, uint64_t target) {
  uint64_t running = 0;
  int64_t last = 0;
  for (int64_t i = 0; i < c.size; ++i) {
    if (!(c.z[i] >= theta)) continue;
    running += c.mass[i];
    last = i;
    if (running > target) return c.id(i);
  }
  return c.id(last);
}

// Steps 3a-3d for a row with temperature > 0; also returns the raw log-sum-exp it computed.
int32_t sample_token(const float* l, const float* z, int64_t vocab, const SamplingRow& r, float max_z,
                     float max_logit, double& raw_log_sum_exp, RowScratch& scratch) {
  const bool top_k_cuts = r.top_k > 0 && r.top_k < vocab;
  const bool top_p_cuts = r.top_p < 1.0f;
  const WeighPass pass{l, z, vocab, max_z, sampling::inverse_temperature(r.temperature), max_logit, top_p_cuts};
  double raw_sum = 0;
  float theta = kNegInf;
  Candidates c;
  if (top_k_cuts) {
    theta = kth_largest(z, vocab, r.top_k, scratch.best);
    c = weigh_candidates(pass, theta, raw_sum, scratch);
  } else {
    c = weigh_row(pass, raw_sum, scratch);
  }
  raw_log_sum_exp = double(max_logit) + std::log(raw_sum);
  const Nucleus nucleus = top_p_cuts ? top_p_nucleus(r.top_p, c, scratch) : Nucleus{theta, c.total};
  const uint64_t target = sampling::draw_target(uniform_double(r.seed, r.position), nucleus.kept_mass);
  return draw(c, nucleus.theta, target);
}

void fill_top_logprobs(const float* l, int64_t vocab, int n_top, const RawStats& raw,
                       RowScratch& scratch, SampledToken& out) {
  const int n = int(std::min<int64_t>(n_top, vocab));
  out.n_top = n;
  if (n == 0) return;
  select_best(l, vocab, n, scratch.best);
  std::sort(scratch.best.begin(), scratch.best.end(), better);
  for (int j = 0; j < n; ++j) {
    out.top_ids[j] = scratch.best[size_t(j)].id;
    out.top_logprobs[j] = logprob_of(scratch.best[size_t(j)].value, raw);
  }
}

// One row; false (and out left empty) for a row the rule cannot use.
bool sample_row(const float* l, int64_t vocab, const SamplingRow& r, const int32_t* penalty_ids,
                const int32_t* penalty_counts, SampledToken& out) {
  out = SampledToken{};
  if (!usable_row(l, vocab)) return false;
  RowScratch& scratch = thread_scratch();
  const float* z = apply_penalties(l, vocab, r, penalty_ids, penalty_counts, scratch);
  const ScoredId max_z = first_max(z, vocab);
  // Weights are relative to a finite max z: then the top candidate weighs exactly 1.
  if (!std::isfinite(max_z.value)) return false;
  RawStats raw{z == l ? max_z.value : first_max(l, vocab).value, 0};
  if (r.temperature > 0) {
    out.token = sample_token(l, z, vocab, r, max_z.value, raw.max_logit, raw.log_sum_exp, scratch);
  } else {
    out.token = max_z.id;
    raw.log_sum_exp = log_sum_exp(l, vocab, raw.max_logit);
  }
  out.logprob = logprob_of(l[out.token], raw);
  fill_top_logprobs(l, vocab, r.n_top_logprobs, raw, scratch, out);
  return true;
}

void check_row(const SamplingRow& r, int64_t row, int64_t vocab, const int32_t* ids, const int32_t* counts,
               int64_t n_penalties, std::vector<uint8_t>& seen) {
  TETRA_CHECK(std::isfinite(r.temperature) && r.temperature >= 0, "sample: row ", row,
              " has temperature ", r.temperature, "; it must be finite and at least 0");
  TETRA_CHECK(r.top_p > 0 && r.top_p <= 1, "sample: row ", row, " has top_p ", r.top_p,
              "; it must be in (0, 1]");
  TETRA_CHECK(r.top_k >= 0, "sample: row ", row, " has top_k ", r.top_k, "; it must be at least 0");
  TETRA_CHECK(r.n_top_logprobs >= 0 && r.n_top_logprobs <= kMaxTopLogprobs, "sample: row ", row,
              " asks for ", r.n_top_logprobs, " top logprobs; at most ", kMaxTopLogprobs, " are kept");
  TETRA_CHECK(std::isfinite(r.presence_penalty) && std::isfinite(r.frequency_penalty), "sample: row ", row,
              " has a penalty that is not finite");
  TETRA_CHECK(std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0, "sample: row ", row,
              " has repetition_penalty ", r.repetition_penalty, "; it must be finite and above 0");
  TETRA_CHECK(r.penalty_begin >= 0 && r.penalty_count >= 0 &&
                  int64_t(r.penalty_begin) + r.penalty_count <= n_penalties,
              "sample: row ", row, "'s penalty entries [", r.penalty_begin, ", +", r.penalty_count,
              ") lie outside the ", n_penalties, " given");
  const int32_t begin = r.penalty_begin, end = r.penalty_begin + r.penalty_count;
  for (int32_t e = begin; e < end; ++e) {
    TETRA_CHECK(ids[e] >= 0 && ids[e] < vocab, "sample: row ", row, " penalizes token ", ids[e],
                ", outside the vocabulary of ", vocab);
    TETRA_CHECK(counts[e] >= 0, "sample: row ", row, " gives token ", ids[e], " the count ", counts[e],
                "; counts are at least 0");
    TETRA_CHECK(!seen[size_t(ids[e])], "sample: row ", row, " lists token ", ids[e], " twice in its penalties");
    seen[size_t(ids[e])] = 1;
  }
  for (int32_t e = begin; e < end; ++e) seen[size_t(ids[e])] = 0;
}

void check_arguments(TensorView logits, const SamplingRow* rows, const int32_t* penalty_ids,
                     const int32_t* penalty_counts, int64_t n_penalties, const SampledToken* out) {
  TETRA_CHECK(logits.dtype == DType::F32 && logits.shape.rank == 2, "sample: logits must be F32 [R, V], not ",
              dtype_name(logits.dtype), " ", logits.shape.str());
  TETRA_CHECK(logits.device == Device::Cpu, "sample: the CPU backend samples logits in host memory");
  const int64_t n_rows = logits.dim(0), vocab = logits.dim(1);
  TETRA_CHECK(n_rows >= 0 && vocab >= 1 && vocab <= std::numeric_limits<int32_t>::max(),
              "sample: logits ", logits.shape.str(), " need a vocabulary of 1 to 2^31 - 1 tokens");
  if (n_rows == 0) return;
  TETRA_CHECK(logits.data && rows && out, "sample: logits, rows and out must be given");
  TETRA_CHECK(n_penalties >= 0 && (n_penalties == 0 || (penalty_ids && penalty_counts)),
              "sample: ", n_penalties, " penalty entries need both their id and count lists");
  std::vector<uint8_t> seen(n_penalties > 0 ? size_t(vocab) : 0, 0);  // marks one row's ids
  for (int64_t row = 0; row < n_rows; ++row)
    check_row(rows[row], row, vocab, penalty_ids, penalty_counts, n_penalties, seen);
}

}  // namespace

void sample_rows(ThreadPool* pool, TensorView logits, const SamplingRow* rows, const int32_t* penalty_ids,
                 const int32_t* penalty_counts, int64_t n_penalties, SampledToken* out) {
  check_arguments(logits, rows, penalty_ids, penalty_counts, n_penalties, out);
  const int64_t n_rows = logits.dim(0), vocab = logits.dim(1);
  // Workers must not throw: a bad row is recorded (the first one wins) and reported after.
  std::atomic<int64_t> bad_row{n_rows};
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      if (sample_row(logits.as<const float>() + row * vocab, vocab, rows[row], penalty_ids, penalty_counts,
                     out[row]))
        continue;
      int64_t seen = bad_row.load();
      while (row < seen && !bad_row.compare_exchange_weak(seen, row)) {
      }
    }
  };
  if (pool)
    pool->parallel_for(n_rows, 1, run);
  else
    run(0, n_rows);
  TETRA_CHECK(bad_row.load() == n_rows, "sample: logits row ", bad_row.load(),
              " holds NaN or +inf, or no value that is finite after its penalties");
}

}  // namespace tetra::ops::cpu

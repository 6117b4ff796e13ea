// The CPU sampler (ops/cpu/sampling) against the rule it implements: Philox's published answers,
// greedy ties and penalties (repetition, presence, frequency) worked by hand, a sort-everything twin of the rule (the oracle
// below) for exact tokens, chi-square fits of 200k draws to softmax(z / T) over the kept set,
// log-probs against double log_softmax, and every argument check. Timings are printed, never
// asserted.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/philox.h"
#include "core/thread_pool.h"
#include "ops/cpu/sampling.h"
#include "sampling_batch.h"

namespace tetra::ops::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The shared batch, sampled by the CPU sampler.
struct Batch : testing_util::SamplingBatch {
  using SamplingBatch::SamplingBatch;
  explicit Batch(const SamplingBatch& b) : SamplingBatch(b) {}
  TensorView view() const {
    return TensorView{const_cast<float*>(logits.data()), DType::F32, {n_rows(), vocab}, Device::Cpu};
  }
  std::vector<SampledToken> sample(ThreadPool* pool = nullptr) const {
    std::vector<SampledToken> out(rows.size());
    sample_rows(pool, view(), rows.data(), penalty_ids.data(), penalty_counts.data(),
                int64_t(penalty_ids.size()), out.data());
    return out;
  }
};

std::vector<float> normal_logits(int64_t n, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

SamplingRow sampled(float temperature, int top_k = 0, float top_p = 1.0f, uint64_t seed = 7,
                    int64_t position = 0) {
  SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.seed = seed;
  r.position = position;
  return r;
}

// The rule done the slow, obvious way: sort everything, walk groups of equal values. It uses
// the same shared arithmetic (weights, need, target), so its tokens must match exactly.
struct OracleResult {
  int32_t token = 0;
  std::vector<int32_t> kept;        // N, in id order (empty for greedy)
  std::vector<double> probability;  // softmax(z / T) over N in double, for the chi-square fits
};

OracleResult oracle(const Batch& b, int64_t r) {
  const SamplingRow& row = b.rows[size_t(r)];
  const std::vector<float> z = b.penalized_row(r);
  const int64_t v = b.vocab;
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t c) {
    return z[size_t(a)] > z[size_t(c)] || (z[size_t(a)] == z[size_t(c)] && a < c);
  });
  OracleResult res;
  if (row.temperature <= 0) {
    res.token = order[0];
    return res;
  }
  const int64_t k = row.top_k > 0 && row.top_k < v ? row.top_k : v;
  const float theta_k = z[size_t(order[size_t(k - 1)])];
  const float max_z = z[size_t(order[0])];
  const float inv_t = sampling::inverse_temperature(row.temperature);
  uint64_t total = 0;
  for (int32_t id : order)
    if (z[size_t(id)] >= theta_k) total += sampling::token_mass(z[size_t(id)], max_z, inv_t);
  float theta = theta_k;
  if (row.top_p < 1.0f) {
    const uint64_t need = sampling::top_p_need(row.top_p, total);
    uint64_t acc = 0;
    for (size_t i = 0; i < order.size() && z[size_t(order[i])] >= theta_k;) {
      const float value = z[size_t(order[i])];
      for (; i < order.size() && z[size_t(order[i])] == value; ++i)
        acc += sampling::token_mass(value, max_z, inv_t);
      if (acc >= need) {
        theta = value;
        break;
      }
    }
  }
  uint64_t kept_mass = 0;
  double norm = 0;
  for (int32_t id = 0; id < v; ++id) {
    if (!(z[size_t(id)] >= theta)) continue;
    res.kept.push_back(id);
    kept_mass += sampling::token_mass(z[size_t(id)], max_z, inv_t);
    res.probability.push_back(std::exp((double(z[size_t(id)]) - max_z) / row.temperature));
    norm += res.probability.back();
  }
  for (double& p : res.probability) p /= norm;
  const uint64_t target = sampling::draw_target(uniform_double(row.seed, row.position), kept_mass);
  uint64_t running = 0;
  res.token = res.kept.back();
  for (int32_t id : res.kept) {
    running += sampling::token_mass(z[size_t(id)], max_z, inv_t);
    if (running > target) {
      res.token = id;
      break;
    }
  }
  return res;
}

double log_softmax(const float* l, int64_t n, int32_t id) {
  double m = l[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, double(l[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(l[i]) - m);
  return double(l[id]) - m - std::log(sum);
}

// --- Philox -----------------------------------------------------------------------------

// Random123's kat_vectors, "philox4x32 10" lines: counter[4] key[2] -> output[4].
TEST(Philox, PublishedKnownAnswers) {
  struct Case {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter want;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    const PhiloxCounter got = philox4x32_10(c.ctr, c.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], c.want.v[i]) << "word " << i;
  }
}

TEST(Philox, UniformDoubleIsThe53BitsOfOneBlock) {
  const uint64_t seed = 0x0123456789abcdefull;
  const int64_t position = 0x1122334455ll;
  const PhiloxCounter out = philox4x32_10({{0x22334455u, 0x11u, 0, 0}}, {{0x89abcdefu, 0x01234567u}});
  const double want = double((uint64_t(out.v[0]) << 21) ^ (out.v[1] >> 11)) / 9007199254740992.0;
  EXPECT_EQ(uniform_double(seed, position), want);
  double sum = 0;
  for (int64_t p = 0; p < 100000; ++p) {
    const double u = uniform_double(42, p);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

// --- the shared arithmetic ----------------------------------------------------------------

TEST(SamplingArithmetic, ExpIsWithinTwoUlpsAndExactAtZero) {
  EXPECT_EQ(sampling::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(sampling::exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(sampling::mass_of(1.0f), uint64_t(1) << sampling::kMassFractionBits);
  EXPECT_EQ(sampling::exp_nonpositive(-kInf), sampling::exp_nonpositive(-80.0f));
  double worst = 0;
  for (int i = 0; i <= 800000; ++i) {
    const float a = -80.0f * float(i) / 800000.0f;
    const double want = std::exp(double(a));
    worst = std::max(worst, std::abs(double(sampling::exp_nonpositive(a)) - want) / want);
  }
  std::printf("exp_nonpositive: worst relative error %.3g on [-80, 0]\n", worst);
  EXPECT_LT(worst, 2.5e-7);
}

// The CUDA kernel computes these same bits with unfused _rn intrinsics; a host build that fused
// a multiply-add (GCC with FMA and no TETRA_SAMPLING_UNFUSED) would change this hash, and with
// it tokens against the GPU.
TEST(SamplingArithmetic, WeightBitsArePinned) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the bits of e^a and of the masses
  for (int i = 0; i <= 1000000; ++i) {
    const float a = -90.0f * float(i) / 1000000.0f;
    hash = (hash ^ sampling::bits_of(sampling::exp_nonpositive(a))) * 1099511628211ull;
    hash = (hash ^ sampling::token_mass(a * 0.37f, 0.0f, sampling::inverse_temperature(0.7f))) * 1099511628211ull;
  }
  EXPECT_EQ(hash, 0xf746fa611600f7aeull);
}

// --- greedy and penalties -------------------------------------------------------------------

TEST(Sampling, GreedyTakesTheFirstMaximum) {
  Batch b(6);
  b.add({1, 4, 2, 4, 4, -1}, SamplingRow{});
  b.add({-kInf, -3, -kInf, -3, -5, -7}, SamplingRow{});
  const auto out = b.sample();
  EXPECT_EQ(out[0].token, 1);
  EXPECT_EQ(out[1].token, 1);
}

TEST(Sampling, PenaltiesMoveTheGreedyChoiceAsWorkedByHand) {
  Batch b(4);
  const std::vector<float> l = {1.0f, 3.0f, 2.5f, 3.0f};
  SamplingRow r;
  r.presence_penalty = 0.25f;
  r.frequency_penalty = 0.5f;
  b.add(l, r);                    // no entries: first max, id 1
  b.add(l, r, {{1, 2}});          // z1 = 3 - (0.25 + 0.5 * 2) = 1.75: id 3 leads
  b.add(l, r, {{3, 1}, {1, 2}});  // z3 = 3 - 0.75 = 2.25, z1 = 1.75: id 2 (2.5) leads
  r.presence_penalty = -1.0f;     // a negative penalty favours a token
  r.frequency_penalty = 0.0f;
  b.add(l, r, {{0, 5}});  // z0 = 2 ... still below 3: id 1
  b.add(l, r, {{2, 1}});  // z2 = 3.5: id 2
  const auto out = b.sample();
  EXPECT_EQ(out[0].token, 1);
  EXPECT_EQ(out[1].token, 3);
  EXPECT_EQ(out[2].token, 2);
  EXPECT_EQ(out[3].token, 1);
  EXPECT_EQ(out[4].token, 2);
  // The log-prob is the model's, before penalties.
  EXPECT_NEAR(out[2].logprob, log_softmax(l.data(), 4, 2), 1e-6);
}

TEST(Sampling, RepetitionPenaltyMovesTheGreedyChoiceAsWorkedByHand) {
  const testing_util::WorkedRepetition worked;
  const Batch b(worked.batch);
  const auto out = b.sample();
  for (int64_t r = 0; r < b.n_rows(); ++r) {
    EXPECT_EQ(out[size_t(r)].token, worked.tokens[size_t(r)]) << "row " << r;
    EXPECT_NEAR(out[size_t(r)].logprob, log_softmax(b.row(r), b.vocab, out[size_t(r)].token), 1e-6) << "row " << r;
  }
  // The overflowing rows: finite after the penalty, at the float's extremes.
  EXPECT_EQ(sampling::repetition_penalized(-2.0f, 3e38f), -std::numeric_limits<float>::max());
  EXPECT_EQ(sampling::repetition_penalized(10.0f, 1e-38f), std::numeric_limits<float>::max());
  EXPECT_EQ(sampling::repetition_penalized(-kInf, 2.0f), -kInf);
  EXPECT_EQ(sampling::repetition_penalized(0.0f, 2.0f), 0.0f);
}

TEST(Sampling, TopKOfOneIsGreedy) {
  std::mt19937 rng(3);
  Batch b(1000);
  for (int i = 0; i < 200; ++i) b.add(normal_logits(1000, 3.0f, rng), sampled(1.5f, 1, 1.0f, 11, i));
  const auto out = b.sample();
  for (int64_t r = 0; r < b.n_rows(); ++r)
    EXPECT_EQ(out[size_t(r)].token, std::max_element(b.row(r), b.row(r) + 1000) - b.row(r)) << "row " << r;
}

// --- the distribution ------------------------------------------------------------------------

struct Fit {
  double chi2 = 0;
  int dof = 0;
  int64_t outside = 0;  // draws of tokens outside N
};

// n draws at positions 0..n-1 of one row; counts compared with the oracle's N and softmax.
Fit draw_and_fit(const std::vector<float>& logits, SamplingRow r, int64_t n, ThreadPool* pool,
                 const std::vector<std::pair<int32_t, int32_t>>& penalties = {}) {
  const int64_t v = int64_t(logits.size());
  Batch b(v);
  for (int64_t i = 0; i < n; ++i) {
    r.position = i;
    b.add(logits, r, penalties);
  }
  const OracleResult want = oracle(b, 0);
  std::vector<int64_t> count(size_t(v), 0);
  for (const SampledToken& t : b.sample(pool)) ++count[size_t(t.token)];
  Fit fit;
  std::vector<bool> kept(size_t(v), false);
  for (size_t j = 0; j < want.kept.size(); ++j) {
    kept[size_t(want.kept[j])] = true;
    const double expected = want.probability[j] * double(n);
    const double d = double(count[size_t(want.kept[j])]) - expected;
    fit.chi2 += d * d / expected;
  }
  for (int64_t i = 0; i < v; ++i)
    if (!kept[size_t(i)]) fit.outside += count[size_t(i)];
  fit.dof = int(want.kept.size()) - 1;
  return fit;
}

// A bound a correct sampler exceeds with probability far below 1e-6 (and the draws are fixed).
double chi2_bound(int dof) { return dof + 8.0 * std::sqrt(2.0 * dof) + 8.0; }

TEST(Sampling, DrawsFitSoftmaxOverTheKeptSet) {
  ThreadPool pool(4);
  std::mt19937 rng(5);
  const std::vector<float> logits = normal_logits(24, 1.0f, rng);
  struct Case {
    const char* name;
    SamplingRow row;
    std::vector<std::pair<int32_t, int32_t>> penalties;
  };
  SamplingRow with_penalties = sampled(1.0f, 0, 0.9f, 99);
  with_penalties.presence_penalty = 0.5f;
  with_penalties.frequency_penalty = 0.25f;
  SamplingRow with_repetition = with_penalties;
  with_repetition.repetition_penalty = 1.8f;
  const std::vector<Case> cases = {
      {"temperature 0.8", sampled(0.8f, 0, 1.0f, 99), {}},
      {"temperature 1.7", sampled(1.7f, 0, 1.0f, 99), {}},
      {"top_k 6", sampled(0.8f, 6, 1.0f, 99), {}},
      {"top_p 0.7", sampled(1.3f, 0, 0.7f, 99), {}},
      {"top_k 10 + top_p 0.8", sampled(1.2f, 10, 0.8f, 99), {}},
      {"top_p 0.9 + penalties", with_penalties, {{3, 2}, {7, 1}, {11, 4}}},
      {"top_p 0.9 + repetition", with_repetition, {{0, 0}, {3, 2}, {5, 0}, {7, 1}, {11, 0}, {19, 0}}},
  };
  for (const Case& c : cases) {
    const Fit fit = draw_and_fit(logits, c.row, 200000, &pool, c.penalties);
    std::printf("chi-square %-22s %8.2f on %2d degrees of freedom (bound %.1f)\n", c.name, fit.chi2, fit.dof,
                chi2_bound(fit.dof));
    EXPECT_EQ(fit.outside, 0) << c.name;
    EXPECT_LT(fit.chi2, chi2_bound(fit.dof)) << c.name;
  }
}

TEST(Sampling, TiesAtTheTopKThresholdAreAllKept) {
  // top_k 2: the 2nd largest is 4, held by ids 1, 2, 3; all three stay, ids 4 and 5 never come.
  const std::vector<float> logits = {5, 4, 4, 4, 1, 0};
  const Fit fit = draw_and_fit(logits, sampled(1.0f, 2), 50000, nullptr);
  EXPECT_EQ(fit.outside, 0);
  EXPECT_EQ(fit.dof, 3);
  EXPECT_LT(fit.chi2, chi2_bound(fit.dof));
}

// The set of tokens drawn over many positions.
std::set<int32_t> drawn_set(const std::vector<float>& logits, SamplingRow r, int64_t n) {
  Batch b(int64_t(logits.size()));
  for (int64_t i = 0; i < n; ++i) {
    r.position = i;
    b.add(logits, r);
  }
  std::set<int32_t> ids;
  for (const SampledToken& t : b.sample()) ids.insert(t.token);
  return ids;
}

TEST(Sampling, TopPKeepsExactlyTheSmallestPrefixReachingItsMass) {
  // Probabilities 0.1, 0.4, 0.2, 0.3 by id; by value: id 1 (0.4), 3 (0.7), 2 (0.9), 0 (1.0).
  std::vector<float> logits;
  for (double p : {0.1, 0.4, 0.2, 0.3}) logits.push_back(float(std::log(p)));
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 0, 0.3f), 2000), (std::set<int32_t>{1}));
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 0, 0.65f), 5000), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 0, 0.85f), 5000), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 0, 0.95f), 5000), (std::set<int32_t>{0, 1, 2, 3}));
  // top_k 2 first: C = {1, 3} (mass 0.7); top_p 0.5 of it is 0.35, reached by id 1 alone.
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 2, 0.5f), 2000), (std::set<int32_t>{1}));
  EXPECT_EQ(drawn_set(logits, sampled(1.0f, 2, 0.6f), 5000), (std::set<int32_t>{1, 3}));
  // A tie straddling the threshold comes whole: values 0.4, 0.2, 0.2, 0.2 (of 1.0) and top_p
  // 0.5 need the second value, which brings all three of its ids.
  std::vector<float> tied;
  for (double p : {0.2, 0.4, 0.2, 0.2}) tied.push_back(float(std::log(p)));
  EXPECT_EQ(drawn_set(tied, sampled(1.0f, 0, 0.5f), 5000), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampling, SameSeedAndPositionGiveTheSameTokenInAnyBatch) {
  std::mt19937 rng(8);
  const std::vector<float> flat(1000, 0.0f);  // uniform: every draw shows the uniform
  Batch alone(1000), crowd(1000);
  alone.add(flat, sampled(1.0f, 0, 1.0f, 1234, 77));
  for (int i = 0; i < 5; ++i) crowd.add(normal_logits(1000, 2.0f, rng), sampled(0.7f, 0, 0.9f, 5, i));
  crowd.add(flat, sampled(1.0f, 0, 1.0f, 1234, 77));
  EXPECT_EQ(alone.sample()[0].token, crowd.sample()[5].token);
  // Different positions (or seeds) are different draws: 1000 positions of a uniform over 1000
  // ids give about 632 distinct ids.
  std::set<int32_t> by_position = drawn_set(flat, sampled(1.0f, 0, 1.0f, 1234), 1000);
  EXPECT_GT(by_position.size(), 550u);
  Batch seeds(1000);
  for (uint64_t s = 0; s < 1000; ++s) seeds.add(flat, sampled(1.0f, 0, 1.0f, s, 77));
  std::set<int32_t> by_seed;
  for (const SampledToken& t : seeds.sample()) by_seed.insert(t.token);
  EXPECT_GT(by_seed.size(), 550u);
}

// --- log-probs -------------------------------------------------------------------------------

TEST(Sampling, LogprobsAreLogSoftmaxOfTheRawLogits) {
  std::mt19937 rng(9);
  for (int64_t v : {7, 1000, 151936}) {
    Batch b(v);
    for (int i = 0; i < 4; ++i) {
      SamplingRow r = i % 2 ? sampled(0.9f, 0, 0.95f, 3, i) : SamplingRow{};
      r.n_top_logprobs = 20;
      r.presence_penalty = 1.0f;
      b.add(normal_logits(v, 4.0f, rng), r, {{0, 1}, {int32_t(v - 1), 3}});
    }
    const auto out = b.sample();
    for (int64_t r = 0; r < b.n_rows(); ++r) {
      const SampledToken& t = out[size_t(r)];
      EXPECT_NEAR(t.logprob, log_softmax(b.row(r), v, t.token), 1e-5) << "V " << v << " row " << r;
      ASSERT_EQ(t.n_top, std::min<int64_t>(20, v));
      for (int j = 0; j < t.n_top; ++j)
        EXPECT_NEAR(t.top_logprobs[j], log_softmax(b.row(r), v, t.top_ids[j]), 1e-5);
    }
  }
}

TEST(Sampling, TopLogprobsAreSortedWithTiesByLowerIdAndCappedAtTheVocabulary) {
  Batch b(7);
  SamplingRow all;
  all.n_top_logprobs = 20;
  SamplingRow four;
  four.n_top_logprobs = 4;
  const std::vector<float> l = {1, 3, 3, 2, 3, 0, 2};
  b.add(l, all);
  b.add(l, four);
  const auto out = b.sample();
  const std::vector<int32_t> order = {1, 2, 4, 3, 6, 0, 5};
  ASSERT_EQ(out[0].n_top, 7);
  ASSERT_EQ(out[1].n_top, 4);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(out[0].top_ids[j], order[size_t(j)]) << j;
  for (int j = 0; j < 4; ++j) EXPECT_EQ(out[1].top_ids[j], order[size_t(j)]) << j;
  for (int j = 7; j < kMaxTopLogprobs; ++j) EXPECT_EQ(out[0].top_ids[j], 0);
  EXPECT_EQ(out[0].top_logprobs[0], out[0].top_logprobs[2]);
}

// --- against the oracle ---------------------------------------------------------------------

// Rows mixing every option, with a few whose logits are a handful of values (ties everywhere).
Batch mixed_batch(int64_t v, int n_rows, std::mt19937& rng) {
  Batch b(v);
  std::uniform_int_distribution<int> pick(0, 1 << 30);
  const float temperatures[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.0f, 1.6f};
  const int top_ks[] = {0, 0, 1, 2, 5, 50, int(v) - 1, int(v) + 3};
  const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.9f, 0.5f, 0.1f};
  for (int i = 0; i < n_rows; ++i) {
    SamplingRow r = sampled(temperatures[pick(rng) % 6], top_ks[pick(rng) % 8], top_ps[pick(rng) % 6],
                            uint64_t(pick(rng)) << 20 | uint64_t(pick(rng)), pick(rng) % 100000);
    const int n_tops[] = {0, 5, 20};
    r.n_top_logprobs = n_tops[pick(rng) % 3];
    std::vector<float> l = normal_logits(v, 2.0f + float(pick(rng) % 4), rng);
    if (i % 7 == 3)
      for (float& x : l) x = std::round(x / 2);  // many exact ties
    std::vector<std::pair<int32_t, int32_t>> penalties;
    if (i % 3 == 1) {
      // Presence and frequency alone, repetition alone, or all three; entries of count 0 (prompt
      // tokens) only where the repetition penalty reads them.
      const int kind = pick(rng) % 3;
      r.presence_penalty = kind == 1 ? 0.0f : 0.4f;
      r.frequency_penalty = kind == 1 ? 0.0f : 0.3f;
      const float repetitions[] = {0.7f, 1.2f, 2.0f};
      r.repetition_penalty = kind == 0 ? 1.0f : repetitions[pick(rng) % 3];
      std::vector<int32_t> ids(static_cast<size_t>(v));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (int e = 0; e < std::min<int>(int(v), 40); ++e)
        penalties.push_back({ids[size_t(e)], kind == 0 ? 1 + pick(rng) % 4 : pick(rng) % 4});
    }
    b.add(std::move(l), r, penalties);
  }
  return b;
}

TEST(Sampling, TokensMatchTheSortEverythingOracleExactly) {
  ThreadPool pool(3);
  std::mt19937 rng(10);
  for (auto [v, n] : {std::pair<int64_t, int>{7, 400}, {1000, 300}, {20000, 60}}) {
    const Batch b = mixed_batch(v, n, rng);
    const auto out = b.sample(&pool);
    const auto serial = b.sample(nullptr);
    for (int64_t r = 0; r < b.n_rows(); ++r) {
      EXPECT_EQ(out[size_t(r)].token, oracle(b, r).token) << "V " << v << " row " << r;
      EXPECT_EQ(out[size_t(r)].token, serial[size_t(r)].token);
    }
  }
}

// --- argument checks -------------------------------------------------------------------------

TEST(Sampling, BadArgumentsThrow) {
  auto expect_throw = [](auto change) {
    Batch b(5);
    b.add({0, 1, 2, 3, 4}, sampled(1.0f), {{1, 1}});
    TensorView view = b.view();
    change(b, view);
    std::vector<SampledToken> out(b.rows.size());
    EXPECT_THROW(sample_rows(nullptr, view, b.rows.data(), b.penalty_ids.data(), b.penalty_counts.data(),
                             int64_t(b.penalty_ids.size()), out.data()),
                 Error);
  };
  expect_throw([](Batch&, TensorView& v) { v.dtype = DType::BF16; });
  expect_throw([](Batch&, TensorView& v) { v.shape = {1, 1, 5}; });
  expect_throw([](Batch&, TensorView& v) { v.device = Device::Cuda; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].top_p = 0.0f; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].top_p = 1.5f; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].top_p = std::nanf(""); });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].top_k = -1; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].n_top_logprobs = kMaxTopLogprobs + 1; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].n_top_logprobs = -1; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].temperature = -0.5f; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].temperature = kInf; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].temperature = std::nanf(""); });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].presence_penalty = kInf; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].repetition_penalty = 0.0f; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].repetition_penalty = -1.0f; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].repetition_penalty = kInf; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].repetition_penalty = std::nanf(""); });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].penalty_count = 2; });
  expect_throw([](Batch& b, TensorView&) { b.rows[0].penalty_begin = -1; });
  expect_throw([](Batch& b, TensorView&) { b.penalty_ids[0] = 5; });
  expect_throw([](Batch& b, TensorView&) { b.penalty_ids[0] = -1; });
  expect_throw([](Batch& b, TensorView&) { b.penalty_counts[0] = -1; });
  expect_throw([](Batch& b, TensorView&) {
    b.penalty_ids.push_back(1);
    b.penalty_counts.push_back(1);
    b.rows[0].penalty_count = 2;  // id 1 twice
  });
  expect_throw([](Batch& b, TensorView&) { b.logits[2] = std::nanf(""); });
  expect_throw([](Batch& b, TensorView&) { b.logits[2] = kInf; });
  expect_throw([](Batch& b, TensorView&) { std::fill(b.logits.begin(), b.logits.end(), -kInf); });
  Batch ok(5);
  ok.add({0, 1, 2, 3, 4}, sampled(1.0f), {{1, 1}});
  ok.add({0, 1, 2, 3, 4}, sampled(1.0f), {{1, 0}});  // count 0: a prompt token
  EXPECT_NO_THROW(ok.sample());
}

// --- timing ------------------------------------------------------------------------------------

// What the old sampler did per sampled row: a partial sort of every id (k = V without top-k),
// then exps over all of them.
int32_t full_sort_sample(const float* l, int64_t v, std::vector<int32_t>& order, double u) {
  order.resize(size_t(v));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.end(), order.end(), [&](int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  });
  std::vector<double> p(static_cast<size_t>(v));
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp(double(l[order[i]] - l[order[0]]) / 0.7));
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if ((acc += p[i]) > u * sum) return order[i];
  return order.back();
}

// What the old sampler did per greedy row: copy, first max, log-prob in double.
int32_t old_greedy(const float* l, int64_t v, std::vector<float>& scratch) {
  scratch.assign(l, l + v);
  const int32_t token = int32_t(std::max_element(scratch.begin(), scratch.end()) - scratch.begin());
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(double(l[i]) - l[token]);
  return sum > 0 ? token : -1;
}

template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

TEST(Sampling, PrintsTimePerRowAtQwenVocabulary) {
  constexpr int64_t kVocab = 151936;
  std::mt19937 rng(12);
  const std::vector<float> logits = normal_logits(kVocab, 3.0f, rng);
  auto time_row = [&](SamplingRow r) {
    Batch b(kVocab);
    b.add(logits, r);
    b.sample();  // grows this thread's scratch
    return median_ms(21, [&](int i) {
      b.rows[0].position = i;
      b.sample();
    });
  };
  const double greedy = time_row(SamplingRow{});
  const double top_p = time_row(sampled(0.7f, 0, 0.9f));
  const double top_p_t1 = time_row(sampled(1.0f, 0, 0.9f));
  const double top_k_p = time_row(sampled(0.7f, 50, 0.95f));
  std::vector<int32_t> order;
  std::vector<float> scratch;
  const double full_sort = median_ms(5, [&](int i) { full_sort_sample(logits.data(), kVocab, order, 0.001 * i); });
  const double greedy_old = median_ms(21, [&](int) { old_greedy(logits.data(), kVocab, scratch); });
  std::printf("V=%lld, one thread, ms per row: greedy %.3f | top_p 0.9 T 0.7 %.3f (%.2fx greedy) | "
              "top_p 0.9 T 1 %.3f (%.2fx) | top_k 50 + top_p 0.95 %.3f (%.2fx)\n"
              "  the old sampler: greedy %.3f, sampled by full sort %.3f (%.1fx its greedy)\n",
              (long long)kVocab, greedy, top_p, top_p / greedy, top_p_t1, top_p_t1 / greedy, top_k_p,
              top_k_p / greedy, greedy_old, full_sort, full_sort / greedy_old);
}

}  // namespace
}  // namespace tetra::ops::cpu

#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tetra::model {

double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

RopeFrequencies rope_frequencies(const RopeConfig& rope) {
  const int dim = rope.rotary_dim;
  const int half = dim / 2;
  RopeFrequencies out;
  out.inv_freq.resize(size_t(half));
  // base ** (2i / dim) in fp32, as torch evaluates a python float raised to a float32 tensor.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    pos_freqs[size_t(i)] = std::pow(float(rope.theta), float(2 * i) / float(dim));
  if (rope.yarn_factor == 1.0) {
    for (int i = 0; i < half; ++i) out.inv_freq[size_t(i)] = 1.0f / pos_freqs[size_t(i)];
    return out;
  }
  const double factor = rope.yarn_factor;
  out.attention_scaling = float(rope.yarn_attention_factor);  // resolved by the config loader
  // The band of dimensions between beta_fast and beta_slow rotations blends interpolated
  // and extrapolated frequencies linearly.
  const double max_pos = rope.yarn_original_max_position;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(max_pos / (rotations * 2 * std::numbers::pi)) / (2 * std::log(rope.theta));
  };
  double low = correction_dim(rope.yarn_beta_fast), high = correction_dim(rope.yarn_beta_slow);
  if (rope.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(0.0, low);
  high = std::min(double(dim - 1), high);
  if (low == high) high += 0.001;
  for (int i = 0; i < half; ++i) {
    const float ramp = std::clamp(float((float(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    const float extrapolated = 1.0f / pos_freqs[size_t(i)];
    const float interpolated = 1.0f / (float(factor) * pos_freqs[size_t(i)]);
    out.inv_freq[size_t(i)] =
        interpolated * (1.0f - extrapolation_factor) + extrapolated * extrapolation_factor;
  }
  return out;
}

}  // namespace tetra::model

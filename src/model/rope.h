// Rotary frequencies as transformers computes them (default and YaRN), in fp32.
#pragma once

#include <vector>

#include "formats/model_config.h"

namespace tetra::model {

struct RopeFrequencies {
  std::vector<float> inv_freq;     // [rotary_dim / 2]
  float attention_scaling = 1.0f;  // multiplies cos and sin (YaRN's attention factor)
};

RopeFrequencies rope_frequencies(const RopeConfig& rope);

// YaRN's mscale: 0.1 * m * ln(scale) + 1 for scale > 1, else 1.
double yarn_mscale(double scale, double m);

}  // namespace tetra::model

// The mean KL of `model`'s next-token distributions from `ref`'s over a fixture's cases, each
// case's prompt and transformers' continuation scored teacher-forced in one window
// (runtime::evaluate, as `tetra eval --ref` does). For tests that bound what a lossy setting
// (an FP8 cache, FP8 activations) costs against the same checkpoint without it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "fixtures.h"
#include "runtime/evaluate.h"
#include "runtime/ranks.h"

namespace tetra::testing {

struct TeacherForcedKl {
  double mean = 0;
  int64_t scored = 0;  // predictions over all cases
};

inline TeacherForcedKl teacher_forced_kl(runtime::ModelRanks& model, runtime::ModelRanks& ref,
                                         const std::filesystem::path& fixture) {
  double kl_sum = 0;
  int64_t scored = 0;
  for (const auto& c : read_cases(fixture)) {
    std::vector<int32_t> seq = c.prompt_ids;
    seq.insert(seq.end(), c.token_ids.begin(), c.token_ids.end());
    const auto r = runtime::evaluate(model, &ref, seq, {.window = int64_t(seq.size())});
    kl_sum += r.kl_sum;
    scored += r.n_scored;
  }
  return {kl_sum / double(scored), scored};
}

}  // namespace tetra::testing

#include "formats/generation_config.h"

#include <limits>

#include "core/error.h"
#include "formats/json_fields.h"

namespace tetra {

using nlohmann::json;

GenerationConfig parse_generation_config(const json& j, const std::string& source, int64_t vocab_size) {
  if (!j.is_object()) fail(source, " must hold a JSON object, not ", json_kind(j), ".");
  const JsonFields r(j, source);
  GenerationConfig g;
  if (const json* v = r.find("eos_token_id")) {
    if (v->is_array()) {
      for (const json& e : *v) g.eos_token_ids.push_back(r.to_integer(e, "eos_token_id"));
    } else if (v->is_number_integer()) {
      g.eos_token_ids.push_back(r.to_integer(*v, "eos_token_id"));
    } else {
      r.fail_field("eos_token_id", str_cat("must be an integer or a list of integers, not ", json_kind(*v)));
    }
    for (int64_t id : g.eos_token_ids)
      if (id < 0 || id >= vocab_size)
        r.fail_field("eos_token_id", str_cat("holds ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
  }
  // The ranges the server accepts in a request, so a default is always a valid request value.
  g.temperature = r.maybe_number("temperature");
  if (g.temperature && !(*g.temperature >= 0 && *g.temperature <= 2))
    r.fail_field("temperature", str_cat("is ", *g.temperature, "; it must be between 0 and 2"));
  g.top_p = r.maybe_number("top_p");
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1))
    r.fail_field("top_p", str_cat("is ", *g.top_p, "; it must be in (0, 1]"));
  g.top_k = r.maybe_integer("top_k");
  if (g.top_k) r.check_range("top_k", *g.top_k, -1, 1 << 20);
  if (g.top_k && *g.top_k < 0) g.top_k = 0;  // -1 is vLLM's spelling of "all tokens"
  g.repetition_penalty = r.maybe_number("repetition_penalty");
  const double penalty_max = double(std::numeric_limits<float>::max());
  if (g.repetition_penalty && !(*g.repetition_penalty > 0 && *g.repetition_penalty <= penalty_max &&
                                float(*g.repetition_penalty) > 0))
    r.fail_field("repetition_penalty",
                 str_cat("is ", *g.repetition_penalty, "; it must be greater than 0 (1 is off) and a finite 32-bit float"));
  return g;
}

std::optional<GenerationConfig> load_generation_config(const std::filesystem::path& dir, int64_t vocab_size) {
  const std::filesystem::path path = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path.string(), " is not a file.");
  return parse_generation_config(read_json_file(path, "generation config"), path.string(), vocab_size);
}

}  // namespace tetra

// One stderr line per finished HTTP request (vLLM and uvicorn log the same facts), and the
// periodic throughput line while the engine is busy (vLLM's every-10-s "Avg prompt
// throughput" line).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/engine.h"

namespace tetra::server {

struct AccessRecord {
  std::string request_id;  // the response id (cmpl-..., chatcmpl-...); empty for other routes
  std::string method, path;
  int status = 0;
  // For generations only (negative: not a generation).
  int64_t prompt_tokens = -1, generated_tokens = -1;
  double ttft_s = -1;       // arrival to first token; negative: no token came
  double total_s = 0;       // arrival to the last byte handed to the socket
  std::string finish;       // finish reasons of the choices, comma-separated
};

// "request cmpl-1f.. POST /v1/completions 200 prompt_tokens=5 generated_tokens=2 ttft=0.012s
// total=0.030s finish=length"; control characters in the path are escaped.
std::string format_access_line(const AccessRecord& r);

// Engine counters at one instant, kept between two throughput lines.
struct ThroughputSample {
  double t_s = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

// "throughput: prompt 120.0 tok/s, generation 35.5 tok/s, running 2, waiting 0, KV cache 12.5%
// used, prefix cache hits 0.0%"; empty when nothing ran in the interval and nothing is queued.
std::string format_throughput_line(const ThroughputSample& before, const ThroughputSample& now,
                                   const runtime::EngineStats& stats);

}  // namespace tetra::server

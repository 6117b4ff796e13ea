// Routes one parsed HTTP request to its handler: the OpenAI endpoints, /v1/models, /health,
// /metrics. Free of Asio: the connection hands it plain strings and gets back either a whole
// response or a Generation to stream.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/openai_schema.h"
#include "server/server_state.h"

namespace tetra::server {

class Generation;

struct HttpRequest {
  std::string method;
  std::string target;
  std::string content_type;
  std::string authorization;
  std::string origin;                          // CORS
  std::string access_control_request_method;   // set on a CORS preflight
  std::string access_control_request_headers;
  std::string body;
  Clock::time_point arrival;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // close the connection after this response
};

struct RouteResult {
  HttpResponse response;                    // when generation is null
  std::shared_ptr<Generation> generation;   // submitted; the connection attaches and streams it
};

RouteResult route(ServerState& state, const HttpRequest& request);

// The error response for `e` (also used by the connection for 413/431).
HttpResponse error_response(const ApiError& e);

}  // namespace tetra::server

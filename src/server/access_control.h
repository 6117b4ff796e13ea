// Who may call the API: the API key (`--api-key`) and CORS (`--allowed-origins`). Both follow
// vLLM: the key guards /v1/* only (health and metrics stay open for probes and scrapers), and
// CORS answers preflights and marks responses to allowed origins.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tetra::server {

struct CorsOptions {
  std::vector<std::string> origins;  // "*": any; empty: CORS off (no header is ever added)
  std::vector<std::string> methods = {"*"};
  std::vector<std::string> headers = {"*"};
  bool allow_credentials = false;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// True when `authorization` is "Bearer K" for one of `keys`. Every key is compared in full,
// in time that does not depend on where the bytes differ.
bool api_key_matches(const std::vector<std::string>& keys, std::string_view authorization);

bool cors_origin_allowed(const CorsOptions& cors, std::string_view origin);
// The headers an actual (non-preflight) response to `origin` carries; none if not allowed.
HeaderList cors_response_headers(const CorsOptions& cors, std::string_view origin);

struct PreflightAnswer {
  bool allowed = false;
  std::string refusal;  // what was not allowed, when !allowed
  HeaderList headers;
};
PreflightAnswer cors_preflight(const CorsOptions& cors, std::string_view origin, std::string_view method,
                               std::string_view request_headers);

// A flag's list value: a JSON list of strings ('["a","b"]', as vLLM takes it) or a comma list
// ("a,b"). Throws tetra::Error naming `flag` on a malformed value.
std::vector<std::string> parse_list_flag(const std::string& flag, const std::string& value);

}  // namespace tetra::server

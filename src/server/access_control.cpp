#include "server/access_control.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

bool has_star(const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); }

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += ", ";
    out += s;
  }
  return out;
}

// Differences are OR-ed over every byte of `key`, so the time depends on the key's length only.
bool equal_constant_time(std::string_view key, std::string_view given) {
  unsigned diff = key.size() == given.size() ? 0u : 1u;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(key[i]) ^ g;
  }
  return diff == 0;
}

// Headers a browser may always send without asking (the CORS "safelisted" request headers).
const std::vector<std::string> kSafelistedHeaders = {"accept", "accept-language", "content-language",
                                                     "content-type"};

}  // namespace

bool api_key_matches(const std::vector<std::string>& keys, std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size() || lower(authorization.substr(0, kScheme.size())) != kScheme)
    return false;
  const std::string_view given = authorization.substr(kScheme.size());
  bool ok = false;
  for (const auto& key : keys) ok |= equal_constant_time(key, given);  // no early exit
  return ok;
}

bool cors_origin_allowed(const CorsOptions& cors, std::string_view origin) {
  if (origin.empty() || cors.origins.empty()) return false;
  return has_star(cors.origins) || std::find(cors.origins.begin(), cors.origins.end(), origin) != cors.origins.end();
}

HeaderList cors_response_headers(const CorsOptions& cors, std::string_view origin) {
  HeaderList h;
  if (!cors_origin_allowed(cors, origin)) return h;
  // "*" cannot be combined with credentials: then the origin is echoed (and caches told so).
  if (has_star(cors.origins) && !cors.allow_credentials) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
  }
  if (cors.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

PreflightAnswer cors_preflight(const CorsOptions& cors, std::string_view origin, std::string_view method,
                               std::string_view request_headers) {
  PreflightAnswer a;
  std::vector<std::string> refused;
  if (!cors_origin_allowed(cors, origin)) refused.push_back("origin");
  const bool any_method = has_star(cors.methods);
  if (!any_method && std::find(cors.methods.begin(), cors.methods.end(), std::string(method)) == cors.methods.end())
    refused.push_back("method");
  const bool any_header = has_star(cors.headers);
  if (!any_header) {
    std::string rest(request_headers);
    for (size_t start = 0; start <= rest.size();) {
      size_t comma = rest.find(',', start);
      if (comma == std::string::npos) comma = rest.size();
      const std::string name = lower(trim(std::string_view(rest).substr(start, comma - start)));
      start = comma + 1;
      if (name.empty()) continue;
      const bool listed = std::any_of(cors.headers.begin(), cors.headers.end(),
                                      [&](const std::string& h) { return lower(h) == name; }) ||
                          std::find(kSafelistedHeaders.begin(), kSafelistedHeaders.end(), name) !=
                              kSafelistedHeaders.end();
      if (!listed) {
        refused.push_back("headers");
        break;
      }
    }
  }
  if (!refused.empty()) {
    a.refusal = "Disallowed CORS " + join(refused);
    return a;
  }
  a.allowed = true;
  a.headers = cors_response_headers(cors, origin);
  a.headers.emplace_back("Access-Control-Allow-Methods",
                         any_method ? "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT" : join(cors.methods));
  if (any_header) {
    if (!request_headers.empty()) a.headers.emplace_back("Access-Control-Allow-Headers", std::string(request_headers));
  } else {
    std::vector<std::string> all = kSafelistedHeaders;
    all.insert(all.end(), cors.headers.begin(), cors.headers.end());
    a.headers.emplace_back("Access-Control-Allow-Headers", join(all));
  }
  a.headers.emplace_back("Access-Control-Max-Age", "600");
  return a;
}

std::vector<std::string> parse_list_flag(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  const std::string text = trim(value);
  if (!text.empty() && text.front() == '[') {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    TETRA_CHECK(j.is_array(), flag, " must be a JSON list of strings or a comma-separated list, got '", value, "'");
    for (const auto& v : j) {
      TETRA_CHECK(v.is_string(), flag, " must be a JSON list of strings, got '", value, "'");
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  for (size_t start = 0; start <= text.size();) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = trim(std::string_view(text).substr(start, comma - start));
    start = comma + 1;
    TETRA_CHECK(!item.empty(), flag, " has an empty item in '", value, "'");
    out.push_back(std::move(item));
  }
  return out;
}

}  // namespace tetra::server

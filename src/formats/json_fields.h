// Typed reads from one JSON object, for config files: every error is one sentence naming the
// file and the field ("config.json: \"hidden_size\" must be an integer, not a string.").
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra {

// A small JSON config file (config.json, generation_config.json), parsed: one sentence naming
// the file when it cannot be read, is over 16 MB (no config is), or is not JSON.
inline nlohmann::json read_json_file(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) > (uint64_t{16} << 20))
    fail(path.string(), " is larger than 16 MB, too large for a ", what, ".");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read ", path.string(), ".");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail(path.string(), " is not valid JSON (at byte ", e.byte, ").");
  }
}

// "a string", "null", ... for messages.
inline const char* json_kind(const nlohmann::json& v) {
  using nlohmann::json;
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a fractional number";
    default: return "an integer";
  }
}

// A null value is an error except where a reader says it means "absent" (transformers'
// `int | None` fields). `prefix` names a nested object in messages ("rope_scaling.").
class JsonFields {
 public:
  // Holds a reference to `j`, which must outlive this reader.
  JsonFields(const nlohmann::json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail_field(const std::string& key, const std::string& what) const {
    fail(source_, ": \"", prefix_, key, "\" ", what, ".");
  }
  const std::string& source() const { return source_; }

  // The value, or nullptr when the key is absent or null.
  const nlohmann::json* find(const std::string& key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) const { return find(key) != nullptr; }
  bool present(const std::string& key) const { return j_.contains(key); }

  int64_t to_integer(const nlohmann::json& v, const std::string& key) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      fail_field(key, "is too large");
    if (!v.is_number_integer()) fail_field(key, str_cat("must be an integer, not ", json_kind(v)));
    return v.get<int64_t>();
  }
  std::optional<int64_t> maybe_integer(const std::string& key) const {
    const nlohmann::json* v = find(key);
    return v ? std::optional<int64_t>(to_integer(*v, key)) : std::nullopt;
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    if (present(key) && j_.at(key).is_null()) fail_field(key, "must be an integer, not null");
    return maybe_integer(key).value_or(fallback);
  }
  std::optional<double> maybe_number(const std::string& key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail_field(key, str_cat("must be a number, not ", json_kind(*v)));
    return v->get<double>();
  }
  double number(const std::string& key, double fallback) const {
    if (present(key) && j_.at(key).is_null()) fail_field(key, "must be a number, not null");
    return maybe_number(key).value_or(fallback);
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!present(key)) return fallback;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_boolean()) fail_field(key, str_cat("must be true or false, not ", json_kind(v)));
    return v.get<bool>();
  }
  std::optional<std::string> maybe_string(const std::string& key) const {
    const nlohmann::json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail_field(key, str_cat("must be a string, not ", json_kind(*v)));
    return v->get<std::string>();
  }
  // An object or array field; nullptr when absent or null.
  const nlohmann::json* object(const std::string& key) const {
    const nlohmann::json* v = find(key);
    if (v && !v->is_object()) fail_field(key, str_cat("must be an object, not ", json_kind(*v)));
    return v;
  }
  const nlohmann::json* array(const std::string& key) const {
    const nlohmann::json* v = find(key);
    if (v && !v->is_array()) fail_field(key, str_cat("must be an array, not ", json_kind(*v)));
    return v;
  }
  // The first of several spellings that is present; two that disagree are an error.
  std::optional<int64_t> aliased_integer(std::initializer_list<const char*> keys) const {
    std::optional<int64_t> value;
    const char* first = nullptr;
    for (const char* key : keys) {
      std::optional<int64_t> v = maybe_integer(key);
      if (!v) continue;
      if (value && *v != *value)
        fail_field(key, str_cat("is ", *v, " but \"", first, "\" is ", *value,
                                "; they name the same setting"));
      if (!value) value = v, first = key;
    }
    return value;
  }

  // Bounds, checked after defaults are filled so the message gives the value actually used.
  void check_range(const std::string& key, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo || v > hi) fail_field(key, str_cat("is ", v, "; it must be between ", lo, " and ", hi));
  }

 private:
  const nlohmann::json& j_;
  std::string source_;
  std::string prefix_;
};

}  // namespace tetra

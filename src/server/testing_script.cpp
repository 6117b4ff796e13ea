#include "server/testing_script.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tetra::server {

TestingScript TestingScript::load(const std::string& path) {
  std::ifstream in(path);
  TETRA_CHECK(in.good(), "cannot read the testing script ", path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  TETRA_CHECK(j.is_array(), "the testing script ", path, " must be a JSON array of {\"when\", \"text\"}");
  TestingScript s;
  for (const auto& rule : j) {
    TETRA_CHECK(rule.is_object() && rule.contains("when") && rule["when"].is_string() && rule.contains("text") &&
                    rule["text"].is_string(),
                "each rule of the testing script ", path, " must be {\"when\": string, \"text\": string}");
    s.replies_.push_back({rule["when"].get<std::string>(), rule["text"].get<std::string>()});
  }
  return s;
}

const ScriptedReply* TestingScript::match(std::string_view prompt) const {
  for (const ScriptedReply& r : replies_)
    if (prompt.find(r.when) != std::string_view::npos) return &r;
  return nullptr;
}

}  // namespace tetra::server

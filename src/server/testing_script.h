// Test-only: scripted replies (TETRA_TESTING_SCRIPT=FILE on `tetra serve`). A random tiny model
// never writes a tool call or a <think> block, so end-to-end tests replace its tokens with the
// tokens of a chosen text: the engine still runs the request (scheduling, KV, timing), and the
// server uses the scripted token at each position instead of the sampled one. Never set in
// production; the server logs it at start.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tetra::server {

struct ScriptedReply {
  std::string when;  // the rule applies when the rendered prompt contains this text
  std::string text;  // the reply, encoded with special tokens parsed (markers become tokens)
};

class TestingScript {
 public:
  // FILE: a JSON array [{"when": "...", "text": "..."}, ...]; throws tetra::Error naming the
  // problem.
  static TestingScript load(const std::string& path);
  // The first rule, in file order, whose `when` occurs in `prompt`; null when none does.
  const ScriptedReply* match(std::string_view prompt) const;
  size_t size() const { return replies_.size(); }

 private:
  std::vector<ScriptedReply> replies_;
};

}  // namespace tetra::server

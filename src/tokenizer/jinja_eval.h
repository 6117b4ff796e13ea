// Evaluator for parsed chat templates. Sandboxed by construction: the only functions a
// template can reach are the builtins below (no file, OS or attribute access beyond data),
// and it runs under bounded steps, output size, and call depth.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace tetra::tok::jinja {

struct Limits {
  uint64_t max_steps = 20'000'000;         // evaluated nodes
  size_t max_output_bytes = 64u << 20;     // rendered text, and any one string value
  int max_call_depth = 64;                 // nested macro calls
};

class Interpreter {
 public:
  explicit Interpreter(Limits limits = {});
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `tmpl` with `globals` (messages, tools, ...) on top of the builtins.
  std::string render(const Body& tmpl, const std::vector<std::pair<std::string, Value>>& globals);

  // For builtins: raise an error at the line being evaluated. Arguments are taken by value
  // so that string literals decay and share one instantiation.
  template <typename... Args>
  [[noreturn]] void error(Args... args) const {
    raise(str_cat(args...));
  }
  [[noreturn]] void raise(const std::string& message) const;
  // For builtins that build strings: refuses results over the output limit.
  void check_size(size_t bytes) const;
  int line() const { return line_; }

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Frame> parent;
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body, std::string& out);
  Flow exec_node(const Node& n, std::string& out);
  void exec_for(const Node& n, std::string& out);
  void exec_set(const Node& n, std::string& out);
  void define_macro(const Node& n);
  bool contains(const Value& v, const Dict& d);
  Value eval(const Node& n);
  Value eval_binary(const Node& n);
  Value eval_compare(const Node& n);
  Value eval_call(const Node& n);
  Value eval_filter(const Node& n, Value input);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void step();
  void append(std::string& out, const std::string& s);

  Limits limits_;
  uint64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;
  std::shared_ptr<Frame> frame_;
  // A macro holds the frame it was defined in, and that frame holds the macro: a cycle that
  // the destructor breaks by dropping every macro's body.
  std::vector<std::shared_ptr<Callable>> macros_;
};

// Builtins (jinja_builtins.cpp).
Value get_attr(Interpreter& in, const Value& obj, const std::string& name);
Value get_item(Interpreter& in, const Value& obj, const Value& key);
Value apply_filter(Interpreter& in, const std::string& name, Value input, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
std::vector<std::pair<std::string, Value>> builtin_globals();
// Python iteration: list items, dict keys, string characters; throws otherwise.
List iterate(Interpreter& in, const Value& v);

}  // namespace tetra::tok::jinja

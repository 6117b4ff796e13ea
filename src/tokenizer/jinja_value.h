// Values of the chat-template language: Python's None/bool/int/float/str/list/dict as Jinja2
// sees them, plus Jinja's Undefined and callables (macros, builtins). Lists and dicts are
// shared by reference, as in Python; strings are UTF-8.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tetra::tok::jinja {

class Value;
using List = std::vector<Value>;
struct Dict;
struct Callable;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

class Value {
 public:
  Value() = default;  // Undefined
  static Value undefined(std::string name = {});
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items = {}, bool tuple = false);
  static Value dict(std::shared_ptr<Dict> d);
  static Value callable(std::shared_ptr<Callable> c);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::Float ? static_cast<int64_t>(f_) : kind_ == Kind::Bool ? b_ : i_; }
  double as_float() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return s_; }
  List& items() const { return *list_; }
  bool is_tuple() const { return tuple_; }
  Dict& dict_ref() const { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  Callable& fn() const { return *fn_; }
  // For messages: the name an Undefined came from.
  const std::string& undefined_name() const { return s_; }

  bool truthy() const;
  // Python str(): what {{ value }} prints (Undefined prints nothing).
  std::string to_str() const;
  // Python repr(), used for items inside printed lists and dicts.
  std::string repr() const;
  // Python json.dumps(value, ensure_ascii=..., indent=..., sort_keys=...), as transformers'
  // tojson filter; throws for values JSON cannot hold.
  std::string to_json(int indent = -1, bool ensure_ascii = false, bool sort_keys = false,
                      std::string item_sep = "", std::string key_sep = "") const;
  // Python len() where defined; -1 otherwise.
  int64_t length() const;

  // Objects keep their key order (ordered_json), as Python dicts do.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// Insertion-ordered string-keyed mapping, like a Python dict (keys are strings here).
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;  // namespace() objects accept attribute assignment
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

class Interpreter;
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  const Value* get(size_t index, std::string_view name) const;  // positional or named
};
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

// Python semantics shared by the evaluator and the builtins.
bool values_equal(const Value& a, const Value& b);
// <0, 0, >0; throws tetra::Error when Python would raise TypeError.
int values_compare(const Value& a, const Value& b);
std::string py_float_repr(double f);
bool py_isspace(char32_t c);

}  // namespace tetra::tok::jinja

// Filters, tests and globals of the chat-template language, with Python/Jinja2 semantics.
// Only what chat templates use; an unknown name is an error, never a no-op.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>

#include <utf8proc.h>

#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace tetra::tok::jinja {

using namespace text;

namespace {

bool truthy_arg(const CallArgs& a, size_t k, const char* name, bool dflt) {
  const Value* v = a.get(k, name);
  return v ? v->truthy() : dflt;
}

// transformers' override of tojson: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), positional in that order, no HTML escaping.
Value filter_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* ensure = a.get(0, "ensure_ascii");
  const Value* indent = a.get(1, "indent");
  const Value* seps = a.get(2, "separators");
  const Value* sort = a.get(3, "sort_keys");
  std::string item_sep, key_sep;  // empty: json.dumps defaults
  if (seps && !seps->is_none()) {
    if (!seps->is_list() || seps->items().size() != 2 || !seps->items()[0].is_string() || !seps->items()[1].is_string())
      in.error("tojson separators must be a pair of strings");
    item_sep = seps->items()[0].str();
    key_sep = seps->items()[1].str();
  }
  int ind = indent && !indent->is_none() ? static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64)) : -1;
  try {
    std::string s = v.to_json(ind, ensure && ensure->truthy(), sort && sort->truthy(), item_sep, key_sep);
    in.check_size(s.size());
    return Value(std::move(s));
  } catch (const Error& e) {
    in.error(e.what());
  }
}

// map / select / reject / selectattr / rejectattr.
Value filter_select(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  List items = iterate(in, v), out;
  const Value* attr_named = nullptr;
  const Value* dflt = nullptr;
  for (auto& [k, x] : a.named) {
    if (k == "attribute") attr_named = &x;
    if (k == "default") dflt = &x;
  }
  if (name == "map" && attr_named) {
    for (const Value& item : items) {
      Value r = attribute_path(in, item, attr_named->to_str());
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return Value::list(std::move(out));
  }
  bool by_attr = name == "selectattr" || name == "rejectattr";
  size_t first_arg = by_attr ? 1 : 0;
  if (by_attr && a.positional.empty()) in.error(name, " needs an attribute name");
  std::string fname = a.positional.size() > first_arg ? a.positional[first_arg].to_str() : "";
  CallArgs rest;
  for (size_t k = first_arg + 1; k < a.positional.size(); ++k) rest.positional.push_back(a.positional[k]);
  for (const Value& item : items) {
    Value subject = by_attr ? attribute_path(in, item, a.positional[0].to_str()) : item;
    CallArgs copy = rest;
    if (name == "map") {
      if (fname.empty()) in.error("map needs a filter name or attribute=");
      out.push_back(apply_filter(in, fname, subject, copy));
      continue;
    }
    bool ok = fname.empty() ? subject.truthy() : apply_test(in, fname, subject, copy);
    if (ok == (name == "select" || name == "selectattr")) out.push_back(item);
  }
  return Value::list(std::move(out));
}

// sort / min / max / dictsort.
Value filter_sort(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  bool dictsort = name == "dictsort";
  bool reverse = truthy_arg(a, dictsort ? 2 : 0, "reverse", false);
  bool cs = truthy_arg(a, dictsort ? 0 : (name == "sort" ? 1 : 0), "case_sensitive", false);
  const Value* attr = dictsort ? nullptr : a.get(name == "sort" ? 2 : 1, "attribute");
  bool by_value = dictsort && a.get(1, "by") && a.get(1, "by")->to_str() == "value";
  List items;
  if (dictsort) {
    if (!v.is_dict()) in.error("dictsort needs a mapping");
    for (auto& [k, x] : v.dict_ref().entries) items.push_back(Value::list({Value(k), x}, true));
  } else {
    items = iterate(in, v);
  }
  auto key = [&](const Value& item) {
    if (dictsort) return item.items()[by_value ? 1 : 0];
    return attr && !attr->is_none() ? attribute_path(in, item, attr->to_str()) : item;
  };
  if (name == "min" || name == "max") {
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const Value& item : items) {
      int c = sort_compare(in, key(item), key(best), cs);
      if (name == "min" ? c < 0 : c > 0) best = item;
    }
    return best;
  }
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = sort_compare(in, key(x), key(y), cs);
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value filter_number(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "int" || name == "float") {
    const Value* dflt = a.get(0, "default");
    bool to_int = name == "int";
    if (v.is_number()) return to_int ? Value(v.as_int()) : Value(v.as_float());
    if (v.is_string()) {
      std::string s = strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      if (to_int) {
        errno = 0;
        long long x = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && end && *end == 0 && errno == 0) return Value(static_cast<int64_t>(x));
      }
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0 && std::isfinite(f))
        return to_int ? Value(static_cast<int64_t>(f)) : Value(f);
    }
    return dflt ? *dflt : to_int ? Value(int64_t{0}) : Value(0.0);
  }
  if (name == "abs") {
    if (!v.is_number()) in.error("abs needs a number");
    return v.kind() == Kind::Float ? Value(std::fabs(v.as_float())) : Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (name == "round") {
    const Value* prec = a.get(0, "precision");
    const Value* method = a.get(1, "method");
    double p = std::pow(10.0, prec ? static_cast<double>(prec->as_int()) : 0.0);
    std::string m = method ? method->to_str() : "common";
    double x = v.as_float() * p;
    x = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::round(x);
    return Value(x / p);
  }
  // sum
  const Value* attr = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  Value total = start ? *start : Value(int64_t{0});
  for (const Value& item : iterate(in, v)) {
    Value x = attr && !attr->is_none() ? attribute_path(in, item, attr->to_str()) : item;
    if (!x.is_number() || !total.is_number()) in.error("sum needs numbers");
    bool ints = total.kind() != Kind::Float && x.kind() != Kind::Float;
    total = ints ? Value(total.as_int() + x.as_int()) : Value(total.as_float() + x.as_float());
  }
  return total;
}

// Jinja2 3.1's indent: the text gets a trailing newline, is split into lines, and every line
// but the first (and blank ones unless `blank`) is prefixed.
Value filter_indent(Interpreter& in, const Value& v, CallArgs& a) {
  const Value* w = a.get(0, "width");
  std::string pad = w && w->is_string() ? w->str()
                                        : std::string(static_cast<size_t>(std::clamp<int64_t>(w ? w->as_int() : 4, 0, 1000)), ' ');
  bool first = truthy_arg(a, 1, "first", false), blank = truthy_arg(a, 2, "blank", false);
  std::string s = v.to_str() + "\n";
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t k = 0; k < s.size(); ++k)
    if (s[k] == '\n') {
      lines.push_back(s.substr(b, k - b));
      b = k + 1;
    }
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) out += "\n";
    if (k > 0 && (blank || !lines[k].empty())) out += pad;
    out += lines[k];
    in.check_size(out.size());
  }
  return Value(first ? pad + out : out);
}

Value filter_text(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "trim") return Value(strip(v.to_str(), a.get(0, "chars"), true, true));
  if (name == "upper") return Value(map_case(v.to_str(), to_upper));
  if (name == "lower") return Value(map_case(v.to_str(), to_lower));
  if (name == "capitalize") return Value(capitalize(v.to_str()));
  if (name == "title") {  // Jinja2: words begin after runs of -, whitespace, ( { [ <
    std::string out;
    bool start = true;
    for (char32_t c : code_points(v.to_str())) {
      bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
      utf8_append(out, sep ? c : start ? to_upper(c) : to_lower(c));
      start = sep;
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    const Value* c = a.get(2, "count");
    std::string r = replace(v.to_str(), need_string(in, a.get(0, "old"), "replace"),
                            a.get(1, "new") ? a.get(1, "new")->to_str() : "", c && !c->is_none() ? c->as_int() : -1);
    in.check_size(r.size());
    return Value(std::move(r));
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : v.to_str()) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value(std::move(out));
  }
  // wordcount: runs of Python's \w (letters, numbers, underscore)
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : code_points(v.to_str())) {
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    bool w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
             (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    n += w && !in_word;
    in_word = w;
  }
  return Value(n);
}

Value filter_sequence(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (Value item : iterate(in, v)) {
      if (attr && !attr->is_none()) item = attribute_path(in, item, attr->to_str());
      if (!first && sep) out += sep->to_str();
      out += item.to_str();
      first = false;
      in.check_size(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    List items = iterate(in, v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(in, v));
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) in.error("items filter needs a mapping");
    CallArgs none;
    return get_attr(in, v, "items").fn().fn(in, none);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<char32_t> cps = code_points(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value(from_code_points(cps));
    }
    List items = iterate(in, v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  // unique
  bool cs = truthy_arg(a, 0, "case_sensitive", false);
  const Value* attr = a.get(1, "attribute");
  List out, keys;
  for (const Value& item : iterate(in, v)) {
    Value key = attr && !attr->is_none() ? attribute_path(in, item, attr->to_str()) : item;
    if (!cs && key.is_string()) key = Value(map_case(key.str(), to_lower));
    bool seen = false;
    for (const Value& k : keys) seen |= values_equal(k, key);
    if (!seen) keys.push_back(key), out.push_back(item);
  }
  return Value::list(std::move(out));
}

bool is_one_of(const std::string& name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

}  // namespace

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  const Value* arg = a.get(0, "other");
  auto need_arg = [&]() -> const Value& {
    if (!arg) in.error("test '", name, "' needs an argument");
    return *arg;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Kind::Bool;
  if (name == "true") return v.kind() == Kind::Bool && v.as_bool();
  if (name == "false") return v.kind() == Kind::Bool && !v.as_bool();
  if (name == "integer") return v.kind() == Kind::Int;
  if (name == "float") return v.kind() == Kind::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict_ref().is_namespace;
  // Jinja2's Undefined can be iterated (it is empty), so it counts as iterable.
  if (name == "iterable" || name == "sequence") return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.kind() == Kind::Callable;
  if (name == "sameas") {
    const Value& o = need_arg();
    if (v.kind() != o.kind()) return false;
    if (v.is_none()) return true;
    if (v.kind() == Kind::Bool) return v.as_bool() == o.as_bool();
    if (v.is_list()) return &v.items() == &o.items();
    if (v.is_dict()) return v.dict_ptr() == o.dict_ptr();
    return values_equal(v, o);
  }
  if (is_one_of(name, {"eq", "equalto", "=="})) return values_equal(v, need_arg());
  if (is_one_of(name, {"ne", "!="})) return !values_equal(v, need_arg());
  if (is_one_of(name, {"lt", "<", "le", "<=", "gt", ">", "ge", ">="})) {
    int c = sort_compare(in, v, need_arg(), true);
    if (name == "lt" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == ">") return c > 0;
    return c >= 0;
  }
  if (is_one_of(name, {"odd", "even", "divisibleby"})) {
    if (!v.is_number()) in.error("test '", name, "' needs a number");
    int64_t d = name == "divisibleby" ? need_arg().as_int() : 2;
    if (d == 0) in.error("division by zero");
    int64_t r = v.as_int() % d;
    return name == "odd" ? r != 0 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    CallArgs none;
    return get_attr(in, v, name == "lower" ? "islower" : "isupper").fn().fn(in, none).truthy();
  }
  if (name == "in") {
    const Value& seq = need_arg();
    if (seq.is_undefined()) undefined_error(in, seq);
    if (seq.is_string()) {
      if (!v.is_string()) in.error("'in <string>' requires a string on the left");
      return seq.str().find(v.str()) != std::string::npos;
    }
    if (seq.is_dict()) return v.is_string() && seq.dict_ref().find(v.str()) != nullptr;
    if (seq.is_list()) {
      for (const Value& x : seq.items())
        if (values_equal(x, v)) return true;
      return false;
    }
    in.error("argument of type ", seq.repr(), " is not iterable");
  }
  in.error("no test named '", name, "'");
}

Value apply_filter(Interpreter& in, const std::string& name, Value v, CallArgs& a) {
  if (name == "default" || name == "d") {
    const Value* dflt = a.get(0, "default_value");
    if (v.is_undefined() || (truthy_arg(a, 1, "boolean", false) && !v.truthy())) return dflt ? *dflt : Value("");
    return v;
  }
  if (name == "length" || name == "count") {
    int64_t n = v.length();
    if (n < 0) in.error("object of type ", v.repr(), " has no len()");
    return Value(n);
  }
  if (name == "tojson") return filter_tojson(in, v, a);
  if (name == "string") return Value(v.to_str());
  if (name == "safe") return v;
  if (name == "indent") return filter_indent(in, v, a);
  if (is_one_of(name, {"trim", "upper", "lower", "capitalize", "title", "replace", "escape", "e", "wordcount"}))
    return filter_text(in, name, v, a);
  if (is_one_of(name, {"join", "first", "last", "list", "items", "reverse", "unique"}))
    return filter_sequence(in, name, v, a);
  if (is_one_of(name, {"map", "select", "reject", "selectattr", "rejectattr"})) return filter_select(in, name, v, a);
  if (is_one_of(name, {"sort", "min", "max", "dictsort"})) return filter_sort(in, name, v, a);
  if (is_one_of(name, {"int", "float", "abs", "round", "sum"})) return filter_number(in, name, v, a);
  in.error("no filter named '", name, "'");
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", make_fn("range", [](Interpreter& in, CallArgs& a) -> Value {
    if (a.positional.empty() || a.positional.size() > 3) in.error("range expects 1 to 3 arguments");
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = a.positional[0].as_int();
    else start = a.positional[0].as_int(), stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
    if (step == 0) in.error("range step must not be zero");
    double n = std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
    if (n > 1'000'000) in.error("range of ", static_cast<int64_t>(n), " items is too large");
    List out;
    for (int64_t k = 0; k < static_cast<int64_t>(n); ++k) out.push_back(Value(start + k * step));
    return Value::list(std::move(out));
  }));
  auto make_dict = [](bool ns) {
    return [ns](Interpreter& in, CallArgs& a) -> Value {
      auto d = std::make_shared<Dict>();
      d->is_namespace = ns;
      for (const Value& p : a.positional) {
        if (!p.is_dict()) in.error(ns ? "namespace" : "dict", "() takes mappings and keyword arguments");
        for (auto& [k, v] : p.dict_ref().entries) d->set(k, v);
      }
      for (auto& [k, v] : a.named) d->set(k, v);
      return Value::dict(d);
    };
  };
  g.emplace_back("namespace", make_fn("namespace", make_dict(true)));
  g.emplace_back("dict", make_fn("dict", make_dict(false)));
  g.emplace_back("raise_exception", make_fn("raise_exception", [](Interpreter& in, CallArgs& a) -> Value {
    in.error("template raised an exception: ", a.positional.empty() ? std::string() : a.positional[0].to_str());
  }));
  g.emplace_back("strftime_now", make_fn("strftime_now", [](Interpreter& in, CallArgs& a) -> Value {
    if (a.positional.empty() || !a.positional[0].is_string()) in.error("strftime_now needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a.positional[0].str().c_str(), &tm);
    return Value(std::string(buf, n));
  }));
  return g;
}

}  // namespace tetra::tok::jinja

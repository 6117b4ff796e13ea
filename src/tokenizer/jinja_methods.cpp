// Attribute and item access for chat templates, and the Python methods of str, dict and list
// that templates call (content.split(...), message.items(), ...).
#include <algorithm>
#include <cctype>

#include <utf8proc.h>

#include "tokenizer/jinja_text.h"
#include "tokenizer/utf8.h"

namespace tetra::tok::jinja {

namespace text {

Value make_fn(const std::string& name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->fn = std::move(fn);
  return Value::callable(c);
}

std::vector<char32_t> code_points(const std::string& s) {
  std::vector<char32_t> cps;
  size_t i = 0;
  while (i < s.size()) cps.push_back(utf8_next(s, i));
  return cps;
}

std::string from_code_points(const std::vector<char32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < std::min(e, cps.size()); ++k) utf8_append(out, cps[k]);
  return out;
}

char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

bool is_cased_letter(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) utf8_append(out, f(utf8_next(s, i)));
  return out;
}

std::string capitalize(const std::string& s) {
  std::vector<char32_t> cps = code_points(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) utf8_append(out, k == 0 ? to_title(cps[k]) : to_lower(cps[k]));
  return out;
}

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> cps = code_points(s);
  std::vector<char32_t> set;
  bool ws = !chars || chars->is_none();
  if (!ws) set = code_points(chars->str());
  auto drop = [&](char32_t c) { return ws ? py_isspace(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) ++b;
  if (right)
    while (e > b && drop(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

List split(Interpreter& in, const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty strings
    std::vector<char32_t> cps = code_points(s);
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && py_isspace(cps[k])) ++k;
      if (k >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > k && py_isspace(cps[e - 1])) --e;
        out.push_back(Value(from_code_points(cps, k, e)));
        return out;
      }
      size_t b = k;
      while (k < cps.size() && !py_isspace(cps[k])) ++k;
      out.push_back(Value(from_code_points(cps, b, k)));
    }
    return out;
  }
  if (!sep->is_string()) in.error("split separator must be a string");
  const std::string& d = sep->str();
  if (d.empty()) in.error("empty separator");
  size_t b = 0;
  while (true) {
    size_t p = s.find(d, b);
    if (p == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) break;
    out.push_back(Value(s.substr(b, p - b)));
    b = p + d.size();
  }
  out.push_back(Value(s.substr(b)));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    std::vector<char32_t> cps = code_points(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) out += to, ++n;
      if (k < cps.size()) utf8_append(out, cps[k]);
    }
    return out;
  }
  size_t b = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(from, b);
    if (p == std::string::npos) break;
    out += s.substr(b, p - b) + to;
    b = p + from.size();
    ++n;
  }
  return out + s.substr(b);
}

const std::string& need_string(Interpreter& in, const Value* v, const char* what) {
  if (!v || !v->is_string()) in.error(what, " needs a string argument");
  return v->str();
}

void undefined_error(Interpreter& in, const Value& v) {
  if (v.undefined_name().empty()) in.error("a value is undefined");
  in.error("'", v.undefined_name(), "' is undefined");
}

Value attribute_path(Interpreter& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  while (true) {
    size_t dot = path.find('.', b);
    std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    bool numeric = !part.empty() && part.size() < 18 &&
                   std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = numeric ? get_item(in, cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_attr(in, cur, part);
    if (dot == std::string::npos) return cur;
    b = dot + 1;
  }
}

int sort_compare(Interpreter& in, const Value& a, const Value& b, bool case_sensitive) {
  try {
    if (!case_sensitive && a.is_string() && b.is_string())
      return values_compare(Value(map_case(a.str(), to_lower)), Value(map_case(b.str(), to_lower)));
    return values_compare(a, b);
  } catch (const Error& e) {
    in.error(e.what());
  }
}

}  // namespace text

using namespace text;

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.size() >= p.size() && s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Python str.isdigit/isalpha/... over code points (utf8proc categories).
bool char_class(const std::string& s, const std::string& name) {
  std::vector<char32_t> cps = code_points(s);
  if (cps.empty()) return false;
  bool cased = false;
  for (char32_t c : cps) {
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    bool digit = cat == UTF8PROC_CATEGORY_ND;
    if (name == "isdigit" && !digit) return false;
    if (name == "isalpha" && !letter) return false;
    if (name == "isalnum" && !letter && !digit && cat != UTF8PROC_CATEGORY_NL && cat != UTF8PROC_CATEGORY_NO) return false;
    if (name == "isspace" && !py_isspace(c)) return false;
    if (name == "isupper" && (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT)) return false;
    if (name == "islower" && (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)) return false;
    cased |= is_cased_letter(c);
  }
  return name == "isupper" || name == "islower" ? cased : true;
}

// A bound method of a string; Undefined for names str does not have.
Value string_method(const std::string& s, const std::string& name) {
  static const char* const kNames[] = {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                                       "upper", "lower", "capitalize", "title", "replace", "find", "rfind", "count",
                                       "join", "splitlines", "removeprefix", "removesuffix", "isdigit", "isalpha",
                                       "isalnum", "isspace", "isupper", "islower"};
  if (std::find_if(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; }) == std::end(kNames))
    return Value::undefined(name);
  return make_fn(name, [s, name](Interpreter& in, CallArgs& a) -> Value {
    if (name == "startswith" || name == "endswith") {
      const Value* arg = a.get(0, "prefix");
      if (!arg) in.error(name, " needs an argument");
      List options = arg->is_list() ? arg->items() : List{*arg};
      for (const Value& o : options) {
        const std::string& p = need_string(in, &o, name.c_str());
        if (name == "startswith" ? starts_with(s, p) : ends_with(s, p)) return Value(true);
      }
      return Value(false);
    }
    if (name == "split" || name == "rsplit") {
      const Value* m = a.get(1, "maxsplit");
      return Value::list(split(in, s, a.get(0, "sep"), m ? m->as_int() : -1));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value(strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
    if (name == "upper") return Value(map_case(s, to_upper));
    if (name == "lower") return Value(map_case(s, to_lower));
    if (name == "capitalize") return Value(capitalize(s));
    if (name == "title") {  // Python: a letter after a cased letter is lowered, others titled
      std::string out;
      bool prev_cased = false;
      size_t i = 0;
      while (i < s.size()) {
        char32_t c = utf8_next(s, i);
        utf8_append(out, prev_cased ? to_lower(c) : to_title(c));
        prev_cased = is_cased_letter(c);
      }
      return Value(std::move(out));
    }
    if (name == "replace") {
      const Value* c = a.get(2, "count");
      std::string r = replace(s, need_string(in, a.get(0, "old"), "replace"), need_string(in, a.get(1, "new"), "replace"),
                              c ? c->as_int() : -1);
      in.check_size(r.size());
      return Value(std::move(r));
    }
    if (name == "find" || name == "rfind" || name == "count") {
      const std::string& sub = need_string(in, a.get(0, "sub"), name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value(Value(s).length() + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value(n);
      }
      size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) return Value(int64_t{-1});
      return Value(Value(s.substr(0, p)).length());  // code point index, as Python
    }
    if (name == "join") {
      const Value* v = a.get(0, "iterable");
      if (!v) in.error("join needs an argument");
      std::string out;
      bool first = true;
      for (const Value& item : iterate(in, *v)) {
        if (!item.is_string()) in.error("join expects strings");
        if (!first) out += s;
        out += item.str();
        first = false;
        in.check_size(out.size());
      }
      return Value(std::move(out));
    }
    if (name == "splitlines") {
      List out;
      size_t b = 0;
      for (size_t k = 0; k < s.size(); ++k)
        if (s[k] == '\n' || s[k] == '\r') {
          out.push_back(Value(s.substr(b, k - b)));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          b = k + 1;
        }
      if (b < s.size()) out.push_back(Value(s.substr(b)));
      return Value::list(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const std::string& x = need_string(in, a.get(0, "x"), name.c_str());
      if (name == "removeprefix" && starts_with(s, x)) return Value(s.substr(x.size()));
      if (name == "removesuffix" && ends_with(s, x)) return Value(s.substr(0, s.size() - x.size()));
      return Value(s);
    }
    return Value(char_class(s, name));
  });
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return Value();
  std::shared_ptr<Dict> d = obj.dict_ptr();
  return make_fn(name, [d, name](Interpreter& in, CallArgs& a) -> Value {
    if (name == "get") {
      const Value* key = a.get(0, "key");
      if (!key) in.error("get needs a key");
      const Value* dflt = a.get(1, "default");
      const Value* v = key->is_string() ? d->find(key->str()) : nullptr;
      return v ? *v : dflt ? *dflt : Value::none();
    }
    List out;
    for (auto& [k, v] : d->entries) {
      if (name == "items") out.push_back(Value::list({Value(k), v}, true));
      else out.push_back(name == "keys" ? Value(k) : v);
    }
    return Value::list(std::move(out));
  });
}

Value list_method(const Value& obj, const std::string& name) {
  if (name != "index" && name != "count") return Value();
  Value self = obj;
  return make_fn(name, [self, name](Interpreter& in, CallArgs& a) -> Value {
    const Value* x = a.get(0, "x");
    if (!x) in.error(name, " needs an argument");
    int64_t n = 0;
    for (size_t k = 0; k < self.items().size(); ++k)
      if (values_equal(self.items()[k], *x)) {
        if (name == "index") return Value(static_cast<int64_t>(k));
        ++n;
      }
    if (name == "index") in.error(x->repr(), " is not in list");
    return Value(n);
  });
}

}  // namespace

List iterate(Interpreter& in, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List: return v.items();
    case Kind::Dict: {
      List out;
      for (auto& e : v.dict_ref().entries) out.push_back(Value(e.first));
      return out;
    }
    case Kind::String: {
      List out;
      size_t i = 0;
      const std::string& s = v.str();
      while (i < s.size()) {
        size_t b = i;
        utf8_next(s, i);
        out.push_back(Value(s.substr(b, i - b)));
      }
      return out;
    }
    default: in.error(v.repr(), " is not iterable");
  }
}

// Jinja2's sandboxed getattr: a Python attribute (a method) first, then the item.
Value get_attr(Interpreter& in, const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::Undefined: undefined_error(in, obj);
    case Kind::Dict: {
      if (!obj.dict_ref().is_namespace) {
        Value m = dict_method(obj, name);
        if (!m.is_undefined()) return m;
      }
      const Value* v = obj.dict_ref().find(name);
      return v ? *v : Value::undefined(name);
    }
    case Kind::String: return string_method(obj.str(), name);
    case Kind::List: {
      Value m = list_method(obj, name);
      return m.is_undefined() ? Value::undefined(name) : m;
    }
    default: return Value::undefined(name);
  }
}

// Jinja2's getitem: the item first, then a Python attribute of that name.
Value get_item(Interpreter& in, const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(in, obj);
  if (obj.is_dict()) {
    if (!key.is_string()) return Value::undefined();
    const Value* v = obj.dict_ref().find(key.str());
    return v ? *v : get_attr(in, obj, key.str());
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind() == Kind::Int || key.kind() == Kind::Bool)) {
    List chars;
    const List& seq = obj.is_list() ? obj.items() : (chars = iterate(in, obj));
    int64_t k = key.as_int(), n = static_cast<int64_t>(seq.size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Value::undefined();
    return seq[static_cast<size_t>(k)];
  }
  if (key.is_string()) return get_attr(in, obj, key.str());
  return Value::undefined();
}

}  // namespace tetra::tok::jinja

#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace tetra::tok::jinja {

namespace {

// Deeper JSON than this in messages or tools is refused rather than recursed into.
constexpr int kMaxJsonDepth = 256;

// Python's str.isprintable(): false for Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than space.
bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string py_str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  char buf[16];
  while (i < s.size()) {
    char32_t c = utf8_next(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c >= 0x80 && !py_isprintable(c)) {
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  char buf[16];
  while (i < s.size()) {
    char32_t c = utf8_next(s, i);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8_append(out, c);
        }
    }
  }
  out += '"';
}

}  // namespace

bool py_isspace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed when -4 <= exponent < 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  int exp = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    std::snprintf(buf, sizeof buf, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += buf;
  }
  return out;
}

Value Value::undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double f) : kind_(Kind::Float), f_(f) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::move(s)) {}
Value Value::list(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::List;
  v.tuple_ = tuple;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::move(d);
  return v;
}
Value Value::callable(std::shared_ptr<Callable> c) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::move(c);
  return v;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : named)
    if (k == name) return &v;
  return index < positional.size() ? &positional[index] : nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_ != 0;
    case Kind::String: return !s_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->entries.empty();
    case Kind::Callable: return true;
  }
  return false;
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return py_float_repr(f_);
    case Kind::String: return py_str_repr(s_);
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t k = 0; k < list_->size(); ++k) out += (k ? ", " : "") + (*list_)[k].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::Dict: {
      if (dict_->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        out += (first ? "" : ", ") + py_str_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + "}";
    }
    case Kind::Callable: return "<function " + fn_->name + ">";
  }
  return "";
}

std::string Value::to_json(int indent, bool ensure_ascii, bool sort_keys, std::string item_sep,
                           std::string key_sep) const {
  // json.dumps defaults: ", " and ": " without indent, "," and ": " with it.
  if (item_sep.empty()) item_sep = indent >= 0 ? "," : ", ";
  if (key_sep.empty()) key_sep = ": ";
  std::string out;
  std::function<void(const Value&, int)> emit = [&](const Value& v, int level) {
    auto newline = [&](int lvl) {
      if (indent < 0) return;
      out += '\n';
      out.append(static_cast<size_t>(indent * lvl), ' ');
    };
    switch (v.kind_) {
      case Kind::None: out += "null"; break;
      case Kind::Bool: out += v.b_ ? "true" : "false"; break;
      case Kind::Int: out += std::to_string(v.i_); break;
      case Kind::Float:
        if (std::isnan(v.f_)) out += "NaN";
        else if (std::isinf(v.f_)) out += v.f_ > 0 ? "Infinity" : "-Infinity";
        else out += py_float_repr(v.f_);
        break;
      case Kind::String: json_string(out, v.s_, ensure_ascii); break;
      case Kind::List:
        if (v.list_->empty()) {
          out += "[]";
          break;
        }
        out += "[";
        for (size_t k = 0; k < v.list_->size(); ++k) {
          if (k) out += item_sep;
          newline(level + 1);
          emit((*v.list_)[k], level + 1);
        }
        newline(level);
        out += "]";
        break;
      case Kind::Dict: {
        if (v.dict_->entries.empty()) {
          out += "{}";
          break;
        }
        std::vector<const std::pair<std::string, Value>*> entries;
        for (const auto& e : v.dict_->entries) entries.push_back(&e);
        if (sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += "{";
        bool first = true;
        for (const auto* e : entries) {
          if (!first) out += item_sep;
          first = false;
          newline(level + 1);
          json_string(out, e->first, ensure_ascii);
          out += key_sep;
          emit(e->second, level + 1);
        }
        newline(level);
        out += "}";
        break;
      }
      case Kind::Undefined: fail("Object of type Undefined is not JSON serializable");
      case Kind::Callable: fail("Object of type function is not JSON serializable");
    }
  };
  emit(*this, 0);
  return out;
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::String: {
      int64_t n = 0;
      for (unsigned char c : s_) n += (c & 0xC0) != 0x80;
      return n;
    }
    case Kind::List: return static_cast<int64_t>(list_->size());
    case Kind::Dict: return static_cast<int64_t>(dict_->entries.size());
    case Kind::Undefined: return 0;
    default: return -1;
  }
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  TETRA_CHECK(depth < kMaxJsonDepth, "chat input is nested deeper than ", kMaxJsonDepth, " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(u)) : Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(it.key(), from_json(it.value(), depth + 1));
      return dict(d);
    }
    default: fail("chat input holds a value JSON templates cannot use");
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined: case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t k = 0; k < a.items().size(); ++k)
        if (!values_equal(a.items()[k], b.items()[k])) return false;
      return true;
    }
    case Kind::Dict: {
      const Dict &x = a.dict_ref(), &y = b.dict_ref();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* w = y.find(k);
        if (!w || !values_equal(v, *w)) return false;
      }
      return true;
    }
    case Kind::Callable: return &a.fn() == &b.fn();
    default: return false;
  }
}

int values_compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Kind::Float || b.kind() == Kind::Float) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.items().size(), b.items().size());
    for (size_t k = 0; k < n; ++k)
      if (int c = values_compare(a.items()[k], b.items()[k])) return c;
    return a.items().size() < b.items().size() ? -1 : a.items().size() > b.items().size() ? 1 : 0;
  }
  fail("cannot compare ", a.repr().empty() ? "undefined" : a.repr(), " with ",
       b.repr().empty() ? "undefined" : b.repr());
}

}  // namespace tetra::tok::jinja

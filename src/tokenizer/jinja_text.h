// Python string semantics shared by the template methods and filters (internal to
// src/tokenizer/jinja_*.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tokenizer/jinja_eval.h"

namespace tetra::tok::jinja::text {

Value make_fn(const std::string& name, std::function<Value(Interpreter&, CallArgs&)> fn);
std::vector<char32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<char32_t>& cps, size_t b = 0, size_t e = SIZE_MAX);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);
bool is_cased_letter(char32_t c);
std::string map_case(const std::string& s, char32_t (*f)(char32_t));
std::string capitalize(const std::string& s);
// Python str.strip/lstrip/rstrip: whitespace, or any of `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);
// Python str.split(sep, maxsplit).
List split(Interpreter& in, const std::string& s, const Value* sep, int64_t maxsplit);
std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
const std::string& need_string(Interpreter& in, const Value* v, const char* what);
[[noreturn]] void undefined_error(Interpreter& in, const Value& v);
// Jinja2's environment.getattr(x, "a.b.0") for filters such as map(attribute=...).
Value attribute_path(Interpreter& in, const Value& v, const std::string& path);
// Ordering for sort/min/max; strings compare case-folded unless case_sensitive.
int sort_compare(Interpreter& in, const Value& a, const Value& b, bool case_sensitive);

}  // namespace tetra::tok::jinja::text

#include "tokenizer/jinja_eval.h"

#include <cmath>

namespace tetra::tok::jinja {

namespace {

std::string describe_undefined(const Value& v) {
  return v.undefined_name().empty() ? "a value is undefined" : "'" + v.undefined_name() + "' is undefined";
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Interpreter::Interpreter(Limits limits) : limits_(limits) {}

Interpreter::~Interpreter() {
  for (auto& c : macros_) c->fn = nullptr;
}

void Interpreter::raise(const std::string& message) const {
  throw Error("chat template line " + std::to_string(line_) + ": " + message);
}

void Interpreter::step() {
  if (++steps_ > limits_.max_steps) error("template exceeded its step limit (", limits_.max_steps, " steps)");
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes)
    error("template output exceeded its size limit (", limits_.max_output_bytes, " bytes)");
}

void Interpreter::append(std::string& out, const std::string& s) {
  check_size(out.size() + s.size());
  out += s;
}

std::string Interpreter::render(const Body& tmpl, const std::vector<std::pair<std::string, Value>>& globals) {
  frame_ = std::make_shared<Frame>();
  for (auto& [k, v] : builtin_globals()) frame_->vars[k] = v;
  for (auto& [k, v] : globals) frame_->vars[k] = v;
  std::string out;
  Flow flow = exec(tmpl, out);
  if (flow != Flow::Normal) error("'break' or 'continue' outside a loop");
  frame_.reset();
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Frame* f = frame_.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  return Value::undefined(name);
}

void Interpreter::assign(const std::string& name, Value v) { frame_->vars[name] = std::move(v); }

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const NodePtr& n : body) {
    Flow f = exec_node(*n, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_node(const Node& n, std::string& out) {
  step();
  line_ = n.line;
  switch (n.kind) {
    case NodeKind::Text: append(out, n.name); return Flow::Normal;
    case NodeKind::Print: append(out, eval(*n.args[0]).to_str()); return Flow::Normal;
    case NodeKind::If:
      for (size_t k = 0; k < n.args.size(); ++k) {
        line_ = n.line;
        if (eval(*n.args[k]).truthy()) return exec(n.bodies[k], out);
      }
      if (n.bodies.size() > n.args.size()) return exec(n.bodies.back(), out);
      return Flow::Normal;
    case NodeKind::For: exec_for(n, out); return Flow::Normal;
    case NodeKind::Set: case NodeKind::SetBlock: exec_set(n, out); return Flow::Normal;
    case NodeKind::Macro: define_macro(n); return Flow::Normal;
    case NodeKind::Break: return Flow::Break;
    case NodeKind::Continue: return Flow::Continue;
    case NodeKind::FilterBlock: {
      std::string body;
      Flow f = exec(n.bodies[0], body);
      // The chain's innermost filter has no input node; feed it the rendered body.
      std::vector<const Node*> chain;
      for (const Node* p = n.args[0].get(); p; p = p->args[0].get()) chain.push_back(p);
      Value v(std::move(body));
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) v = eval_filter(**it, v);
      append(out, v.to_str());
      return f;
    }
    case NodeKind::With: {
      auto saved = frame_;
      auto inner = std::make_shared<Frame>();
      inner->parent = saved;
      for (auto& [k, e] : n.kwargs) inner->vars[k] = eval(*e);
      frame_ = inner;
      Flow f = exec(n.bodies[0], out);
      frame_ = saved;
      return f;
    }
    default: append(out, eval(n).to_str()); return Flow::Normal;
  }
}

void Interpreter::exec_for(const Node& n, std::string& out) {
  List items = iterate(*this, eval(*n.args[0]));
  if (n.args[1]) {  // `for x in xs if cond`: filtered before loop.* is computed
    List kept;
    auto saved = frame_;
    for (Value& item : items) {
      frame_ = std::make_shared<Frame>();
      frame_->parent = saved;
      if (n.names.size() == 1) frame_->vars[n.names[0]] = item;
      else if (item.is_list() && item.items().size() == n.names.size())
        for (size_t k = 0; k < n.names.size(); ++k) frame_->vars[n.names[k]] = item.items()[k];
      bool keep = eval(*n.args[1]).truthy();
      frame_ = saved;
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(n.bodies[1], out);
    return;
  }
  auto saved = frame_;
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < len; ++k) {
    step();
    auto frame = std::make_shared<Frame>();  // each iteration starts from a clean scope
    frame->parent = saved;
    const Value& item = items[k];
    if (n.names.size() == 1) {
      frame->vars[n.names[0]] = item;
    } else {
      line_ = n.line;
      if (!item.is_list() || item.items().size() != n.names.size())
        error("cannot unpack ", item.repr(), " into ", n.names.size(), " loop variables");
      for (size_t j = 0; j < n.names.size(); ++j) frame->vars[n.names[j]] = item.items()[j];
    }
    auto loop = std::make_shared<Dict>();
    loop->set("index", Value(k + 1));
    loop->set("index0", Value(k));
    loop->set("revindex", Value(len - k));
    loop->set("revindex0", Value(len - k - 1));
    loop->set("first", Value(k == 0));
    loop->set("last", Value(k == len - 1));
    loop->set("length", Value(len));
    loop->set("depth", Value(int64_t{1}));
    loop->set("depth0", Value(int64_t{0}));
    loop->set("previtem", k > 0 ? items[k - 1] : Value::undefined("previtem"));
    loop->set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("nextitem"));
    auto cycle = std::make_shared<Callable>();
    cycle->name = "cycle";
    cycle->fn = [k](Interpreter& in, CallArgs& a) -> Value {
      if (a.positional.empty()) in.error("loop.cycle needs at least one argument");
      return a.positional[static_cast<size_t>(k) % a.positional.size()];
    };
    loop->set("cycle", Value::callable(cycle));
    frame->vars["loop"] = Value::dict(loop);
    frame_ = frame;
    Flow f = exec(n.bodies[0], out);
    frame_ = saved;
    if (f == Flow::Break) break;
  }
}

// Values are reference counted, so a namespace that held itself would never be freed.
bool Interpreter::contains(const Value& v, const Dict& d) {
  step();  // bounded by the step limit, however large v is
  if (v.is_dict()) {
    if (&v.dict_ref() == &d) return true;
    for (const auto& [k, item] : v.dict_ref().entries)
      if (contains(item, d)) return true;
  } else if (v.is_list()) {
    for (const Value& item : v.items())
      if (contains(item, d)) return true;
  }
  return false;
}

void Interpreter::exec_set(const Node& n, std::string& out) {
  (void)out;
  Value v;
  if (n.kind == NodeKind::SetBlock) {
    std::string body;
    exec(n.bodies[0], body);
    v = Value(std::move(body));
    if (n.args[0]) {
      std::vector<const Node*> chain;
      for (const Node* p = n.args[0].get(); p; p = p->args[0].get()) chain.push_back(p);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) v = eval_filter(**it, v);
    }
    line_ = n.line;
  } else {
    v = eval(*n.args[0]);
  }
  if (!n.name.empty()) {  // {% set ns.attr = v %}
    Value target = lookup(n.names[0]);
    if (!target.is_dict() || !target.dict_ref().is_namespace)
      error("cannot assign attribute on non-namespace object '", n.names[0], "'");
    if (contains(v, target.dict_ref()))
      error("cannot store namespace '", n.names[0], "' inside itself");
    target.dict_ref().set(n.name, std::move(v));
    return;
  }
  if (n.names.size() == 1) {
    assign(n.names[0], std::move(v));
    return;
  }
  List parts = iterate(*this, v);
  if (parts.size() != n.names.size()) error("cannot unpack ", parts.size(), " values into ", n.names.size(), " names");
  for (size_t k = 0; k < parts.size(); ++k) assign(n.names[k], parts[k]);
}

void Interpreter::define_macro(const Node& n) {
  auto c = std::make_shared<Callable>();
  c->name = n.name;
  std::shared_ptr<Frame> defining = frame_;
  const Node* def = &n;  // the template outlives every render that can call the macro
  c->fn = [def, defining](Interpreter& in, CallArgs& args) -> Value {
    if (args.positional.size() > def->names.size())
      in.error("macro '", def->name, "' takes not more than ", def->names.size(), " argument(s)");
    if (++in.call_depth_ > in.limits_.max_call_depth) {
      --in.call_depth_;
      in.error("macro calls nested deeper than ", in.limits_.max_call_depth);
    }
    auto saved = in.frame_;
    int saved_line = in.line_;
    auto frame = std::make_shared<Frame>();
    frame->parent = defining;
    in.frame_ = frame;
    for (size_t k = 0; k < def->names.size(); ++k) {
      const std::string& p = def->names[k];
      const Value* given = args.get(k, p);
      if (k < args.positional.size()) given = &args.positional[k];
      if (given) {
        frame->vars[p] = *given;
        continue;
      }
      Value dflt = Value::undefined(p);
      for (auto& [name, expr] : def->kwargs)
        if (name == p) dflt = in.eval(*expr);
      frame->vars[p] = dflt;
    }
    for (auto& [name, v] : args.named) {
      bool known = false;
      for (const std::string& p : def->names) known |= p == name;
      if (!known) in.error("macro '", def->name, "' takes no keyword argument '", name, "'");
    }
    std::string out;
    Flow f = in.exec(def->bodies[0], out);
    in.frame_ = saved;
    in.line_ = saved_line;
    --in.call_depth_;
    if (f != Flow::Normal) in.error("'break' or 'continue' outside a loop");
    return Value(std::move(out));
  };
  macros_.push_back(c);
  assign(n.name, Value::callable(c));
}

Value Interpreter::eval(const Node& n) {
  step();
  line_ = n.line;
  switch (n.kind) {
    case NodeKind::Literal: return n.literal;
    case NodeKind::Name: return lookup(n.name);
    case NodeKind::ListLit: case NodeKind::TupleLit: {
      List items;
      for (const NodePtr& a : n.args) items.push_back(eval(*a));
      return Value::list(std::move(items), n.kind == NodeKind::TupleLit);
    }
    case NodeKind::DictLit: {
      auto d = std::make_shared<Dict>();
      for (size_t k = 0; k + 1 < n.args.size(); k += 2) {
        Value key = eval(*n.args[k]);
        if (!key.is_string()) error("dict keys must be strings here");
        d->set(key.str(), eval(*n.args[k + 1]));
      }
      return Value::dict(d);
    }
    case NodeKind::Attr: {
      Value obj = eval(*n.args[0]);
      line_ = n.line;
      return get_attr(*this, obj, n.name);
    }
    case NodeKind::Item: {
      Value obj = eval(*n.args[0]);
      Value key = eval(*n.args[1]);
      line_ = n.line;
      return get_item(*this, obj, key);
    }
    case NodeKind::Slice: {
      Value obj = eval(*n.args[0]);
      Value parts[3];
      for (int k = 0; k < 3; ++k) parts[k] = n.args[k + 1] ? eval(*n.args[k + 1]) : Value::none();
      line_ = n.line;
      if (obj.is_undefined()) error(describe_undefined(obj));
      int64_t step_v = parts[2].is_none() ? 1 : parts[2].as_int();
      if (step_v == 0) error("slice step cannot be zero");
      bool is_str = obj.is_string();
      List seq;
      if (is_str) {
        seq = iterate(*this, obj);
      } else if (obj.is_list()) {
        seq = obj.items();
      } else {
        error("cannot slice ", obj.repr());
      }
      int64_t len = static_cast<int64_t>(seq.size());
      // Python's slice.indices(): clamp to [0, len] going forward, [-1, len-1] going back.
      auto norm = [&](const Value& v, int64_t dflt) {
        if (v.is_none()) return dflt;
        int64_t x = v.as_int();
        if (x < 0) x += len;
        int64_t lo = step_v < 0 ? -1 : 0, hi = step_v < 0 ? len - 1 : len;
        return std::max(lo, std::min(x, hi));
      };
      int64_t start = norm(parts[0], step_v > 0 ? 0 : len - 1);
      int64_t stop = norm(parts[1], step_v > 0 ? len : -1);
      List result;
      for (int64_t k = start; step_v > 0 ? k < stop : k > stop; k += step_v) result.push_back(seq[k]);
      if (!is_str) return Value::list(std::move(result), obj.is_tuple());
      std::string s;
      for (const Value& c : result) s += c.str();
      return Value(std::move(s));
    }
    case NodeKind::Call: return eval_call(n);
    case NodeKind::Filter: return eval_filter(n, n.args[0] ? eval(*n.args[0]) : Value());
    case NodeKind::Test: {
      Value input = eval(*n.args[0]);
      CallArgs args;
      for (size_t k = 1; k < n.args.size(); ++k) args.positional.push_back(eval(*n.args[k]));
      for (auto& [name, e] : n.kwargs) args.named.emplace_back(name, eval(*e));
      line_ = n.line;
      bool r = apply_test(*this, n.name, input, args);
      return Value(n.negated ? !r : r);
    }
    case NodeKind::Not: return Value(!eval(*n.args[0]).truthy());
    case NodeKind::Neg: case NodeKind::Pos: {
      Value v = eval(*n.args[0]);
      line_ = n.line;
      if (v.is_undefined()) error(describe_undefined(v));
      if (!v.is_number()) error("bad operand type for unary ", n.kind == NodeKind::Neg ? "-" : "+", ": ", v.repr());
      if (n.kind == NodeKind::Pos) return v.kind() == Kind::Bool ? Value(v.as_int()) : v;
      return v.kind() == Kind::Float ? Value(-v.as_float()) : Value(-v.as_int());
    }
    case NodeKind::Binary: return eval_binary(n);
    case NodeKind::Compare: return eval_compare(n);
    case NodeKind::And: {
      Value a = eval(*n.args[0]);
      return a.truthy() ? eval(*n.args[1]) : a;
    }
    case NodeKind::Or: {
      Value a = eval(*n.args[0]);
      return a.truthy() ? a : eval(*n.args[1]);
    }
    case NodeKind::Cond:
      if (eval(*n.args[1]).truthy()) return eval(*n.args[0]);
      return n.args[2] ? eval(*n.args[2]) : Value::undefined();
    default: error("statement used as an expression");
  }
}

Value Interpreter::eval_binary(const Node& n) {
  Value a = eval(*n.args[0]);
  Value b = eval(*n.args[1]);
  line_ = n.line;
  const std::string& op = n.name;
  if (op == "~") {
    std::string s = a.to_str() + b.to_str();
    check_size(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) error(describe_undefined(a));
  if (b.is_undefined()) error(describe_undefined(b));
  auto type_error = [&]() -> Value {
    error("unsupported operand types for ", op, ": ", a.repr(), " and ", b.repr());
  };
  bool ints = (a.kind() == Kind::Int || a.kind() == Kind::Bool) && (b.kind() == Kind::Int || b.kind() == Kind::Bool);
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      List r = a.items();
      r.insert(r.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(r));
    }
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) error("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.as_float() + b.as_float());
    return type_error();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) error("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.as_float() - b.as_float());
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) error("integer overflow");
      return Value(r);
    }
    if (nums) return Value(a.as_float() * b.as_float());
    const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (!seq || !(count->kind() == Kind::Int || count->kind() == Kind::Bool)) return type_error();
    int64_t times = std::max<int64_t>(0, count->as_int());
    if (seq->is_string()) {
      check_size(static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)) * seq->str().size());
      std::string r;
      for (int64_t k = 0; k < times; ++k) r += seq->str();
      return Value(std::move(r));
    }
    check_size(static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)) * seq->items().size() * 16);
    List r;
    for (int64_t k = 0; k < times; ++k) r.insert(r.end(), seq->items().begin(), seq->items().end());
    return Value::list(std::move(r));
  }
  if (!nums) return type_error();
  if (op == "/") {
    if (b.as_float() == 0) error("division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (ints) {
      if (b.as_int() == 0) error("integer division by zero");
      return Value(floor_div(a.as_int(), b.as_int()));
    }
    if (b.as_float() == 0) error("float floor division by zero");
    return Value(std::floor(a.as_float() / b.as_float()));
  }
  if (op == "%") {
    if (ints) {
      if (b.as_int() == 0) error("integer modulo by zero");
      int64_t r = a.as_int() % b.as_int();
      if (r != 0 && ((r < 0) != (b.as_int() < 0))) r += b.as_int();
      return Value(r);
    }
    if (b.as_float() == 0) error("float modulo by zero");
    double r = std::fmod(a.as_float(), b.as_float());
    if (r != 0 && ((r < 0) != (b.as_float() < 0))) r += b.as_float();
    return Value(r);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), r = 1;
      for (int64_t e = b.as_int(); e > 0; --e) {
        if (__builtin_mul_overflow(r, base, &r)) error("integer overflow");
        if (r == 0 || r == 1) break;
      }
      return Value(r);
    }
    return Value(std::pow(a.as_float(), b.as_float()));
  }
  return type_error();
}

Value Interpreter::eval_compare(const Node& n) {
  Value left = eval(*n.args[0]);
  for (size_t k = 0; k < n.names.size(); ++k) {
    Value right = eval(*n.args[k + 1]);
    line_ = n.line;
    const std::string& op = n.names[k];
    bool r;
    if (op == "==") r = values_equal(left, right);
    else if (op == "!=") r = !values_equal(left, right);
    else if (op == "in" || op == "not in") {
      CallArgs args;
      args.positional.push_back(right);
      r = apply_test(*this, "in", left, args);
      if (op == "not in") r = !r;
    } else {
      if (left.is_undefined()) error(describe_undefined(left));
      if (right.is_undefined()) error(describe_undefined(right));
      int c;
      try {
        c = values_compare(left, right);
      } catch (const Error& e) {
        error(e.what());
      }
      r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::eval_call(const Node& n) {
  Value callee = eval(*n.args[0]);
  CallArgs args;
  for (size_t k = 1; k < n.args.size(); ++k) args.positional.push_back(eval(*n.args[k]));
  for (auto& [name, e] : n.kwargs) args.named.emplace_back(name, eval(*e));
  line_ = n.line;
  if (callee.is_undefined()) error(describe_undefined(callee));
  if (callee.kind() != Kind::Callable) error(callee.repr(), " is not callable");
  Value r = callee.fn().fn(*this, args);
  line_ = n.line;
  return r;
}

Value Interpreter::eval_filter(const Node& n, Value input) {
  CallArgs args;
  for (size_t k = 1; k < n.args.size(); ++k) args.positional.push_back(eval(*n.args[k]));
  for (auto& [name, e] : n.kwargs) args.named.emplace_back(name, eval(*e));
  line_ = n.line;
  return apply_filter(*this, n.name, std::move(input), args);
}

}  // namespace tetra::tok::jinja

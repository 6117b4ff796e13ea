#include "tokenizer/jinja_parser.h"

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/jinja_lexer.h"

namespace tetra::tok::jinja {

namespace {

// Nesting allowed for expressions and blocks: deep enough for any real template, shallow
// enough that a hostile one cannot exhaust the stack.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_all() {
    Body body = parse_body({});
    if (cur().kind != TokenKind::End) error("unexpected '", end_tag_name_, "'");
    return body;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail("chat template line ", cur().line, ": ", args...);
  }

  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == TokenKind::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == TokenKind::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error("expected '", op, "'");
    ++pos_;
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::Name) error("expected a name");
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd) error("expected end of statement block");
    ++pos_;
  }

  NodePtr node(NodeKind kind) {
    auto n = std::make_shared<Node>();
    n->kind = kind;
    n->line = cur().line;
    return n;
  }

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > kMaxDepth) p->error("template is nested too deeply");
    }
    ~DepthGuard() { --p->depth_; }
  };

  // Parses statements until a block whose keyword is in `ends` (left unconsumed: pos_ is at
  // the keyword, end_tag_name_ holds it) or the end of input.
  Body parse_body(std::initializer_list<const char*> ends) {
    DepthGuard guard(this);
    Body body;
    while (cur().kind != TokenKind::End) {
      const Token& t = cur();
      if (t.kind == TokenKind::Data) {
        auto n = node(NodeKind::Text);
        n->name = t.text;
        body.push_back(n);
        ++pos_;
      } else if (t.kind == TokenKind::VarBegin) {
        ++pos_;
        auto n = node(NodeKind::Print);
        n->args.push_back(parse_tuple_or_expr());
        if (cur().kind != TokenKind::VarEnd) error("expected end of print statement");
        ++pos_;
        body.push_back(n);
      } else if (t.kind == TokenKind::BlockBegin) {
        ++pos_;
        if (cur().kind != TokenKind::Name) error("expected a statement name");
        const std::string& kw = cur().text;
        for (const char* e : ends)
          if (kw == e) {
            end_tag_name_ = kw;
            return body;
          }
        body.push_back(parse_statement());
      } else {
        error("unexpected token");
      }
    }
    return body;
  }

  // Consumes "{% <keyword>" ... "%}" of a closing tag such as endif.
  void end_block(const char* keyword) {
    if (!is_name(keyword)) error("expected '", keyword, "'");
    ++pos_;
    expect_block_end();
  }

  NodePtr parse_statement() {
    std::string kw = cur().text;
    int line = cur().line;
    ++pos_;
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "break" || kw == "continue") {
      auto n = node(kw == "break" ? NodeKind::Break : NodeKind::Continue);
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body
      expect_block_end();
      auto n = node(NodeKind::With);
      n->bodies.push_back(parse_body({"endgeneration"}));
      end_block("endgeneration");
      return n;
    }
    if (kw == "filter") {
      auto n = node(NodeKind::FilterBlock);
      auto filter = parse_filter_chain(nullptr);
      n->args.push_back(filter);
      expect_block_end();
      n->bodies.push_back(parse_body({"endfilter"}));
      end_block("endfilter");
      return n;
    }
    if (kw == "with") {
      auto n = node(NodeKind::With);
      while (cur().kind != TokenKind::BlockEnd) {
        if (!n->kwargs.empty()) expect_op(",");
        std::string name = expect_name();
        expect_op("=");
        n->kwargs.emplace_back(name, parse_expr());
      }
      expect_block_end();
      n->bodies.push_back(parse_body({"endwith"}));
      end_block("endwith");
      return n;
    }
    if (kw == "include" || kw == "import" || kw == "from" || kw == "extends" || kw == "block")
      fail("chat template line ", line, ": '", kw, "' is not allowed (templates cannot load files)");
    fail("chat template line ", line, ": unknown statement '", kw, "'");
  }

  NodePtr parse_if(int line) {
    auto n = node(NodeKind::If);
    n->line = line;
    n->args.push_back(parse_tuple_or_expr());
    expect_block_end();
    while (true) {
      n->bodies.push_back(parse_body({"elif", "else", "endif"}));
      if (is_name("elif")) {
        ++pos_;
        n->args.push_back(parse_tuple_or_expr());
        expect_block_end();
      } else if (is_name("else")) {
        ++pos_;
        expect_block_end();
        n->bodies.push_back(parse_body({"endif"}));
        end_block("endif");
        return n;
      } else {
        end_block("endif");
        return n;
      }
    }
  }

  NodePtr parse_for(int line) {
    auto n = node(NodeKind::For);
    n->line = line;
    do {
      n->names.push_back(expect_name());
      if (!is_op(",")) break;
      ++pos_;
    } while (cur().kind == TokenKind::Name && cur().text != "in");
    if (!is_name("in")) error("expected 'in' in for loop");
    ++pos_;
    n->args.push_back(parse_expr(/*allow_cond=*/false));
    NodePtr cond;
    if (is_name("if")) {
      ++pos_;
      cond = parse_expr();
    }
    n->args.push_back(cond);
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    n->bodies.push_back(parse_body({"else", "endfor"}));
    if (is_name("else")) {
      ++pos_;
      expect_block_end();
      n->bodies.push_back(parse_body({"endfor"}));
    } else {
      n->bodies.push_back({});
    }
    end_block("endfor");
    return n;
  }

  NodePtr parse_set(int line) {
    // Targets: a name, name.attr (namespace), or names separated by commas.
    std::vector<std::string> names;
    std::string attr;
    names.push_back(expect_name());
    if (is_op(".")) {
      ++pos_;
      attr = expect_name();
    } else {
      while (is_op(",")) {
        ++pos_;
        names.push_back(expect_name());
      }
    }
    if (cur().kind == TokenKind::BlockEnd || is_op("|")) {
      if (names.size() != 1 || !attr.empty()) error("block set needs one name");
      auto n = node(NodeKind::SetBlock);
      n->line = line;
      n->names = names;
      n->args.push_back(is_op("|") ? parse_filter_chain(nullptr) : nullptr);
      expect_block_end();
      n->bodies.push_back(parse_body({"endset"}));
      end_block("endset");
      return n;
    }
    expect_op("=");
    auto n = node(NodeKind::Set);
    n->line = line;
    n->names = names;
    n->name = attr;
    n->args.push_back(parse_tuple_or_expr());
    expect_block_end();
    return n;
  }

  NodePtr parse_macro(int line) {
    auto n = node(NodeKind::Macro);
    n->line = line;
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string param = expect_name();
      n->names.push_back(param);
      if (is_op("=")) {
        ++pos_;
        n->kwargs.emplace_back(param, parse_expr());
      }
    }
    ++pos_;
    expect_block_end();
    n->bodies.push_back(parse_body({"endmacro"}));
    ++pos_;
    if (cur().kind == TokenKind::Name) ++pos_;  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  NodePtr parse_tuple_or_expr() {
    NodePtr first = parse_expr();
    if (!is_op(",")) return first;
    auto t = node(NodeKind::TupleLit);
    t->args.push_back(first);
    while (is_op(",")) {
      ++pos_;
      if (cur().kind == TokenKind::VarEnd || cur().kind == TokenKind::BlockEnd || is_op(")")) break;
      t->args.push_back(parse_expr());
    }
    return t;
  }

  NodePtr parse_expr(bool allow_cond = true) {
    DepthGuard guard(this);
    NodePtr e = parse_or();
    while (allow_cond && is_name("if")) {
      ++pos_;
      auto c = node(NodeKind::Cond);
      c->args.push_back(e);
      c->args.push_back(parse_or());
      if (is_name("else")) {
        ++pos_;
        c->args.push_back(parse_expr());
      } else {
        c->args.push_back(nullptr);
      }
      e = c;
    }
    return e;
  }

  NodePtr parse_or() {
    NodePtr left = parse_and();
    while (is_name("or")) {
      ++pos_;
      auto n = node(NodeKind::Or);
      n->args = {left, parse_and()};
      left = n;
    }
    return left;
  }

  NodePtr parse_and() {
    NodePtr left = parse_not();
    while (is_name("and")) {
      ++pos_;
      auto n = node(NodeKind::And);
      n->args = {left, parse_not()};
      left = n;
    }
    return left;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      ++pos_;
      auto n = node(NodeKind::Not);
      n->args.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    NodePtr first = parse_math1();
    NodePtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(NodeKind::Compare);
        cmp->args.push_back(first);
      }
      cmp->names.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? cmp : first;
  }

  NodePtr binary(const std::string& op, NodePtr a, NodePtr b) {
    auto n = node(NodeKind::Binary);
    n->name = op;
    n->args = {std::move(a), std::move(b)};
    return n;
  }

  NodePtr parse_math1() {
    NodePtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = t_[pos_++].text;
      left = binary(op, left, parse_concat());
    }
    return left;
  }

  NodePtr parse_concat() {
    NodePtr left = parse_math2();
    while (is_op("~")) {
      ++pos_;
      left = binary("~", left, parse_math2());
    }
    return left;
  }

  NodePtr parse_math2() {
    NodePtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = t_[pos_++].text;
      left = binary(op, left, parse_pow());
    }
    return left;
  }

  NodePtr parse_pow() {
    NodePtr left = parse_unary(true);
    while (is_op("**")) {
      ++pos_;
      left = binary("**", left, parse_unary(true));
    }
    return left;
  }

  NodePtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      n = node(is_op("-") ? NodeKind::Neg : NodeKind::Pos);
      ++pos_;
      n->args.push_back(parse_unary(false));
    } else {
      n = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(n) : n;
  }

  NodePtr parse_primary() {
    const Token& t = cur();
    if (t.kind == TokenKind::Name) {
      ++pos_;
      auto n = node(NodeKind::Literal);
      n->line = t.line;
      if (t.text == "true" || t.text == "True") n->literal = Value(true);
      else if (t.text == "false" || t.text == "False") n->literal = Value(false);
      else if (t.text == "none" || t.text == "None") n->literal = Value::none();
      else {
        n->kind = NodeKind::Name;
        n->name = t.text;
      }
      return n;
    }
    if (t.kind == TokenKind::String) {
      auto n = node(NodeKind::Literal);
      std::string s;
      while (cur().kind == TokenKind::String) s += t_[pos_++].text;  // adjacent literals join
      n->literal = Value(std::move(s));
      return n;
    }
    if (t.kind == TokenKind::Int || t.kind == TokenKind::Float) {
      auto n = node(NodeKind::Literal);
      ++pos_;
      if (t.kind == TokenKind::Float) {
        n->literal = Value(std::strtod(t.text.c_str(), nullptr));
      } else {
        errno = 0;
        long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) error("integer literal out of range");
        n->literal = Value(static_cast<int64_t>(v));
      }
      return n;
    }
    if (is_op("(")) {
      ++pos_;
      if (is_op(")")) {
        ++pos_;
        auto n = node(NodeKind::TupleLit);
        return n;
      }
      NodePtr e = parse_expr();
      if (is_op(",")) {
        auto tup = node(NodeKind::TupleLit);
        tup->args.push_back(e);
        while (is_op(",")) {
          ++pos_;
          if (is_op(")")) break;
          tup->args.push_back(parse_expr());
        }
        e = tup;
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++pos_;
      auto n = node(NodeKind::ListLit);
      while (!is_op("]")) {
        if (!n->args.empty()) expect_op(",");
        if (is_op("]")) break;
        n->args.push_back(parse_expr());
      }
      ++pos_;
      return n;
    }
    if (is_op("{")) {
      ++pos_;
      auto n = node(NodeKind::DictLit);
      while (!is_op("}")) {
        if (!n->args.empty()) expect_op(",");
        if (is_op("}")) break;
        n->args.push_back(parse_expr());
        expect_op(":");
        n->args.push_back(parse_expr());
      }
      ++pos_;
      return n;
    }
    error("unexpected '", t.text, "'");
  }

  NodePtr parse_postfix(NodePtr n) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        if (cur().kind == TokenKind::Name) {
          auto a = node(NodeKind::Attr);
          a->name = t_[pos_++].text;
          a->args.push_back(n);
          n = a;
        } else if (cur().kind == TokenKind::Int) {
          auto i = node(NodeKind::Item);
          auto lit = node(NodeKind::Literal);
          lit->literal = Value(static_cast<int64_t>(std::strtoll(t_[pos_++].text.c_str(), nullptr, 10)));
          i->args = {n, lit};
          n = i;
        } else {
          error("expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        ++pos_;
        n = parse_subscript(n);
      } else if (is_op("(")) {
        n = parse_call(n);
      } else {
        return n;
      }
    }
  }

  NodePtr parse_subscript(NodePtr target) {
    // [i] or a slice [start:stop:step], any part optional.
    NodePtr parts[3];
    int n_colons = 0;
    if (!is_op(":")) parts[0] = parse_expr();
    while (is_op(":") && n_colons < 2) {
      ++pos_;
      ++n_colons;
      if (!is_op(":") && !is_op("]")) parts[n_colons] = parse_expr();
    }
    expect_op("]");
    if (n_colons == 0) {
      auto n = node(NodeKind::Item);
      n->args = {target, parts[0]};
      return n;
    }
    auto n = node(NodeKind::Slice);
    n->args = {target, parts[0], parts[1], parts[2]};
    return n;
  }

  void parse_args(NodePtr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "=") {
        std::string name = t_[pos_].text;
        pos_ += 2;
        call->kwargs.emplace_back(name, parse_expr());
      } else {
        if (!call->kwargs.empty()) error("positional argument after keyword argument");
        call->args.push_back(parse_expr());
      }
    }
    ++pos_;
  }

  NodePtr parse_call(NodePtr callee) {
    auto n = node(NodeKind::Call);
    n->args.push_back(callee);
    parse_args(n);
    return n;
  }

  // input | f1(args) | f2 ...; input is null in {% filter %} and {% set x | f %} blocks.
  NodePtr parse_filter_chain(NodePtr input) {
    do {
      if (is_op("|")) ++pos_;
      auto f = node(NodeKind::Filter);
      f->name = expect_name();
      while (is_op(".")) {  // dotted filter names are not a thing here, but be explicit
        error("unexpected '.' in filter name");
      }
      f->args.push_back(input);
      if (is_op("(")) {
        auto tmp = node(NodeKind::Call);
        parse_args(tmp);
        for (auto& a : tmp->args) f->args.push_back(a);
        f->kwargs = tmp->kwargs;
      }
      input = f;
    } while (is_op("|"));
    return input;
  }

  NodePtr parse_filter_expr(NodePtr n) {
    while (true) {
      if (is_op("|")) {
        n = parse_filter_chain(n);
      } else if (is_name("is")) {
        ++pos_;
        auto t = node(NodeKind::Test);
        if (is_name("not")) {
          t->negated = true;
          ++pos_;
        }
        t->name = expect_name();
        t->args.push_back(n);
        if (is_op("(")) {
          auto tmp = node(NodeKind::Call);
          parse_args(tmp);
          for (auto& a : tmp->args) t->args.push_back(a);
          t->kwargs = tmp->kwargs;
        } else if ((cur().kind == TokenKind::Name || cur().kind == TokenKind::String || cur().kind == TokenKind::Int ||
                    cur().kind == TokenKind::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") &&
                   !is_name("is") && !is_name("not")) {
          // One argument without parentheses: `x is divisibleby 3`.
          t->args.push_back(parse_postfix(parse_primary()));
        }
        n = t;
      } else if (is_op("(")) {
        n = parse_call(n);
      } else {
        return n;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string end_tag_name_;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(lex(source)).parse_all(); }

}  // namespace tetra::tok::jinja

// Parser for the chat-template Jinja subset: token stream -> AST. Statements: if/elif/else,
// for (tuple targets, inline filter, else, loop.*), set (names, namespace attributes, tuples,
// blocks), macro, filter blocks, with, break/continue, generation (transformers' extension).
// Expressions follow Jinja2's precedence. Anything that would touch files (include, import,
// extends) is refused.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace tetra::tok::jinja {

enum class NodeKind {
  // expressions
  Literal, Name, ListLit, TupleLit, DictLit, Attr, Item, Slice, Call, Filter, Test, Not, Neg, Pos,
  Binary, Compare, And, Or, Cond,
  // statements
  Text, Print, If, For, Set, SetBlock, Macro, FilterBlock, With, Break, Continue,
};

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string name;                 // Name, Attr, Filter/Test/Macro name, Binary operator, Text
  Value literal;                    // Literal
  bool negated = false;             // Test: "is not"; For: recursive (unsupported)
  std::vector<NodePtr> args;        // operands, positional arguments, conditions
  std::vector<std::pair<std::string, NodePtr>> kwargs;  // keyword args, macro defaults
  std::vector<std::string> names;   // Compare operators, For/Set targets, Macro params
  std::vector<Body> bodies;         // If: one per branch (+ else); For: body, else; ...
};

// Parses a whole template; errors name the line ("chat template line N: ...").
Body parse_template(std::string_view source);

}  // namespace tetra::tok::jinja

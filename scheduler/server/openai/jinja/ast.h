// The syntax tree the parser builds and the interpreter walks.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_AST_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/server/openai/jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // args: key, value, key, value...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts absent)
    kCall,     // args[0](args[1..positional], keyword...)
    kFilter,   // args[0] | name(args[1..positional], keyword...)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name is "-", "+" or "not"; args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2]...
    kAnd,
    kOr,
    kCond,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  size_t offset = 0;
  Value literal;
  std::string name;
  std::vector<std::string> ops;            // kCompare
  std::vector<ExprPtr> args;               // see above; may hold nulls (kSlice, kCond)
  size_t positional = 0;                   // kCall/kFilter: how many of args[1..] are positional
  std::vector<std::string> keyword_names;  // kCall/kFilter: names of the rest
  bool negated = false;                    // kTest
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // expr
    kIf,        // conditions[i] -> bodies[i]; else_body
    kFor,       // targets in expr [if filter]: bodies[0]; else_body
    kSet,       // targets = expr; or attr set: targets = {ns, attribute}, attribute_set
    kSetBlock,  // targets[0] = rendered bodies[0]
    kMacro,     // name(params = defaults): bodies[0]
    kCallBlock, // expr (a call) with caller(params): bodies[0]
    kBreak,
    kContinue,
    kFilterBlock,  // bodies[0] | expr (a filter chain on a placeholder)
    kBlock,        // bodies[0] (generation blocks: rendered as they are)
  };
  Kind kind = Kind::kText;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // kFor's `if`
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body else_body;
  std::vector<std::string> targets;
  bool attribute_set = false;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
};

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_AST_H_

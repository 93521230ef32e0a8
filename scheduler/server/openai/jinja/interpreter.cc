// The tree-walking interpreter behind jinja::Template.
#include <cmath>
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/server/openai/jinja/ast.h"
#include "scheduler/server/openai/jinja/builtins.h"
#include "scheduler/server/openai/jinja/lexer.h"
#include "scheduler/server/openai/jinja/parser.h"
#include "scheduler/server/openai/jinja/template.h"

namespace tandem::jinja {

struct Template::Parsed {
  LexedTemplate lexed;
  Body body;
};

namespace {

// Bounds the C++ recursion of Exec and Eval (each level is one stack frame
// of a few hundred bytes), whatever the template's nesting.
constexpr int kMaxRecursion = 500;
constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox limit for range()

// Variables of one level: the template's top level, a loop iteration, a
// macro call. `set` writes to the innermost; lookups walk outwards.
struct Scope {
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (const auto& [k, v] : s->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
  ValueDict vars;
  std::shared_ptr<Scope> parent;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

const Value* Keyword(const CallArgs& args, std::string_view name) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<Value> Range(CallArgs& args) {
  std::vector<int64_t> n;
  for (const Value& v : args.positional) {
    if (!v.is_int()) return absl::InvalidArgumentError("range() takes integers");
    n.push_back(v.as_int());
  }
  if (n.empty() || n.size() > 3) return absl::InvalidArgumentError("range() takes 1 to 3 integers");
  const int64_t start = n.size() == 1 ? 0 : n[0];
  const int64_t stop = n.size() == 1 ? n[0] : n[1];
  const int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      return absl::InvalidArgumentError(absl::StrCat("range() is limited to ", kMaxRange, " items"));
    }
    out.push_back(Value::Int(i));
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MakeDict(CallArgs& args, bool is_namespace) {
  ValueDict items;
  if (!args.positional.empty()) {
    if (args.positional.size() > 1 || !args.positional[0].is_dict()) {
      return absl::InvalidArgumentError("namespace()/dict() take at most one mapping and keyword arguments");
    }
    items = args.positional[0].dict();
  }
  for (auto& [k, v] : args.keyword) {
    bool replaced = false;
    for (auto& [ik, iv] : items) {
      if (ik == k) {
        iv = v;
        replaced = true;
      }
    }
    if (!replaced) items.emplace_back(k, v);
  }
  return is_namespace ? Value::Namespace(std::move(items)) : Value::Dict(std::move(items));
}

class Interpreter {
 public:
  Interpreter(const std::string& source, const ValueDict& globals, const RenderLimits& limits)
      : source_(source), globals_(globals), limits_(limits) {}

  absl::StatusOr<Flow> Exec(const Body& body, const ScopePtr& scope, std::string* out) {
    for (const Node& node : body) {
      TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecNode(node, scope, out));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  // RAII recursion counter.
  class Depth {
   public:
    explicit Depth(int* d) : d_(d) { ++*d_; }
    ~Depth() { --*d_; }
    bool exceeded() const { return *d_ > kMaxRecursion; }

   private:
    int* d_;
  };

  // Adds the position to an error that has none yet (the innermost wins).
  absl::Status At(size_t offset, const absl::Status& s) const {
    if (s.ok() || absl::StrContains(s.message(), " at line ")) return s;
    return ErrorAt(source_, offset, std::string(s.message()));
  }

  absl::Status Step(size_t offset) {
    if (++steps_ > limits_.max_steps) return ErrorAt(source_, offset, "the template ran too long (step limit)");
    return absl::OkStatus();
  }

  absl::Status Append(std::string* out, const std::string& text, size_t offset) {
    *out += text;
    if (out->size() > limits_.max_output_bytes) return ErrorAt(source_, offset, "the template's output is too large");
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecNode(const Node& node, const ScopePtr& scope, std::string* out) {
    Depth depth(&depth_);
    if (depth.exceeded()) return ErrorAt(source_, node.offset, "the template nests too deeply");
    TANDEM_RETURN_IF_ERROR(Step(node.offset));
    switch (node.kind) {
      case Node::Kind::kText:
        TANDEM_RETURN_IF_ERROR(Append(out, node.text, node.offset));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
        TANDEM_RETURN_IF_ERROR(Append(out, ToPythonString(v), node.offset));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.conditions.size(); ++i) {
          TANDEM_ASSIGN_OR_RETURN(Value c, Eval(*node.conditions[i], scope));
          if (c.Truthy()) return Exec(node.bodies[i], scope, out);
        }
        return Exec(node.else_body, scope, out);
      case Node::Kind::kFor:
        return ExecFor(node, scope, out);
      case Node::Kind::kSet:
        TANDEM_RETURN_IF_ERROR(ExecSet(node, scope));
        return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        std::string text;
        TANDEM_ASSIGN_OR_RETURN(Flow f, Exec(node.bodies[0], scope, &text));
        (void)f;
        Value v = Value::String(std::move(text));
        if (node.filter) {
          TANDEM_ASSIGN_OR_RETURN(v, ApplyBlockFilter(*node.filter, std::move(v), scope));
        }
        scope->Set(node.targets[0], std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        scope->Set(node.name, MakeMacro(node, scope));
        return Flow::kNormal;
      case Node::Kind::kCallBlock: {
        TANDEM_ASSIGN_OR_RETURN(Value v, EvalCall(*node.expr, scope, MakeMacro(node, scope)));
        TANDEM_RETURN_IF_ERROR(Append(out, ToPythonString(v), node.offset));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kFilterBlock: {
        std::string text;
        TANDEM_ASSIGN_OR_RETURN(Flow f, Exec(node.bodies[0], scope, &text));
        (void)f;
        TANDEM_ASSIGN_OR_RETURN(Value v, ApplyBlockFilter(*node.expr, Value::String(std::move(text)), scope));
        TANDEM_RETURN_IF_ERROR(Append(out, ToPythonString(v), node.offset));
        return Flow::kNormal;
      }
      case Node::Kind::kBlock:
        return Exec(node.bodies[0], scope, out);
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Value> ApplyBlockFilter(const Expr& chain, Value text, const ScopePtr& scope) {
    auto inner = std::make_shared<Scope>(scope);
    inner->Set("__block__", std::move(text));
    return Eval(chain, inner);
  }

  absl::Status Bind(const std::vector<std::string>& targets, const Value& v, Scope* scope, size_t offset) {
    if (targets.size() == 1) {
      scope->Set(targets[0], v);
      return absl::OkStatus();
    }
    if (!v.is_list() || v.list().size() != targets.size()) {
      return ErrorAt(source_, offset, absl::StrCat("cannot unpack ", TypeName(v), " into ", targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->Set(targets[i], v.list()[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Node& node, const ScopePtr& scope, std::string* out) {
    TANDEM_ASSIGN_OR_RETURN(Value iterable, Eval(*node.expr, scope));
    absl::StatusOr<ValueList> all = Iterate(iterable);
    if (!all.ok()) return At(node.expr->offset, all.status());
    ValueList items;
    if (node.filter) {
      for (const Value& item : *all) {
        TANDEM_RETURN_IF_ERROR(Step(node.offset));
        auto probe = std::make_shared<Scope>(scope);
        TANDEM_RETURN_IF_ERROR(Bind(node.targets, item, probe.get(), node.offset));
        TANDEM_ASSIGN_OR_RETURN(Value keep, Eval(*node.filter, probe));
        if (keep.Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    if (items.empty()) return Exec(node.else_body, scope, out);
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      TANDEM_RETURN_IF_ERROR(Step(node.offset));  // an empty body costs a step too
      auto iteration = std::make_shared<Scope>(scope);
      TANDEM_RETURN_IF_ERROR(Bind(node.targets, items[i], iteration.get(), node.offset));
      ValueDict loop = {
          {"index", Value::Int(i + 1)},     {"index0", Value::Int(i)},       {"revindex", Value::Int(n - i)},
          {"revindex0", Value::Int(n - i - 1)}, {"first", Value::Bool(i == 0)}, {"last", Value::Bool(i == n - 1)},
          {"length", Value::Int(n)},        {"depth", Value::Int(1)},        {"depth0", Value::Int(0)},
      };
      if (i > 0) loop.emplace_back("previtem", items[i - 1]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[i + 1]);
      loop.emplace_back("cycle", Value::Callable([i](CallArgs& args) -> absl::StatusOr<Value> {
                          if (args.positional.empty()) return absl::InvalidArgumentError("loop.cycle() needs arguments");
                          return args.positional[i % args.positional.size()];
                        }));
      iteration->Set("loop", Value::Dict(std::move(loop)));
      TANDEM_ASSIGN_OR_RETURN(Flow flow, Exec(node.bodies[0], iteration, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  absl::Status ExecSet(const Node& node, const ScopePtr& scope) {
    TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*node.expr, scope));
    if (!node.attribute_set) return Bind(node.targets, v, scope.get(), node.offset);
    const Value* ns = Lookup(node.targets[0], *scope);
    if (ns == nullptr || !ns->is_namespace()) {
      return ErrorAt(source_, node.offset,
                     absl::StrCat("cannot assign attribute '", node.targets[1], "' on '", node.targets[0],
                                  "': only a namespace() takes attribute assignments"));
    }
    ValueDict& attrs = ns->mutable_namespace();
    for (auto& [k, old] : attrs) {
      if (k == node.targets[1]) {
        old = std::move(v);
        return absl::OkStatus();
      }
    }
    attrs.emplace_back(node.targets[1], std::move(v));
    return absl::OkStatus();
  }

  // A macro (or a call block's `caller`) as a callable over its closure.
  // The closure is weak: the scope holds the macro, which must not hold the
  // scope (a cycle would leak).
  Value MakeMacro(const Node& node, const ScopePtr& closure) {
    std::weak_ptr<Scope> weak = closure;
    return Value::Callable([this, &node, weak](CallArgs& args) -> absl::StatusOr<Value> {
      if (call_depth_ >= limits_.max_call_depth) {
        return ErrorAt(source_, node.offset, "macro calls nest too deeply");
      }
      ScopePtr parent = weak.lock();
      if (!parent) return ErrorAt(source_, node.offset, "macro called outside the scope that defined it");
      auto scope = std::make_shared<Scope>(parent);
      if (args.positional.size() > node.params.size()) {
        return absl::InvalidArgumentError(absl::StrCat("macro '", node.name, "' takes ", node.params.size(),
                                                       " arguments, got ", args.positional.size()));
      }
      for (const auto& [k, v] : args.keyword) {
        const bool known = k == "caller" || std::find(node.params.begin(), node.params.end(), k) != node.params.end();
        if (!known) return absl::InvalidArgumentError(absl::StrCat("macro '", node.name, "' has no argument '", k, "'"));
      }
      for (size_t i = 0; i < node.params.size(); ++i) {
        if (i < args.positional.size()) {
          scope->Set(node.params[i], args.positional[i]);
        } else if (const Value* kw = Keyword(args, node.params[i])) {
          scope->Set(node.params[i], *kw);
        } else if (node.defaults[i]) {
          TANDEM_ASSIGN_OR_RETURN(Value d, Eval(*node.defaults[i], scope));
          scope->Set(node.params[i], std::move(d));
        } else {
          scope->Set(node.params[i], Value::Undefined(node.params[i]));
        }
      }
      if (const Value* caller = Keyword(args, "caller")) scope->Set("caller", *caller);
      ++call_depth_;
      std::string out;
      absl::StatusOr<Flow> flow = Exec(node.bodies[0], scope, &out);
      --call_depth_;
      if (!flow.ok()) return flow.status();
      return Value::String(std::move(out));
    });
  }

  const Value* Lookup(const std::string& name, const Scope& scope) const {
    if (const Value* v = scope.Find(name)) return v;
    for (const auto& [k, v] : globals_) {
      if (k == name) return &v;
    }
    return nullptr;
  }

  absl::StatusOr<Value> EvalName(const std::string& name, const Scope& scope) {
    if (const Value* v = Lookup(name, scope)) return *v;
    if (name == "range") return Value::Callable(Range);
    if (name == "namespace" || name == "dict") {
      const bool ns = name == "namespace";
      return Value::Callable([ns](CallArgs& args) { return MakeDict(args, ns); });
    }
    return Value::Undefined(name);
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = 1; i < e.args.size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], scope));
      if (i - 1 < e.positional) {
        args.positional.push_back(std::move(v));
      } else {
        args.keyword.emplace_back(e.keyword_names[i - 1 - e.positional], std::move(v));
      }
    }
    return args;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e, const ScopePtr& scope, std::optional<Value> caller = std::nullopt) {
    TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
    if (caller) args.keyword.emplace_back("caller", *std::move(caller));
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kAttr) {
      TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*callee.args[0], scope));
      if (obj.is_string() || obj.is_dict() || obj.is_list()) {
        absl::StatusOr<Value> r = CallMethod(obj, callee.name, args);
        if (r.ok()) return r;
        if (!absl::IsNotFound(r.status())) return At(e.offset, r.status());
      }
      absl::StatusOr<Value> attr = GetAttribute(obj, callee.name);
      if (!attr.ok()) return At(callee.offset, attr.status());
      if (!attr->is_callable()) {
        return ErrorAt(source_, e.offset, absl::StrCat("'", TypeName(obj), "' object has no method '", callee.name, "'"));
      }
      return Invoke(*attr, args, e.offset);
    }
    TANDEM_ASSIGN_OR_RETURN(Value f, Eval(callee, scope));
    return Invoke(f, args, e.offset);
  }

  absl::StatusOr<Value> Invoke(const Value& f, CallArgs& args, size_t offset) {
    if (f.is_undefined()) return ErrorAt(source_, offset, UndefinedMessage(f));
    if (!f.is_callable()) return ErrorAt(source_, offset, absl::StrCat("'", TypeName(f), "' object is not callable"));
    absl::StatusOr<Value> r = f.fn()(args);
    if (!r.ok()) return At(offset, r.status());
    return r;
  }

  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope) {
    Depth depth(&depth_);
    if (depth.exceeded()) return ErrorAt(source_, e.offset, "the template nests too deeply");
    TANDEM_RETURN_IF_ERROR(Step(e.offset));
    absl::StatusOr<Value> v = EvalInner(e, scope);
    if (!v.ok()) return At(e.offset, v.status());
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return EvalName(e.name, *scope);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const ExprPtr& a : e.args) {
          TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*a, scope));
          items.push_back(std::move(v));
        }
        return Value::List(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        ValueDict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          TANDEM_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], scope));
          TANDEM_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], scope));
          if (!k.is_string()) return absl::InvalidArgumentError("dict keys must be strings");
          bool replaced = false;
          for (auto& [ik, iv] : items) {
            if (ik == k.str()) {
              iv = v;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(k.str(), std::move(v));
        }
        return Value::Dict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
        return GetAttribute(obj, e.name);
      }
      case Expr::Kind::kItem: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
        TANDEM_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], scope));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        TANDEM_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[i + 1]) {
            TANDEM_ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1], scope));
          }
        }
        return Slice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall:
        return EvalCall(e, scope);
      case Expr::Kind::kFilter: {
        TANDEM_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0], scope));
        TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
        return ApplyFilter(e.name, input, args);
      }
      case Expr::Kind::kTest: {
        TANDEM_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0], scope));
        TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, scope));
        TANDEM_ASSIGN_OR_RETURN(bool pass, ApplyTest(e.name, input, args));
        return Value::Bool(pass != e.negated);
      }
      case Expr::Kind::kUnary:
        return EvalUnary(e, scope);
      case Expr::Kind::kBinary: {
        TANDEM_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], scope));
        TANDEM_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], scope));
        return BinaryOp(e.name, a, b);
      }
      case Expr::Kind::kCompare: {
        TANDEM_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          TANDEM_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], scope));
          TANDEM_ASSIGN_OR_RETURN(bool holds, Compare(e.ops[i], left, right));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        TANDEM_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], scope));
        if (a.Truthy() == (e.kind == Expr::Kind::kOr)) return a;
        return Eval(*e.args[1], scope);
      }
      case Expr::Kind::kCond: {
        TANDEM_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1], scope));
        if (c.Truthy()) return Eval(*e.args[0], scope);
        if (e.args[2]) return Eval(*e.args[2], scope);
        return Value::Undefined();
      }
    }
    return Value::Undefined();
  }

  absl::StatusOr<Value> EvalUnary(const Expr& e, const ScopePtr& scope) {
    TANDEM_ASSIGN_OR_RETURN(Value x, Eval(*e.args[0], scope));
    if (e.name == "not") return Value::Bool(!x.Truthy());
    if (x.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(x));
    if (!x.is_number()) return absl::InvalidArgumentError(absl::StrCat("bad operand type for unary ", e.name, ": '", TypeName(x), "'"));
    if (e.name == "+") return x.kind() == Value::Kind::kFloat ? x : Value::Int(x.as_int());
    if (x.kind() == Value::Kind::kFloat) return Value::Float(-x.as_double());
    if (x.as_int() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
    return Value::Int(-x.as_int());
  }

  static absl::StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Equals(a, b);
    if (op == "!=") return !Equals(a, b);
    if (op == "in" || op == "not in") {
      if (b.is_undefined()) return op == "not in";
      if (b.is_string() && !a.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(a)));
      }
      if (!b.is_string() && !b.is_list() && !b.is_dict()) {
        return absl::InvalidArgumentError(absl::StrCat("argument of type '", TypeName(b), "' is not iterable"));
      }
      CallArgs args;
      args.positional.push_back(b);
      TANDEM_ASSIGN_OR_RETURN(bool in, ApplyTest("in", a, args));
      return in == (op == "in");
    }
    if (a.is_undefined() || b.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(a.is_undefined() ? a : b));
    CallArgs args;
    args.positional.push_back(b);
    return ApplyTest(op, a, args);
  }

  static absl::StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::String(ToPythonString(a) + ToPythonString(b));
    if (a.is_undefined() || b.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(a.is_undefined() ? a : b));
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::String(a.str() + b.str());
      if (a.is_list() && b.is_list()) {
        ValueList items = a.list();
        items.insert(items.end(), b.list().begin(), b.list().end());
        return Value::List(std::move(items), a.is_tuple());
      }
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.is_int()) {
      const int64_t n = std::max<int64_t>(b.as_int(), 0);
      const size_t unit = a.is_string() ? a.str().size() : a.list().size();
      if (unit != 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 24) / unit) {
        return absl::InvalidArgumentError("repetition too large");
      }
      if (a.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += a.str();
        return Value::String(std::move(out));
      }
      ValueList items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), a.list().begin(), a.list().end());
      return Value::List(std::move(items));
    }
    if (!a.is_number() || !b.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a),
                                                     "' and '", TypeName(b), "'"));
    }
    return Arithmetic(op, a, b);
  }

  static absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
    const bool ints = a.is_int() && b.is_int();
    if ((op == "/" || op == "//" || op == "%") && b.as_double() == 0) {
      return absl::InvalidArgumentError("division by zero");
    }
    if (op == "/") return Value::Float(a.as_double() / b.as_double());
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
      if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
      if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
      if (op == "//" || op == "%") {
        if (x == INT64_MIN && y == -1) return absl::InvalidArgumentError("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        r = op == "//" ? q : m;
      }
      if (op == "**") {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        r = 1;
        if (x == 0 || x == 1 || x == -1) {
          r = x == 0 ? (y == 0 ? 1 : 0) : (x == -1 && y % 2 != 0 ? -1 : 1);
        } else {
          for (int64_t i = 0; i < y && !overflow; ++i) overflow = __builtin_mul_overflow(r, x, &r);  // ends by 63
        }
      }
      if (overflow) return absl::InvalidArgumentError("integer overflow");
      return Value::Int(r);
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    return Value::Float(std::pow(x, y));
  }

  const std::string& source_;
  const ValueDict& globals_;
  const RenderLimits& limits_;
  int depth_ = 0;
  int call_depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  auto parsed = std::make_shared<Parsed>();
  TANDEM_ASSIGN_OR_RETURN(parsed->lexed, Lex(source));
  TANDEM_ASSIGN_OR_RETURN(parsed->body, jinja::Parse(parsed->lexed));
  return Template(std::move(parsed));
}

absl::StatusOr<std::string> Template::Render(const ValueDict& globals, const RenderLimits& limits) const {
  Interpreter interpreter(parsed_->lexed.source, globals, limits);
  auto root = std::make_shared<Scope>(nullptr);
  std::string out;
  TANDEM_ASSIGN_OR_RETURN(Flow flow, interpreter.Exec(parsed_->body, root, &out));
  (void)flow;
  return out;
}

}  // namespace tandem::jinja

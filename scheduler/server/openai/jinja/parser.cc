#include "scheduler/server/openai/jinja/parser.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::jinja {
namespace {

bool IsKeyword(const std::string& s) {
  return s == "and" || s == "or" || s == "not" || s == "in" || s == "is" || s == "if" || s == "else";
}

// Parses the expression tokens of one tag.
class ExprParser {
 public:
  ExprParser(std::string_view source, const std::vector<Token>& toks) : src_(source), toks_(toks) {}

  const Token& Peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  bool AtEnd() const { return Peek().kind == Token::Kind::kEnd; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).kind == Token::Kind::kName && Peek(ahead).text == name;
  }
  bool TakeOp(std::string_view op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool TakeName(std::string_view name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  absl::Status Error(const std::string& what) const { return ErrorAt(src_, Peek().offset, what); }
  absl::Status Unexpected() const {
    const Token& t = Peek();
    if (t.kind == Token::Kind::kEnd) return Error("unexpected end of tag");
    return Error(absl::StrCat("unexpected '", t.kind == Token::Kind::kString ? "string" : t.text, "'"));
  }
  absl::Status ExpectOp(std::string_view op) {
    if (TakeOp(op)) return absl::OkStatus();
    return Error(absl::StrCat("expected '", std::string(op), "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Token::Kind::kName) return Error("expected a name");
    return toks_[pos_++].text;
  }
  absl::Status ExpectEnd() { return AtEnd() ? absl::OkStatus() : Unexpected(); }

  // A full expression, with `a if b else c`.
  absl::StatusOr<ExprPtr> Expression() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Or());
    while (IsName("if")) {
      const size_t at = Peek().offset;
      ++pos_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr cond, Or());
      ExprPtr otherwise;
      if (TakeName("else")) {
        TANDEM_ASSIGN_OR_RETURN(otherwise, Expression());
      }
      e = Make(Expr::Kind::kCond, at, std::move(e), std::move(cond), std::move(otherwise));
    }
    return e;
  }

  // `a, b` without parentheses (for targets and `set`): a tuple if a comma
  // follows, else the expression itself.
  absl::StatusOr<ExprPtr> TupleOrExpression() {
    const size_t at = Peek().offset;
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, Expression());
    if (!IsOp(",")) return first;
    auto tuple = Make(Expr::Kind::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (TakeOp(",")) {
      if (AtEnd()) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Expression());
      tuple->args.push_back(std::move(e));
    }
    return tuple;
  }

  // Names separated by commas (a for loop's targets).
  absl::StatusOr<std::vector<std::string>> Targets() {
    std::vector<std::string> names;
    const bool paren = TakeOp("(");
    do {
      TANDEM_ASSIGN_OR_RETURN(std::string n, ExpectName());
      names.push_back(std::move(n));
    } while (TakeOp(","));
    if (paren) TANDEM_RETURN_IF_ERROR(ExpectOp(")"));
    return names;
  }

  // Everything but the conditional expression (a for loop's iterable stops
  // before its `if`).
  absl::StatusOr<ExprPtr> Or() {
    TANDEM_RETURN_IF_ERROR(Enter());
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, And());
    while (IsName("or")) {
      const size_t at = Peek().offset;
      ++pos_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, And());
      e = Make(Expr::Kind::kOr, at, std::move(e), std::move(r));
    }
    --depth_;
    return e;
  }

 private:
  template <typename... Args>
  static ExprPtr Make(Expr::Kind kind, size_t offset, Args&&... args) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    (e->args.push_back(std::forward<Args>(args)), ...);
    return e;
  }

  absl::Status Enter() {
    if (++depth_ > kMaxNesting) return Error("expression nested too deeply");
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> And() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Not());
    while (IsName("and")) {
      const size_t at = Peek().offset;
      ++pos_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, Not());
      e = Make(Expr::Kind::kAnd, at, std::move(e), std::move(r));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      const size_t at = Peek().offset;
      ++pos_;
      TANDEM_RETURN_IF_ERROR(Enter());
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Not());
      --depth_;
      auto n = Make(Expr::Kind::kUnary, at, std::move(e));
      n->name = "not";
      return n;
    }
    return Compare();
  }

  absl::StatusOr<ExprPtr> Compare() {
    const size_t at = Peek().offset;
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, Math1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Peek();
      if (t.kind == Token::Kind::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = t.text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) cmp = Make(Expr::Kind::kCompare, at, std::move(first));
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, Math1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(r));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  absl::StatusOr<ExprPtr> BinaryLevel(std::initializer_list<std::string_view> ops,
                                      absl::StatusOr<ExprPtr> (ExprParser::*next)()) {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, (this->*next)());
    while (true) {
      std::string op;
      for (std::string_view o : ops) {
        if (IsOp(o)) op = std::string(o);
      }
      if (op.empty()) return e;
      const size_t at = Peek().offset;
      ++pos_;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr r, (this->*next)());
      e = Make(Expr::Kind::kBinary, at, std::move(e), std::move(r));
      e->name = op;
    }
  }
  absl::StatusOr<ExprPtr> Math1() { return BinaryLevel({"+", "-"}, &ExprParser::Concat); }
  absl::StatusOr<ExprPtr> Concat() { return BinaryLevel({"~"}, &ExprParser::Math2); }
  absl::StatusOr<ExprPtr> Math2() { return BinaryLevel({"*", "/", "//", "%"}, &ExprParser::Pow); }
  absl::StatusOr<ExprPtr> Pow() { return BinaryLevel({"**"}, &ExprParser::UnaryWithFilters); }
  absl::StatusOr<ExprPtr> UnaryWithFilters() { return Unary(true); }

  absl::StatusOr<ExprPtr> Unary(bool with_filters) {
    TANDEM_RETURN_IF_ERROR(Enter());
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const size_t at = Peek().offset;
      const std::string op = toks_[pos_++].text;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr x, Unary(false));
      e = Make(Expr::Kind::kUnary, at, std::move(x));
      e->name = op;
    } else {
      TANDEM_ASSIGN_OR_RETURN(e, Primary());
    }
    TANDEM_ASSIGN_OR_RETURN(e, Postfix(std::move(e)));
    if (with_filters) {
      TANDEM_ASSIGN_OR_RETURN(e, FiltersAndTests(std::move(e)));
    }
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token& t = Peek();
    const size_t at = t.offset;
    switch (t.kind) {
      case Token::Kind::kString: {
        std::string s;
        while (Peek().kind == Token::Kind::kString) s += toks_[pos_++].text;  // adjacent literals join
        auto e = Make(Expr::Kind::kLiteral, at);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case Token::Kind::kInt:
      case Token::Kind::kFloat: {
        auto e = Make(Expr::Kind::kLiteral, at);
        e->literal = t.kind == Token::Kind::kInt ? Value::Int(t.int_value) : Value::Float(t.float_value);
        ++pos_;
        return e;
      }
      case Token::Kind::kName: {
        const std::string& n = t.text;
        auto e = Make(Expr::Kind::kLiteral, at);
        if (n == "true" || n == "True") {
          e->literal = Value::Bool(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value::Bool(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::None();
        } else if (IsKeyword(n)) {
          return Unexpected();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        ++pos_;
        return e;
      }
      case Token::Kind::kOp:
        if (TakeOp("(")) return Parenthesized(at);
        if (TakeOp("[")) return ListLiteral(at);
        if (TakeOp("{")) return DictLiteral(at);
        return Unexpected();
      case Token::Kind::kEnd:
        return Unexpected();
    }
    return Unexpected();
  }

  absl::StatusOr<ExprPtr> Parenthesized(size_t at) {
    if (TakeOp(")")) return Make(Expr::Kind::kTuple, at);
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, Expression());
    if (TakeOp(")")) return first;
    auto tuple = Make(Expr::Kind::kTuple, at, std::move(first));
    while (TakeOp(",")) {
      if (IsOp(")")) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Expression());
      tuple->args.push_back(std::move(e));
    }
    TANDEM_RETURN_IF_ERROR(ExpectOp(")"));
    return tuple;
  }

  absl::StatusOr<ExprPtr> ListLiteral(size_t at) {
    auto list = Make(Expr::Kind::kList, at);
    while (!IsOp("]")) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr e, Expression());
      list->args.push_back(std::move(e));
      if (!TakeOp(",")) break;
    }
    TANDEM_RETURN_IF_ERROR(ExpectOp("]"));
    return list;
  }

  absl::StatusOr<ExprPtr> DictLiteral(size_t at) {
    auto dict = Make(Expr::Kind::kDict, at);
    while (!IsOp("}")) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr k, Expression());
      TANDEM_RETURN_IF_ERROR(ExpectOp(":"));
      TANDEM_ASSIGN_OR_RETURN(ExprPtr v, Expression());
      dict->args.push_back(std::move(k));
      dict->args.push_back(std::move(v));
      if (!TakeOp(",")) break;
    }
    TANDEM_RETURN_IF_ERROR(ExpectOp("}"));
    return dict;
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxNesting) return Error("expression nested too deeply");
      const size_t at = Peek().offset;
      if (TakeOp(".")) {
        if (Peek().kind != Token::Kind::kName && Peek().kind != Token::Kind::kInt) {
          return Error("expected an attribute name after '.'");
        }
        const Token& t = toks_[pos_++];
        if (t.kind == Token::Kind::kInt) {
          auto index = Make(Expr::Kind::kLiteral, t.offset);
          index->literal = Value::Int(t.int_value);
          e = Make(Expr::Kind::kItem, at, std::move(e), std::move(index));
        } else {
          e = Make(Expr::Kind::kAttr, at, std::move(e));
          e->name = t.text;
        }
      } else if (TakeOp("[")) {
        TANDEM_ASSIGN_OR_RETURN(e, Subscript(std::move(e), at));
      } else if (IsOp("(")) {
        ++pos_;
        TANDEM_ASSIGN_OR_RETURN(e, CallArguments(Make(Expr::Kind::kCall, at, std::move(e))));
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> Subscript(ExprPtr obj, size_t at) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (true) {
      if (IsOp(":")) {
        ++pos_;
        slice = true;
        if (++part > 2) return Error("a slice has at most three parts");
        continue;
      }
      if (IsOp("]")) break;
      if (parts[part]) return Unexpected();
      TANDEM_ASSIGN_OR_RETURN(parts[part], Expression());
    }
    ++pos_;  // ']'
    if (!slice) {
      if (!parts[0]) return Error("empty subscript");
      return Make(Expr::Kind::kItem, at, std::move(obj), std::move(parts[0]));
    }
    return Make(Expr::Kind::kSlice, at, std::move(obj), std::move(parts[0]), std::move(parts[1]),
                std::move(parts[2]));
  }

  // After '(': positional then keyword arguments, up to ')'.
  absl::StatusOr<ExprPtr> CallArguments(ExprPtr call) {
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        call->keyword_names.push_back(toks_[pos_].text);
        pos_ += 2;
      } else if (!call->keyword_names.empty()) {
        return Error("a positional argument follows a keyword argument");
      }
      TANDEM_ASSIGN_OR_RETURN(ExprPtr a, Expression());
      call->args.push_back(std::move(a));
      if (call->keyword_names.empty()) ++call->positional;
      if (!TakeOp(",")) break;
    }
    TANDEM_RETURN_IF_ERROR(ExpectOp(")"));
    return call;
  }

  // `| name(args)` and `is [not] name args`.
  absl::StatusOr<ExprPtr> FiltersAndTests(ExprPtr e) {
    int chain = 0;
    while (true) {
      if (++chain > kMaxNesting) return Error("expression nested too deeply");
      const size_t at = Peek().offset;
      if (TakeOp("|")) {
        TANDEM_ASSIGN_OR_RETURN(std::string name, DottedName());
        e = Make(Expr::Kind::kFilter, at, std::move(e));
        e->name = std::move(name);
        if (TakeOp("(")) {
          TANDEM_ASSIGN_OR_RETURN(e, CallArguments(std::move(e)));
        }
      } else if (TakeName("is")) {
        const bool negated = TakeName("not");
        TANDEM_ASSIGN_OR_RETURN(std::string name, DottedName());
        e = Make(Expr::Kind::kTest, at, std::move(e));
        e->name = std::move(name);
        e->negated = negated;
        if (TakeOp("(")) {
          TANDEM_ASSIGN_OR_RETURN(e, CallArguments(std::move(e)));
        } else if (TestArgumentFollows()) {
          TANDEM_ASSIGN_OR_RETURN(ExprPtr arg, Primary());
          TANDEM_ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
          e->args.push_back(std::move(arg));
          e->positional = 1;
        }
      } else if (IsOp("(")) {
        ++pos_;
        TANDEM_ASSIGN_OR_RETURN(e, CallArguments(Make(Expr::Kind::kCall, at, std::move(e))));
      } else {
        return e;
      }
    }
  }

  // jinja2 takes one argument without parentheses: `x is divisibleby 3`.
  bool TestArgumentFollows() const {
    const Token& t = Peek();
    if (t.kind == Token::Kind::kName) return !IsKeyword(t.text) || t.text == "not";
    return t.kind == Token::Kind::kString || t.kind == Token::Kind::kInt || t.kind == Token::Kind::kFloat ||
           IsOp("[") || IsOp("{");
  }

  absl::StatusOr<std::string> DottedName() {
    TANDEM_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".") && Peek(1).kind == Token::Kind::kName) {
      name += "." + Peek(1).text;
      pos_ += 2;
    }
    return name;
  }

  std::string_view src_;
  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// Parses the pieces into nodes, block by block.
class BodyParser {
 public:
  explicit BodyParser(const LexedTemplate& lexed) : lexed_(lexed) {}

  // Parses nodes until a statement whose keyword is in `ends` (left
  // unconsumed; *end_keyword says which) or the end of the template.
  absl::Status ParseBody(std::initializer_list<std::string_view> ends, Body* body, std::string* end_keyword,
                         size_t opened_at, std::string_view opener) {
    if (++depth_ > kMaxNesting) return ErrorAt(lexed_.source, opened_at, "blocks nested too deeply");
    while (next_ < lexed_.pieces.size()) {
      const Piece& piece = lexed_.pieces[next_];
      if (piece.kind == Piece::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.offset = piece.offset;
        n.text = piece.text;
        body->push_back(std::move(n));
        ++next_;
        continue;
      }
      ExprParser p(lexed_.source, piece.tokens);
      if (piece.kind == Piece::Kind::kOutput) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.offset = piece.offset;
        TANDEM_ASSIGN_OR_RETURN(n.expr, p.Expression());
        TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
        body->push_back(std::move(n));
        ++next_;
        continue;
      }
      if (p.Peek().kind != Token::Kind::kName) return ErrorAt(lexed_.source, piece.offset, "expected a statement");
      const std::string keyword = p.Peek().text;
      for (std::string_view end : ends) {
        if (keyword == end) {
          *end_keyword = keyword;
          --depth_;
          return absl::OkStatus();
        }
      }
      if (keyword == "else" || keyword == "elif" || keyword.rfind("end", 0) == 0) {
        return ErrorAt(lexed_.source, piece.offset,
                       opener.empty() ? absl::StrCat("unexpected '", keyword, "'")
                                      : absl::StrCat("unexpected '", keyword, "' inside '", std::string(opener),
                                                     "' (opened at ", Position(lexed_.source, opened_at), ")"));
      }
      ++next_;
      TANDEM_RETURN_IF_ERROR(Statement(keyword, piece.offset, p, body));
    }
    if (ends.size() > 0) {
      return ErrorAt(lexed_.source, opened_at, absl::StrCat("'", std::string(opener), "' is never closed"));
    }
    --depth_;
    return absl::OkStatus();
  }

 private:
  // Consumes the end statement the last ParseBody stopped at, checking that
  // nothing follows its keyword (`endfor`, `else`).
  absl::Status TakeEnd(std::string_view keyword) {
    const Piece& piece = lexed_.pieces[next_++];
    ExprParser p(lexed_.source, piece.tokens);
    p.TakeName(keyword);
    return p.ExpectEnd();
  }

  absl::Status Statement(const std::string& keyword, size_t at, ExprParser& p, Body* body) {
    p.TakeName(keyword);
    Node n;
    n.offset = at;
    std::string end;
    if (keyword == "if") {
      n.kind = Node::Kind::kIf;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr cond, p.Expression());
      TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
      n.conditions.push_back(std::move(cond));
      while (true) {
        n.bodies.emplace_back();
        TANDEM_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &n.bodies.back(), &end, at, "if"));
        const Piece& piece = lexed_.pieces[next_++];
        ExprParser q(lexed_.source, piece.tokens);
        q.TakeName(end);
        if (end == "elif") {
          TANDEM_ASSIGN_OR_RETURN(ExprPtr c, q.Expression());
          TANDEM_RETURN_IF_ERROR(q.ExpectEnd());
          n.conditions.push_back(std::move(c));
          continue;
        }
        TANDEM_RETURN_IF_ERROR(q.ExpectEnd());
        if (end == "else") {
          TANDEM_RETURN_IF_ERROR(ParseBody({"endif"}, &n.else_body, &end, at, "if"));
          TANDEM_RETURN_IF_ERROR(TakeEnd("endif"));
        }
        break;
      }
    } else if (keyword == "for") {
      n.kind = Node::Kind::kFor;
      TANDEM_ASSIGN_OR_RETURN(n.targets, p.Targets());
      if (!p.TakeName("in")) return p.Error("expected 'in'");
      TANDEM_ASSIGN_OR_RETURN(n.expr, p.Or());
      if (p.TakeName("if")) {
        TANDEM_ASSIGN_OR_RETURN(n.filter, p.Or());
      }
      if (p.TakeName("recursive")) return p.Error("recursive loops are not supported");
      TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
      n.bodies.emplace_back();
      ++loops_;
      TANDEM_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n.bodies[0], &end, at, "for"));
      --loops_;
      TANDEM_RETURN_IF_ERROR(TakeEnd(end));
      if (end == "else") {
        TANDEM_RETURN_IF_ERROR(ParseBody({"endfor"}, &n.else_body, &end, at, "for"));
        TANDEM_RETURN_IF_ERROR(TakeEnd("endfor"));
      }
    } else if (keyword == "set") {
      TANDEM_RETURN_IF_ERROR(SetStatement(at, p, &n));
    } else if (keyword == "macro" || keyword == "call") {
      TANDEM_RETURN_IF_ERROR(MacroOrCall(keyword, at, p, &n));
    } else if (keyword == "break" || keyword == "continue") {
      if (loops_ == 0) return ErrorAt(lexed_.source, at, absl::StrCat("'", keyword, "' outside a loop"));
      n.kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
    } else if (keyword == "filter") {
      n.kind = Node::Kind::kFilterBlock;
      TANDEM_ASSIGN_OR_RETURN(n.expr, FilterChainOnBlock(p));
      n.bodies.emplace_back();
      TANDEM_RETURN_IF_ERROR(ParseBody({"endfilter"}, &n.bodies[0], &end, at, "filter"));
      TANDEM_RETURN_IF_ERROR(TakeEnd("endfilter"));
    } else if (keyword == "generation") {
      // transformers' AssistantTracker: marks assistant text, renders it as is.
      n.kind = Node::Kind::kBlock;
      TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
      n.bodies.emplace_back();
      TANDEM_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n.bodies[0], &end, at, "generation"));
      TANDEM_RETURN_IF_ERROR(TakeEnd("endgeneration"));
    } else {
      return ErrorAt(lexed_.source, at, absl::StrCat("unknown statement '", keyword, "'"));
    }
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  // `{% filter upper %}` / `{% filter replace('a', 'b') | trim %}`: parsed as
  // the expression `__block__ | upper ...`.
  absl::StatusOr<ExprPtr> FilterChainOnBlock(ExprParser& p) {
    std::vector<Token> toks;
    toks.push_back({Token::Kind::kName, "__block__", 0, 0, p.Peek().offset});
    toks.push_back({Token::Kind::kOp, "|", 0, 0, p.Peek().offset});
    size_t i = 0;
    for (; p.Peek(i).kind != Token::Kind::kEnd; ++i) toks.push_back(p.Peek(i));
    toks.push_back(p.Peek(i));
    ExprParser q(lexed_.source, toks);
    TANDEM_ASSIGN_OR_RETURN(ExprPtr e, q.Expression());
    TANDEM_RETURN_IF_ERROR(q.ExpectEnd());
    return e;
  }

  absl::Status SetStatement(size_t at, ExprParser& p, Node* n) {
    n->kind = Node::Kind::kSet;
    TANDEM_ASSIGN_OR_RETURN(std::string first, p.ExpectName());
    if (p.TakeOp(".")) {
      TANDEM_ASSIGN_OR_RETURN(std::string attribute, p.ExpectName());
      n->targets = {first, attribute};
      n->attribute_set = true;
    } else {
      n->targets.push_back(first);
      while (p.TakeOp(",")) {
        TANDEM_ASSIGN_OR_RETURN(std::string more, p.ExpectName());
        n->targets.push_back(std::move(more));
      }
    }
    if (p.TakeOp("=")) {
      TANDEM_ASSIGN_OR_RETURN(n->expr, p.TupleOrExpression());
      return p.ExpectEnd();
    }
    if (n->attribute_set || n->targets.size() != 1) return p.Error("expected '='");
    // A block set: `{% set x %}...{% endset %}`, optionally filtered.
    n->kind = Node::Kind::kSetBlock;
    if (!p.AtEnd()) {
      if (!p.TakeOp("|")) return p.Unexpected();
      TANDEM_ASSIGN_OR_RETURN(n->filter, FilterChainOnBlock(p));
    }
    std::string end;
    n->bodies.emplace_back();
    TANDEM_RETURN_IF_ERROR(ParseBody({"endset"}, &n->bodies[0], &end, at, "set"));
    return TakeEnd("endset");
  }

  absl::Status MacroOrCall(const std::string& keyword, size_t at, ExprParser& p, Node* n) {
    const bool macro = keyword == "macro";
    n->kind = macro ? Node::Kind::kMacro : Node::Kind::kCallBlock;
    if (macro) {
      TANDEM_ASSIGN_OR_RETURN(n->name, p.ExpectName());
    }
    if (macro ? true : p.IsOp("(")) {
      TANDEM_RETURN_IF_ERROR(p.ExpectOp("("));
      while (!p.IsOp(")")) {
        TANDEM_ASSIGN_OR_RETURN(std::string param, p.ExpectName());
        n->params.push_back(std::move(param));
        ExprPtr def;
        if (p.TakeOp("=")) {
          TANDEM_ASSIGN_OR_RETURN(def, p.Expression());
        }
        n->defaults.push_back(std::move(def));
        if (!p.TakeOp(",")) break;
      }
      TANDEM_RETURN_IF_ERROR(p.ExpectOp(")"));
    }
    if (!macro) {
      TANDEM_ASSIGN_OR_RETURN(n->expr, p.Expression());
      if (n->expr->kind != Expr::Kind::kCall) return ErrorAt(lexed_.source, at, "'call' needs a macro call");
    }
    TANDEM_RETURN_IF_ERROR(p.ExpectEnd());
    const std::string end_keyword = macro ? "endmacro" : "endcall";
    std::string end;
    n->bodies.emplace_back();
    const int loops = loops_;
    loops_ = 0;  // break/continue do not cross a macro
    TANDEM_RETURN_IF_ERROR(ParseBody({end_keyword}, &n->bodies[0], &end, at, keyword));
    loops_ = loops;
    return TakeEnd(end_keyword);
  }

  const LexedTemplate& lexed_;
  int loops_ = 0;  // enclosing for loops (break/continue need one)
  size_t next_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> Parse(const LexedTemplate& lexed) {
  BodyParser parser(lexed);
  Body body;
  std::string end;
  TANDEM_RETURN_IF_ERROR(parser.ParseBody({}, &body, &end, 0, ""));
  return body;
}

}  // namespace tandem::jinja

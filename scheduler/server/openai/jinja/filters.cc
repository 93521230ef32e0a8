// jinja2's built-in filters and tests (the ones chat templates use), with
// transformers' tojson.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/server/openai/jinja/builtins.h"
#include "scheduler/server/openai/jinja/string_util.h"

namespace tandem::jinja {
namespace {

const Value* Arg(const CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool BoolArg(const CallArgs& args, size_t index, std::string_view name, bool dflt) {
  const Value* v = Arg(args, index, name);
  return v == nullptr ? dflt : v->Truthy();
}

// The arguments after the first `skip` positional ones (for select's test).
CallArgs Rest(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

absl::StatusOr<Value> ToJsonFilter(const Value& value, const CallArgs& args) {
  JsonDumpOptions o;
  o.ensure_ascii = BoolArg(args, 0, "ensure_ascii", false);
  if (const Value* indent = Arg(args, 1, "indent"); indent != nullptr && !indent->is_none()) {
    if (indent->is_string()) {
      o.indent_string = indent->str();
      if (o.indent_string.empty()) o.indent = 0;
    } else if (indent->is_int()) {
      o.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
    } else {
      return absl::InvalidArgumentError("tojson: indent must be an integer or a string");
    }
  }
  if (const Value* sep = Arg(args, 2, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_list() || sep->list().size() != 2 || !sep->list()[0].is_string() || !sep->list()[1].is_string()) {
      return absl::InvalidArgumentError("tojson: separators must be a pair of strings");
    }
    o.item_separator = sep->list()[0].str();
    o.key_separator = sep->list()[1].str();
    if (o.item_separator.empty() || o.key_separator.empty()) {
      return absl::InvalidArgumentError("tojson: empty separators are not supported");
    }
  }
  o.sort_keys = BoolArg(args, 3, "sort_keys", false);
  TANDEM_ASSIGN_OR_RETURN(std::string json, ToJson(value, o));
  return Value::String(std::move(json));
}

std::string IndentText(std::string s, const std::string& unit, bool first, bool blank) {
  s += "\n";  // jinja2's quirk, so splitlines sees a last empty line
  const std::vector<std::string> lines = SplitLines(s);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += unit;
    }
    out += lines[i];
  }
  return first ? unit + out : out;
}

absl::StatusOr<Value> IntFilter(const Value& value, const CallArgs& args) {
  const Value* dflt = Arg(args, 0, "default");
  const Value fallback = dflt != nullptr ? *dflt : Value::Int(0);
  if (value.is_int()) return Value::Int(value.as_int());
  // int64 holds what chat templates count; larger values take the default.
  auto in_range = [](double d) { return std::isfinite(d) && std::fabs(d) < 9.2e18; };
  if (value.kind() == Value::Kind::kFloat) {
    const double d = value.as_double();
    return in_range(d) ? Value::Int(static_cast<int64_t>(d)) : fallback;
  }
  if (value.is_string()) {
    const std::string s = Strip(value.str(), true, true, nullptr);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::Int(i);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && in_range(d)) return Value::Int(static_cast<int64_t>(d));
  }
  return fallback;
}

// `seq | selectattr('a', 'test', args)` and friends.
absl::StatusOr<Value> SelectFilter(const std::string& name, const Value& value, const CallArgs& args) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool reject = name == "reject" || name == "rejectattr";
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " needs an attribute name"));
    }
    attribute = args.positional[0].str();
    next = 1;
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return absl::InvalidArgumentError(absl::StrCat(name, ": the test must be a name"));
    test = args.positional[next].str();
    ++next;
  }
  CallArgs test_args = Rest(args, next);
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      TANDEM_ASSIGN_OR_RETURN(subject, GetAttributePath(item, attribute));
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      TANDEM_ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass != reject) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& value, const CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
  ValueList out;
  if (const Value* attribute = Arg(args, 99, "attribute"); attribute != nullptr) {
    const Value* dflt = Arg(args, 99, "default");
    for (const Value& item : items) {
      TANDEM_ASSIGN_OR_RETURN(Value v, GetAttributePath(item, ToPythonString(*attribute)));
      out.push_back(v.is_undefined() && dflt != nullptr ? *dflt : v);
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return absl::InvalidArgumentError("map needs a filter name or attribute=");
  }
  CallArgs filter_args = Rest(args, 1);
  for (const Value& item : items) {
    TANDEM_ASSIGN_OR_RETURN(Value v, ApplyFilter(args.positional[0].str(), item, filter_args));
    out.push_back(std::move(v));
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> JoinFilter(const Value& value, const CallArgs& args) {
  const Value* sep = Arg(args, 0, "d");
  const Value* attribute = Arg(args, 1, "attribute");
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0 && sep != nullptr) out += ToPythonString(*sep);
    Value item = items[i];
    if (attribute != nullptr) {
      TANDEM_ASSIGN_OR_RETURN(item, GetAttributePath(item, ToPythonString(*attribute)));
    }
    out += ToPythonString(item);
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> StringFilter(const std::string& name, const Value& value, const CallArgs& args) {
  const std::string s = ToPythonString(value);
  if (name == "trim") {
    const Value* chars = Arg(args, 0, "chars");
    const std::string set = chars != nullptr && chars->is_string() ? chars->str() : "";
    return Value::String(Strip(s, true, true, chars != nullptr && chars->is_string() ? &set : nullptr));
  }
  if (name == "upper") return Value::String(AsciiUpper(s));
  if (name == "lower") return Value::String(AsciiLower(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "title") return Value::String(JinjaTitle(s));
  if (name == "string") return value.is_string() ? value : Value::String(s);
  if (name == "replace") {
    const Value* old = Arg(args, 0, "old");
    const Value* with = Arg(args, 1, "new");
    const Value* count = Arg(args, 2, "count");
    if (old == nullptr || with == nullptr) return absl::InvalidArgumentError("replace needs old and new");
    return Value::String(Replace(s, ToPythonString(*old), ToPythonString(*with),
                                 count != nullptr && count->is_int() ? count->as_int() : -1));
  }
  if (name == "indent") {
    const Value* width = Arg(args, 0, "width");
    std::string unit(4, ' ');
    if (width != nullptr && width->is_string()) unit = width->str();
    if (width != nullptr && width->is_int()) unit = std::string(std::clamp<int64_t>(width->as_int(), 0, 1024), ' ');
    return Value::String(IndentText(s, unit, BoolArg(args, 1, "first", false), BoolArg(args, 2, "blank", false)));
  }
  if (name == "striptags") {
    std::string out;
    bool in_tag = false;
    for (char c : s) {
      if (c == '<') in_tag = true;
      if (!in_tag) out.push_back(c);
      if (c == '>') in_tag = false;
    }
    std::string collapsed;
    for (const std::string& w : PythonSplit(out, nullptr, -1, false)) absl::StrAppend(&collapsed, collapsed.empty() ? "" : " ", w);
    return Value::String(std::move(collapsed));
  }
  return absl::NotFoundError(name);
}

}  // namespace

// `a.b.c` for the attribute arguments of map/selectattr/join.
absl::StatusOr<Value> GetAttributePath(const Value& value, const std::string& path) {
  Value v = value;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    const std::string part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    char* end = nullptr;
    const long long index = std::strtoll(part.c_str(), &end, 10);
    if (!part.empty() && end == part.c_str() + part.size()) {
      TANDEM_ASSIGN_OR_RETURN(v, GetItem(v, Value::Int(index)));
    } else {
      TANDEM_ASSIGN_OR_RETURN(v, GetItem(v, Value::String(part)));
    }
    if (dot == std::string::npos) return v;
    begin = dot + 1;
  }
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, CallArgs& args) {
  if (name == "tojson") return ToJsonFilter(value, args);
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return value;
    std::string out;
    for (char c : ToPythonString(value)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out.push_back(c);
      }
    }
    return Value::String(std::move(out));
  }
  if (name == "length" || name == "count") {
    TANDEM_ASSIGN_OR_RETURN(int64_t n, Length(value));
    return Value::Int(n);
  }
  if (name == "default" || name == "d") {
    const Value* dflt = Arg(args, 0, "default_value");
    const bool boolean = BoolArg(args, 1, "boolean", false);
    const bool use_default = value.is_undefined() || (boolean && !value.Truthy());
    if (!use_default) return value;
    return dflt != nullptr ? *dflt : Value::String("");
  }
  if (name == "first" || name == "last") {
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    if (items.empty()) return Value::Undefined(absl::StrCat("no ", name, " item, sequence was empty"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (value.is_undefined()) return Value::List({});
    if (!value.is_dict()) return absl::InvalidArgumentError("items: the value is not a mapping");
    CallArgs none;
    return CallMethod(value, "items", none);
  }
  if (name == "reverse") {
    if (value.is_string()) return Slice(value, Value::None(), Value::None(), Value::Int(-1));
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "unique") {
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(value));
    ValueList out;
    for (const Value& v : items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return Equals(o, v); })) out.push_back(v);
    }
    return Value::List(std::move(out));
  }
  if (name == "join") return JoinFilter(value, args);
  if (name == "int") return IntFilter(value, args);
  if (name == "float") {
    if (value.is_number()) return Value::Float(value.as_double());
    if (value.is_string()) {
      char* end = nullptr;
      const double d = std::strtod(value.str().c_str(), &end);
      if (!value.str().empty() && end == value.str().c_str() + value.str().size()) return Value::Float(d);
    }
    const Value* dflt = Arg(args, 0, "default");
    return dflt != nullptr ? *dflt : Value::Float(0);
  }
  if (name == "abs") {
    if (!value.is_number()) return absl::InvalidArgumentError("abs: not a number");
    return value.kind() == Value::Kind::kFloat ? Value::Float(std::fabs(value.as_double()))
                                               : Value::Int(value.as_int() == INT64_MIN ? INT64_MIN
                                                                                        : std::llabs(value.as_int()));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectFilter(name, value, args);
  }
  if (name == "map") return MapFilter(value, args);
  absl::StatusOr<Value> s = StringFilter(name, value, args);
  if (absl::IsNotFound(s.status())) return absl::InvalidArgumentError(absl::StrCat("no filter named '", name, "'"));
  return s;
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& value, CallArgs& args) {
  const Value* other = Arg(args, 0, "other");
  auto need_other = [&]() -> absl::Status {
    if (other == nullptr) return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an argument"));
    return absl::OkStatus();
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "boolean") return value.is_bool();
  if (name == "true") return value.is_bool() && value.as_bool();
  if (name == "false") return value.is_bool() && !value.as_bool();
  if (name == "string") return value.is_string();
  if (name == "number") return value.is_number();
  if (name == "integer") return value.kind() == Value::Kind::kInt;
  if (name == "float") return value.kind() == Value::Kind::kFloat;
  if (name == "mapping") return value.is_dict();
  if (name == "iterable") return value.is_list() || value.is_dict() || value.is_string() || value.is_undefined();
  if (name == "sequence") return value.is_list() || value.is_dict() || value.is_string();
  if (name == "callable") return value.is_callable();
  if (name == "lower" || name == "upper") {
    if (!value.is_string()) return false;
    return value.str() == (name == "lower" ? AsciiLower(value.str()) : AsciiUpper(value.str()));
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!value.is_int()) return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs an integer"));
    if (name == "divisibleby") {
      TANDEM_RETURN_IF_ERROR(need_other());
      if (!other->is_int() || other->as_int() == 0) return absl::InvalidArgumentError("divisibleby needs a non-zero integer");
      return value.as_int() % other->as_int() == 0;
    }
    return (value.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    TANDEM_RETURN_IF_ERROR(need_other());
    return Equals(value, *other);
  }
  if (name == "ne" || name == "!=") {
    TANDEM_RETURN_IF_ERROR(need_other());
    return !Equals(value, *other);
  }
  if (name == "in") {
    TANDEM_RETURN_IF_ERROR(need_other());
    if (other->is_string()) {
      if (!value.is_string()) return absl::InvalidArgumentError("'in <string>' requires a string on the left");
      return other->str().find(value.str()) != std::string::npos;
    }
    if (other->is_dict()) return value.is_string() && other->Find(value.str()) != nullptr;
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(*other));
    return std::any_of(items.begin(), items.end(), [&](const Value& v) { return Equals(v, value); });
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge" || name == "<" || name == ">" || name == "<=" ||
      name == ">=") {
    TANDEM_RETURN_IF_ERROR(need_other());
    if (!(value.is_number() && other->is_number()) && !(value.is_string() && other->is_string())) {
      return absl::InvalidArgumentError(absl::StrCat("test '", name, "' cannot compare ", TypeName(value), " and ",
                                                     TypeName(*other)));
    }
    const int c = value.is_string() ? value.str().compare(other->str())
                                    : (value.as_double() < other->as_double() ? -1 : value.as_double() > other->as_double());
    if (name == "lt" || name == "<") return c < 0;
    if (name == "gt" || name == ">") return c > 0;
    if (name == "le" || name == "<=") return c <= 0;
    return c >= 0;
  }
  return absl::InvalidArgumentError(absl::StrCat("no test named '", name, "'"));
}

}  // namespace tandem::jinja

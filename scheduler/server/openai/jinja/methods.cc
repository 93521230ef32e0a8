// Access (attributes, items, slices, iteration) and the Python methods of
// str, dict and list that chat templates call.
#include <algorithm>
#include <cctype>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/server/openai/jinja/builtins.h"
#include "scheduler/server/openai/jinja/string_util.h"

namespace tandem::jinja {

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "object";
}

std::string UndefinedMessage(const Value& v) {
  if (v.undefined_name().empty()) return "a value is undefined";
  return absl::StrCat("'", v.undefined_name(), "' is undefined");
}

absl::StatusOr<ValueList> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
      return value.list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [k, v] : value.dict()) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      const std::vector<size_t> at = CodePointOffsets(value.str());
      for (size_t i = 0; i + 1 < at.size(); ++i) chars.push_back(Value::String(value.str().substr(at[i], at[i + 1] - at[i])));
      return chars;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(value), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(CodePointCount(value.str()));
    case Value::Kind::kList: return static_cast<int64_t>(value.list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(value.dict().size());
    default:
      return absl::InvalidArgumentError(absl::StrCat("object of type '", TypeName(value), "' has no len()"));
  }
}

namespace {

Value UndefinedAttribute(const Value& obj, const std::string& name) {
  return Value::Undefined(absl::StrCat(TypeName(obj), " object' has no attribute '", name));
}

// Python's index normalization; false when out of range.
bool NormalizeIndex(int64_t size, int64_t* index) {
  if (*index < 0) *index += size;
  return *index >= 0 && *index < size;
}

}  // namespace

absl::StatusOr<Value> GetAttribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(obj));
  if (obj.is_dict() || obj.is_namespace()) {
    if (const Value* v = obj.Find(name)) return *v;
  }
  return UndefinedAttribute(obj, name);
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(obj));
  if ((obj.is_dict() || obj.is_namespace()) && key.is_string()) {
    if (const Value* v = obj.Find(key.str())) return *v;
    return UndefinedAttribute(obj, key.str());
  }
  if ((obj.is_list() || obj.is_string()) && key.is_int()) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      if (!NormalizeIndex(static_cast<int64_t>(obj.list().size()), &i)) return Value::Undefined("index out of range");
      return obj.list()[i];
    }
    const std::vector<size_t> at = CodePointOffsets(obj.str());
    if (!NormalizeIndex(static_cast<int64_t>(at.size()) - 1, &i)) return Value::Undefined("index out of range");
    return Value::String(obj.str().substr(at[i], at[i + 1] - at[i]));
  }
  if (key.is_string()) return UndefinedAttribute(obj, key.str());
  return Value::Undefined(absl::StrCat(TypeName(obj), " object' has no item ", ToPythonRepr(key), "'"));
}

absl::StatusOr<Value> Slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) return absl::InvalidArgumentError(UndefinedMessage(obj));
  auto as_index = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (!v.is_int()) return absl::InvalidArgumentError(absl::StrCat("slice ", what, " must be an integer"));
    return std::optional<int64_t>(v.as_int());
  };
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> start, as_index(start_v, "start"));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> stop, as_index(stop_v, "stop"));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> step_o, as_index(step_v, "step"));
  const int64_t step = step_o.value_or(1);
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  if (!obj.is_list() && !obj.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  std::vector<size_t> at;
  int64_t n;
  if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else {
    at = CodePointOffsets(obj.str());
    n = static_cast<int64_t>(at.size()) - 1;
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(start, step < 0 ? n - 1 : 0);
  const int64_t hi = adjust(stop, step < 0 ? -1 : n);
  ValueList items;
  std::string text;
  for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
    if (obj.is_list()) {
      items.push_back(obj.list()[i]);
    } else {
      text += obj.str().substr(at[i], at[i + 1] - at[i]);
    }
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  if (obj.is_string()) return Value::String(std::move(text));
  return Value::List(std::move(items), obj.is_tuple());
}

namespace {

const Value* Arg(CallArgs& args, size_t index, std::string_view name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<std::string> StringArg(CallArgs& args, size_t index, std::string_view name, const std::string& method) {
  const Value* v = Arg(args, index, name);
  if (v == nullptr || !v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(method, "() needs a string argument '", std::string(name), "'"));
  }
  return v->str();
}

absl::StatusOr<Value> StringMethod(const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = Arg(args, 0, "chars");
    const std::string set = chars != nullptr && chars->is_string() ? chars->str() : std::string();
    const bool whitespace = chars == nullptr || chars->is_none();
    return Value::String(Strip(s, name != "rstrip", name != "lstrip", whitespace ? nullptr : &set));
  }
  if (name == "upper") return Value::String(AsciiUpper(s));
  if (name == "lower") return Value::String(AsciiLower(s));
  if (name == "title") return Value::String(PythonTitle(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "startswith" || name == "endswith") {
    const Value* p = Arg(args, 0, "prefix");
    if (p == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, "() takes an argument"));
    ValueList options = p->is_list() ? p->list() : ValueList{*p};
    for (const Value& o : options) {
      if (!o.is_string()) return absl::InvalidArgumentError(absl::StrCat(name, "() takes a string or a tuple of strings"));
      const std::string& x = o.str();
      const bool hit = x.size() <= s.size() &&
                       (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = Arg(args, 0, "sep");
    const Value* maxsplit = Arg(args, 1, "maxsplit");
    const int64_t max = maxsplit != nullptr && maxsplit->is_int() ? maxsplit->as_int() : -1;
    if (sep != nullptr && sep->is_string() && sep->str().empty()) return absl::InvalidArgumentError("empty separator");
    ValueList parts;
    for (std::string& p : PythonSplit(s, sep != nullptr && sep->is_string() ? &sep->str() : nullptr, max, name == "rsplit")) {
      parts.push_back(Value::String(std::move(p)));
    }
    return Value::List(std::move(parts));
  }
  if (name == "replace") {
    TANDEM_ASSIGN_OR_RETURN(std::string old, StringArg(args, 0, "old", name));
    TANDEM_ASSIGN_OR_RETURN(std::string with, StringArg(args, 1, "new", name));
    const Value* count = Arg(args, 2, "count");
    return Value::String(Replace(s, old, with, count != nullptr && count->is_int() ? count->as_int() : -1));
  }
  if (name == "find" || name == "count") {
    TANDEM_ASSIGN_OR_RETURN(std::string sub, StringArg(args, 0, "sub", name));
    if (name == "find") {
      const size_t at = s.find(sub);
      return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointCount(s.substr(0, at))));
    }
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos && !sub.empty(); at = s.find(sub, at + sub.size())) ++n;
    return Value::Int(sub.empty() ? static_cast<int64_t>(CodePointCount(s)) + 1 : n);
  }
  if (name == "join") {
    const Value* items = Arg(args, 0, "iterable");
    if (items == nullptr) return absl::InvalidArgumentError("join() takes an argument");
    TANDEM_ASSIGN_OR_RETURN(ValueList list, Iterate(*items));
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) return absl::InvalidArgumentError("join() expects strings");
      if (i > 0) out += s;
      out += list[i].str();
    }
    return Value::String(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    bool all = !s.empty();
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      all = all && (name == "isdigit" ? std::isdigit(u) : name == "isspace" ? std::isspace(u)
                    : name == "isalpha" ? std::isalpha(u) : std::isalnum(u));
    }
    return Value::Bool(all);
  }
  return absl::NotFoundError(name);
}

absl::StatusOr<Value> DictMethod(const Value& d, const std::string& name, CallArgs& args) {
  if (name == "items") {
    ValueList items;
    for (const auto& [k, v] : d.dict()) items.push_back(Value::List({Value::String(k), v}, /*tuple=*/true));
    return Value::List(std::move(items));
  }
  if (name == "keys" || name == "values") {
    ValueList items;
    for (const auto& [k, v] : d.dict()) items.push_back(name == "keys" ? Value::String(k) : v);
    return Value::List(std::move(items));
  }
  if (name == "get") {
    const Value* key = Arg(args, 0, "key");
    const Value* dflt = Arg(args, 1, "default");
    if (key == nullptr) return absl::InvalidArgumentError("get() takes a key");
    if (key->is_string()) {
      if (const Value* v = d.Find(key->str())) return *v;
    }
    return dflt != nullptr ? *dflt : Value::None();
  }
  return absl::NotFoundError(name);
}

}  // namespace

absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name, CallArgs& args) {
  if (object.is_string()) return StringMethod(object.str(), name, args);
  if (object.is_dict()) return DictMethod(object, name, args);
  if (object.is_list()) {
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" ||
        name == "clear" || name == "sort" || name == "reverse") {
      // transformers renders in an ImmutableSandboxedEnvironment.
      return absl::InvalidArgumentError(absl::StrCat("access to attribute '", name, "' of '", TypeName(object),
                                                     "' object is unsafe (lists are immutable in a chat template)"));
    }
    if (name == "index" || name == "count") {
      const Value* x = Arg(args, 0, "value");
      if (x == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, "() takes an argument"));
      int64_t n = 0;
      for (size_t i = 0; i < object.list().size(); ++i) {
        if (!Equals(object.list()[i], *x)) continue;
        if (name == "index") return Value::Int(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") return absl::InvalidArgumentError("list.index(x): x not in list");
      return Value::Int(n);
    }
  }
  return absl::NotFoundError(name);
}

}  // namespace tandem::jinja

// jinja::Value: the values a chat template computes with, modelled on the
// Python objects jinja2 sees when transformers renders a template: None,
// bool, int, float, str, list (tuples too), dict (insertion-ordered, string
// keys), jinja2's Undefined, a namespace() (the one mutable object) and
// callables (macros, caller, bound methods, global functions).
//
// Lists and dicts are immutable and shared (copying a Value is cheap), as in
// transformers' ImmutableSandboxedEnvironment, which refuses to mutate them.
// Strings hold UTF-8; length and slicing count code points, as Python does.
//
// Thread-compatible: a Value is used by one render at a time.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_VALUE_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // insertion order

// Arguments of a call: positional, then keyword (name, value) in call order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A callable's body. May return an error (raise_exception, a bad argument).
using Function = std::function<absl::StatusOr<Value>(CallArgs& args)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // undefined
  static Value Undefined(std::string name = "") {
    Value v;
    v.str_ = std::make_shared<std::string>(std::move(name));
    return v;
  }
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b) {
    Value v(Kind::kBool);
    v.int_ = b ? 1 : 0;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Kind::kInt);
    v.int_ = i;
    return v;
  }
  static Value Float(double d) {
    Value v(Kind::kFloat);
    v.float_ = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Kind::kString);
    v.str_ = std::make_shared<std::string>(std::move(s));
    return v;
  }
  static Value List(ValueList items, bool tuple = false) {
    Value v(Kind::kList);
    v.list_ = std::make_shared<ValueList>(std::move(items));
    v.int_ = tuple ? 1 : 0;
    return v;
  }
  static Value Dict(ValueDict items) {
    Value v(Kind::kDict);
    v.dict_ = std::make_shared<ValueDict>(std::move(items));
    return v;
  }
  // namespace(): attributes may be assigned with `set ns.x = ...`.
  static Value Namespace(ValueDict items) {
    Value v(Kind::kNamespace);
    v.dict_ = std::make_shared<ValueDict>(std::move(items));
    return v;
  }
  static Value Callable(Function f) {
    Value v(Kind::kCallable);
    v.fn_ = std::make_shared<Function>(std::move(f));
    return v;
  }
  // JSON to values (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // bool is an int in Python
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && int_ == 1; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  ValueDict& mutable_namespace() const { return *dict_; }
  const Function& fn() const { return *fn_; }
  // The name an undefined value was looked up by ("" if unknown).
  const std::string& undefined_name() const {
    static const std::string kEmpty;
    return str_ ? *str_ : kEmpty;
  }

  // dict/namespace lookup; nullptr if absent.
  const Value* Find(const std::string& key) const;

  // Python truthiness.
  bool Truthy() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<std::string> str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> fn_;
};

// Python's str() of a value, as `{{ x }}` prints it (repr inside lists and
// dicts; None, True, False; floats as Python prints them).
std::string ToPythonString(const Value& v);
// Python's repr().
std::string ToPythonRepr(const Value& v);
// Python's repr of a float (shortest round-trip digits, "1.0", "1e-05").
std::string FormatPythonFloat(double d);

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as transformers'
// tojson filter calls it. indent < 0 is None; item/key separators empty
// pick Python's defaults. Undefined and callables are not JSON: error.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_string;  // when indent was given as a string
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& options);

// Python ==.
bool Equals(const Value& a, const Value& b);

// UTF-8 helpers: code point count and the byte offsets of each code point
// (plus the end).
size_t CodePointCount(const std::string& s);
std::vector<size_t> CodePointOffsets(const std::string& s);

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_VALUE_H_

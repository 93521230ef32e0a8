// jinja2's built-in filters and tests, and the Python methods of str, dict
// and list that chat templates call, over jinja::Value. Errors are
// InvalidArgument without a position (the interpreter adds it).
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_BUILTINS_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_BUILTINS_H_

#include <string>

#include "absl/status/statusor.h"
#include "scheduler/server/openai/jinja/value.h"

namespace tandem::jinja {

// `value | name(args)`.
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, CallArgs& args);

// `value is name(args)`.
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& value, CallArgs& args);

// `object.name(args)` for a str, dict or list; NotFound if `object` has no
// such method (the caller then looks for an attribute).
absl::StatusOr<Value> CallMethod(const Value& object, const std::string& name, CallArgs& args);

// The items `for x in value` visits: a list's items, a dict's keys, a
// string's characters; nothing for undefined. Error for other types.
absl::StatusOr<ValueList> Iterate(const Value& value);

// Python len(); error for numbers and None.
absl::StatusOr<int64_t> Length(const Value& value);

// jinja2's environment.getattr / getitem: `obj.name` and `obj[key]`.
// Missing entries are Undefined; only an undefined object is an error.
absl::StatusOr<Value> GetAttribute(const Value& obj, const std::string& name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);

// `value.a.b` (dotted path, integer parts index lists) as map(attribute=),
// selectattr and join(attribute=) resolve it.
absl::StatusOr<Value> GetAttributePath(const Value& value, const std::string& path);

// Python's slice obj[start:stop:step] on a string (by code point) or list.
absl::StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// "'name' is undefined" (or "... has no attribute ...") for an undefined value.
std::string UndefinedMessage(const Value& v);

// Python's type name of a value ("str", "dict", "NoneType"...).
std::string TypeName(const Value& v);

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_BUILTINS_H_

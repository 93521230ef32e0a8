#include "scheduler/server/openai/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::jinja {

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u)) : Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJson(it.value()));
      return Dict(std::move(items));
    }
    default:
      return None();
  }
}

const Value* Value::Find(const std::string& key) const {
  if (!dict_ || !(is_dict() || is_namespace())) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !str_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string FormatPythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that read back as d.
  char buf[64];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (s[i] != '.') digits.push_back(s[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exponent + 1;
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out = digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += absl::StrFormat("e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return sign + out;
}

namespace {

std::string ReprString(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\x%02x", u);
    } else {
      out.push_back(c);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

std::string ToPythonRepr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return ReprString(v.str());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) out += ", ";
        out += ToPythonRepr(v.list()[i]);
      }
      if (v.is_tuple() && v.list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < v.dict().size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, ReprString(v.dict()[i].first), ": ", ToPythonRepr(v.dict()[i].second));
      }
      return out + "}";
    }
    default:
      return ToPythonString(v);
  }
}

std::string ToPythonString(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.as_int());
    case Value::Kind::kFloat:
      return FormatPythonFloat(v.as_double());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return ToPythonRepr(v);
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kCallable:
      return "<function>";
  }
  return "";
}

namespace {

// Decodes one UTF-8 sequence at s[*i]; invalid bytes decode as themselves.
uint32_t DecodeUtf8(const std::string& s, size_t* i) {
  const auto b = static_cast<unsigned char>(s[*i]);
  int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (*i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1f) : len == 3 ? (b & 0x0f) : (b & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3f);
  *i += len;
  return cp;
}

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      *out += "\\\"";
    } else if (c == '\\') {
      *out += "\\\\";
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c == '\b') {
      *out += "\\b";
    } else if (c == '\f') {
      *out += "\\f";
    } else if (c < 0x20) {
      absl::StrAppend(out, absl::StrFormat("\\u%04x", c));
    } else if (c >= 0x80 && ensure_ascii) {
      uint32_t cp = DecodeUtf8(s, &i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        absl::StrAppend(out, absl::StrFormat("\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff)));
      } else {
        absl::StrAppend(out, absl::StrFormat("\\u%04x", cp));
      }
      continue;
    } else {
      out->push_back(static_cast<char>(c));
    }
    ++i;
  }
  out->push_back('"');
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& o) : o_(o) {
    const bool indented = o.indent >= 0 || !o.indent_string.empty();
    item_sep_ = !o.item_separator.empty() ? o.item_separator : indented ? "," : ", ";
    key_sep_ = !o.key_separator.empty() ? o.key_separator : ": ";
    unit_ = !o.indent_string.empty() ? o.indent_string : std::string(std::max(o.indent, 0), ' ');
    indented_ = indented;
  }

  absl::Status Write(const Value& v, int depth, std::string* out) {
    if (depth > 256) return absl::InvalidArgumentError("tojson: the value is nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone:
        *out += "null";
        return absl::OkStatus();
      case Value::Kind::kBool:
        *out += v.as_bool() ? "true" : "false";
        return absl::OkStatus();
      case Value::Kind::kInt:
        absl::StrAppend(out, v.as_int());
        return absl::OkStatus();
      case Value::Kind::kFloat: {
        const double d = v.as_double();
        *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : FormatPythonFloat(d);
        return absl::OkStatus();
      }
      case Value::Kind::kString:
        AppendJsonString(v.str(), o_.ensure_ascii, out);
        return absl::OkStatus();
      case Value::Kind::kList:
        return WriteList(v.list(), depth, out);
      case Value::Kind::kDict:
        return WriteDict(v.dict(), depth, out);
      default:
        return absl::InvalidArgumentError(absl::StrCat("tojson: an object of type ",
                                                       v.is_undefined() ? "Undefined" : "function",
                                                       " is not JSON serializable"));
    }
  }

 private:
  void Newline(int depth, std::string* out) const {
    if (!indented_) return;
    out->push_back('\n');
    for (int i = 0; i < depth; ++i) *out += unit_;
  }

  absl::Status WriteList(const ValueList& items, int depth, std::string* out) {
    if (items.empty()) {
      *out += "[]";
      return absl::OkStatus();
    }
    out->push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) *out += item_sep_;
      Newline(depth + 1, out);
      if (absl::Status s = Write(items[i], depth + 1, out); !s.ok()) return s;
    }
    Newline(depth, out);
    out->push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const ValueDict& items, int depth, std::string* out) {
    if (items.empty()) {
      *out += "{}";
      return absl::OkStatus();
    }
    std::vector<const std::pair<std::string, Value>*> order;
    for (const auto& item : items) order.push_back(&item);
    if (o_.sort_keys) {
      std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->first < b->first; });
    }
    out->push_back('{');
    for (size_t i = 0; i < order.size(); ++i) {
      if (i > 0) *out += item_sep_;
      Newline(depth + 1, out);
      AppendJsonString(order[i]->first, o_.ensure_ascii, out);
      *out += key_sep_;
      if (absl::Status s = Write(order[i]->second, depth + 1, out); !s.ok()) return s;
    }
    Newline(depth, out);
    out->push_back('}');
    return absl::OkStatus();
  }

  const JsonDumpOptions& o_;
  std::string item_sep_, key_sep_, unit_;
  bool indented_ = false;
};

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  JsonWriter writer(options);
  if (absl::Status s = writer.Write(v, 0, &out); !s.ok()) return s;
  return out;
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList:
      if (a.list().size() != b.list().size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equals(a.list()[i], b.list()[i])) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    default:
      return &a == &b;
  }
}

size_t CodePointCount(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    DecodeUtf8(s, &i);
    ++n;
  }
  return n;
}

std::vector<size_t> CodePointOffsets(const std::string& s) {
  std::vector<size_t> offsets;
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    DecodeUtf8(s, &i);
  }
  offsets.push_back(s.size());
  return offsets;
}

}  // namespace tandem::jinja

#include "scheduler/server/openai/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"
#include "scheduler/server/openai/json_util.h"
#include "scheduler/server/openai/logits_fields.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::json;

// Reads optional fields of one JSON object, remembering the first error.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const std::optional<ApiError>& error() const { return error_; }
  void Fail(std::string message, std::string param) {
    if (!error_) error_ = BadRequest(std::move(message), std::move(param));
  }

  // The field if present and not null. Marks it read (see RefuseUnread).
  const Json* Get(const char* name) {
    read_.insert(name);
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  // Refuses the first field (in key order) that nothing read: a field we do
  // not know must not be accepted and silently ignored. null counts as absent.
  void RefuseUnread() {
    for (const auto& [name, value] : object_.items()) {
      if (!value.is_null() && read_.count(name) == 0) {
        return Fail(absl::StrCat("'", name, "' is not supported by this server"), name);
      }
    }
  }

  void Bool(const char* name, bool* out) {
    const Json* v = Get(name);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Fail(absl::StrCat("'", name, "' must be a boolean"), name);
    *out = v->get<bool>();
  }

  // A number in [lo, hi] (open at an end when `open_lo` / `open_hi`).
  void Number(const char* name, float* out, double lo, double hi, bool open_lo = false) {
    const Json* v = Get(name);
    if (v == nullptr) return;
    if (!v->is_number()) return Fail(absl::StrCat("'", name, "' must be a number"), name);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (open_lo && x == lo)) {
      return Fail(absl::StrCat("'", name, "' must be ", open_lo ? "greater than " : "at least ", lo, " and at most ", hi,
                               "; got ", v->dump()),
                  name);
    }
    *out = static_cast<float>(x);
  }

  template <typename Int>
  bool Integer(const char* name, Int* out, int64_t lo, int64_t hi) {
    const Json* v = Get(name);
    if (v == nullptr) return false;
    if (!v->is_number_integer()) {
      Fail(absl::StrCat("'", name, "' must be an integer"), name);
      return false;
    }
    // Out-of-range unsigned values read as negative here and are refused too.
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                          ? INT64_MIN
                          : v->get<int64_t>();
    if (x < lo || x > hi) {
      Fail(absl::StrCat("'", name, "' must be between ", lo, " and ", hi, "; got ", v->dump()), name);
      return false;
    }
    *out = static_cast<Int>(x);
    return true;
  }

  // Refuses a field we do not implement unless it has its harmless value.
  void Unsupported(const char* name, const Json& harmless) {
    const Json* v = Get(name);
    if (v != nullptr && *v != harmless) Fail(absl::StrCat("'", name, "' is not supported by this server"), name);
  }

 private:
  const Json& object_;
  std::optional<ApiError> error_;
  std::set<std::string, std::less<>> read_;
};

bool ParseTokenArray(const Json& array, std::vector<TokenId>* out) {
  out->clear();
  for (const Json& v : array) {
    if (!v.is_number_integer()) return false;
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<TokenId>::max()) return false;
    out->push_back(static_cast<TokenId>(id));
  }
  return true;
}

// prompt: a string, a list of strings, a list of token ids, or a list of lists of token ids.
void ParsePrompts(const Json* v, Fields* f, std::vector<Prompt>* prompts) {
  constexpr char kShape[] = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of them";
  if (v == nullptr) return f->Fail("'prompt' is required", "prompt");
  if (v->is_string()) {
    prompts->push_back({v->get<std::string>(), {}, false});
    return;
  }
  if (!v->is_array() || v->empty()) return f->Fail(kShape, "prompt");
  if ((*v)[0].is_number_integer()) {
    Prompt p;
    p.is_tokens = true;
    if (!ParseTokenArray(*v, &p.token_ids)) return f->Fail(kShape, "prompt");
    prompts->push_back(std::move(p));
    return;
  }
  if (v->size() > static_cast<size_t>(kMaxPrompts)) {
    return f->Fail(absl::StrCat("at most ", kMaxPrompts, " prompts per request"), "prompt");
  }
  for (const Json& item : *v) {
    Prompt p;
    if (item.is_string()) {
      p.text = item.get<std::string>();
    } else if (item.is_array() && ParseTokenArray(item, &p.token_ids)) {
      p.is_tokens = true;
    } else {
      return f->Fail(kShape, "prompt");
    }
    prompts->push_back(std::move(p));
  }
}

void ParseMessages(const Json* v, Fields* f, std::vector<ChatMessage>* messages) {
  if (v == nullptr) return f->Fail("'messages' is required", "messages");
  if (!v->is_array() || v->empty()) return f->Fail("'messages' must be a non-empty list", "messages");
  for (const Json& m : *v) {
    if (!m.is_object()) return f->Fail("each message must be an object with 'role' and 'content'", "messages");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return f->Fail("each message needs a string 'role'", "messages");
    ChatMessage message;
    message.role = role->get<std::string>();
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      // An assistant turn may carry no text.
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const Json& part : *content) {
        auto type = part.is_object() ? part.find("type") : part.end();
        auto text = part.is_object() ? part.find("text") : part.end();
        if (type == part.end() || *type != "text" || text == part.end() || !text->is_string()) {
          return f->Fail("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", "messages");
        }
        message.content += text->get<std::string>();
      }
    } else {
      return f->Fail("a message's 'content' must be a string or a list of text parts", "messages");
    }
    messages->push_back(std::move(message));
  }
}

void ParseStop(const Json* v, Fields* f, std::vector<std::string>* stop) {
  if (v == nullptr) return;
  if (v->is_string()) {
    stop->push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > static_cast<size_t>(kMaxStopStrings)) {
      return f->Fail(absl::StrCat("at most ", kMaxStopStrings, " stop strings"), "stop");
    }
    for (const Json& s : *v) {
      if (!s.is_string()) return f->Fail("'stop' must be a string or a list of strings", "stop");
      stop->push_back(s.get<std::string>());
    }
  } else {
    return f->Fail("'stop' must be a string or a list of strings", "stop");
  }
  for (const std::string& s : *stop) {
    if (s.empty()) return f->Fail("stop strings must not be empty", "stop");
    if (s.size() > static_cast<size_t>(kMaxStopStringBytes)) {
      return f->Fail(absl::StrCat("each stop string must be at most ", kMaxStopStringBytes, " bytes; got ", s.size()), "stop");
    }
  }
}

using structured::StructuredKind;
using structured::StructuredSpec;

// The value at `path` as the client wrote it, keys in their order:
// nlohmann::json sorts keys, but a schema's property order is the order its
// output's keys come in.
std::string OrderedDump(std::string_view body, std::initializer_list<const char*> path) {
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  const nlohmann::ordered_json* v = &json;
  for (const char* key : path) {
    // Present, since the caller read it from the same body; checked all the same.
    auto it = v->is_object() ? v->find(key) : v->end();
    if (it == v->end()) return "";
    v = &*it;
  }
  return v->dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

void SetStructured(StructuredSpec spec, Fields* f, GenerationRequest* r) {
  if (r->structured) {
    return f->Fail(absl::StrCat("only one structured-output constraint may be given; got '", r->structured->param,
                                "' and '", spec.param, "'"),
                   spec.param);
  }
  r->structured = std::move(spec);
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}.
void ParseResponseFormat(const Json* v, std::string_view body, Fields* f, GenerationRequest* r) {
  if (v == nullptr) return;
  constexpr char kParam[] = "response_format";
  auto type = v->is_object() ? v->find("type") : v->end();
  if (type == v->end() || !type->is_string()) {
    return f->Fail("'response_format' must be an object with a string 'type'", kParam);
  }
  const std::string kind = type->get<std::string>();
  if (kind == "text") return;
  if (kind == "json_object") return SetStructured({StructuredKind::kJsonObject, "", {}, kParam}, f, r);
  if (kind != "json_schema") {
    return f->Fail(absl::StrCat("unknown response_format type '", kind,
                                "'; expected 'text', 'json_object' or 'json_schema'"),
                   kParam);
  }
  auto spec = v->find("json_schema");
  if (spec == v->end() || !spec->is_object()) {
    return f->Fail("'response_format' of type 'json_schema' needs a 'json_schema' object", kParam);
  }
  auto name = spec->find("name");
  if (name != spec->end() && !name->is_string()) return f->Fail("'response_format.json_schema.name' must be a string", kParam);
  auto strict = spec->find("strict");
  if (strict != spec->end() && !strict->is_null() && !strict->is_boolean()) {
    return f->Fail("'response_format.json_schema.strict' must be a boolean", kParam);
  }
  auto schema = spec->find("schema");
  if (schema == spec->end() || !schema->is_object()) {
    return f->Fail("'response_format.json_schema.schema' must be a JSON schema object", kParam);
  }
  SetStructured({StructuredKind::kJsonSchema, OrderedDump(body, {"response_format", "json_schema", "schema"}), {}, kParam},
                f, r);
}

// One constraint of vLLM's: a schema (an object, or a string holding one),
// a regex, a grammar, or a list of choices. `path` locates `v` in the body.
void ParseConstraint(StructuredKind kind, const Json& v, std::string_view body,
                     std::initializer_list<const char*> path, std::string param, Fields* f, GenerationRequest* r) {
  StructuredSpec spec{kind, "", {}, param};
  switch (kind) {
    case StructuredKind::kJsonSchema:
      if (v.is_string()) {
        spec.text = v.get<std::string>();
      } else if (v.is_object()) {
        spec.text = OrderedDump(body, path);
      } else {
        return f->Fail(absl::StrCat("'", param, "' must be a JSON schema (an object or a string)"), param);
      }
      break;
    case StructuredKind::kChoice:
      if (!v.is_array() || v.empty()) return f->Fail(absl::StrCat("'", param, "' must be a non-empty list of strings"), param);
      for (const Json& c : v) {
        if (!c.is_string() || c.get<std::string>().empty()) {
          return f->Fail(absl::StrCat("'", param, "' must be a non-empty list of non-empty strings"), param);
        }
        spec.choices.push_back(c.get<std::string>());
      }
      break;
    case StructuredKind::kJsonObject:
      if (!v.is_boolean()) return f->Fail(absl::StrCat("'", param, "' must be a boolean"), param);
      if (!v.get<bool>()) return;
      break;
    default:  // a regex or a grammar
      if (!v.is_string() || v.get<std::string>().empty()) {
        return f->Fail(absl::StrCat("'", param, "' must be a non-empty string"), param);
      }
      spec.text = v.get<std::string>();
  }
  SetStructured(std::move(spec), f, r);
}

// vLLM's guided_* fields and their newer form, structured_outputs.
void ParseGuided(std::string_view body, Fields* f, GenerationRequest* r) {
  static constexpr struct {
    const char* name;
    StructuredKind kind;
  } kGuided[] = {{"guided_json", StructuredKind::kJsonSchema},
                 {"guided_regex", StructuredKind::kRegex},
                 {"guided_choice", StructuredKind::kChoice},
                 {"guided_grammar", StructuredKind::kGrammar}};
  for (const auto& g : kGuided) {
    if (const Json* v = f->Get(g.name)) ParseConstraint(g.kind, *v, body, {g.name}, g.name, f, r);
  }
  f->Unsupported("guided_whitespace_pattern", nullptr);
  const Json* so = f->Get("structured_outputs");
  if (so == nullptr) return;
  if (!so->is_object()) return f->Fail("'structured_outputs' must be an object", "structured_outputs");
  static constexpr struct {
    const char* name;
    StructuredKind kind;
  } kKeys[] = {{"json", StructuredKind::kJsonSchema},
               {"regex", StructuredKind::kRegex},
               {"choice", StructuredKind::kChoice},
               {"grammar", StructuredKind::kGrammar},
               {"json_object", StructuredKind::kJsonObject}};
  for (const auto& [key, value] : so->items()) {
    if (value.is_null()) continue;
    // Nothing to fall back to, and free whitespace is never allowed (compact JSON).
    if ((key == "disable_fallback" || key == "disable_any_whitespace") && value.is_boolean()) continue;
    const std::string param = absl::StrCat("structured_outputs.", key);
    const auto* known = std::find_if(std::begin(kKeys), std::end(kKeys), [&key](const auto& k) { return key == k.name; });
    if (known == std::end(kKeys)) return f->Fail(absl::StrCat("'", param, "' is not supported by this server"), param);
    ParseConstraint(known->kind, value, body, {"structured_outputs", known->name}, param, f, r);
  }
}

// The JSON schema of vLLM's "required" tool choice: a non-empty list of
// calls, each {"name": one of the tools, "parameters": its arguments}.
std::string RequiredToolsSchema(const std::vector<ToolFunction>& tools) {
  using Ordered = nlohmann::ordered_json;
  Ordered any_of = Ordered::array();
  for (const ToolFunction& t : tools) {
    Ordered parameters = t.parameters.empty() ? Ordered{{"type", "object"}}
                                              : Ordered::parse(t.parameters, nullptr, /*allow_exceptions=*/false);
    any_of.push_back(Ordered{{"type", "object"},
                             {"properties", {{"name", {{"type", "string"}, {"enum", {t.name}}}}, {"parameters", parameters}}},
                             {"required", {"name", "parameters"}}});
  }
  return Ordered{{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any_of}}}}.dump();
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}] and
// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}. "auto"
// (the default with tools) is free output for a tool-call parser; the frontend checks it has one.
void ParseTools(Endpoint endpoint, std::string_view body, Fields* f, GenerationRequest* r) {
  const Json* tools = f->Get("tools");
  const Json* choice = f->Get("tool_choice");
  f->Unsupported("functions", Json::array());
  if (tools == nullptr) {
    if (choice != nullptr && *choice != "none") f->Fail("'tool_choice' needs 'tools'", "tool_choice");
    return;
  }
  if (endpoint != Endpoint::kChatCompletions) return f->Fail("'tools' is only supported on /v1/chat/completions", "tools");
  constexpr char kShape[] = "'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\", ...}}";
  if (!tools->is_array()) return f->Fail(kShape, "tools");
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    auto function = t.is_object() ? t.find("function") : t.end();
    if (!t.is_object() || t.value("type", "") != "function" || function == t.end() || !function->is_object()) {
      return f->Fail(kShape, "tools");
    }
    auto name = function->find("name");
    if (name == function->end() || !name->is_string() || name->get<std::string>().empty()) {
      return f->Fail("each tool's function needs a non-empty string 'name'", "tools");
    }
    ToolFunction tool;
    tool.name = name->get<std::string>();
    if (auto d = function->find("description"); d != function->end() && d->is_string()) tool.description = d->get<std::string>();
    if (auto p = function->find("parameters"); p != function->end() && !p->is_null()) {
      if (!p->is_object()) return f->Fail(absl::StrCat("the parameters of tool '", tool.name, "' must be a JSON schema object"), "tools");
      tool.parameters = ordered["tools"][i]["function"]["parameters"].dump();
    }
    r->tools.push_back(std::move(tool));
  }
  r->tools_json = ordered["tools"].dump();
  if (choice == nullptr || *choice == "auto") {
    r->tool_choice = ToolChoice::kAuto;
    return;
  }
  if (*choice == "none") return;
  StructuredSpec spec{StructuredKind::kJsonSchema, "", {}, "tool_choice"};
  if (*choice == "required") {
    r->tool_choice = ToolChoice::kRequired;
    spec.text = RequiredToolsSchema(r->tools);
  } else {
    const Json* name = nullptr;
    if (choice->is_object() && choice->value("type", "") == "function") {
      auto function = choice->find("function");
      if (function != choice->end() && function->is_object()) {
        auto it = function->find("name");
        if (it != function->end()) name = &*it;
      }
    }
    if (name == nullptr || !name->is_string()) {
      return f->Fail("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}",
                     "tool_choice");
    }
    auto tool = std::find_if(r->tools.begin(), r->tools.end(), [&](const ToolFunction& t) { return t.name == *name; });
    if (tool == r->tools.end()) {
      return f->Fail(absl::StrCat("'tool_choice' names '", name->get<std::string>(), "', which is not in 'tools'"),
                     "tool_choice");
    }
    r->tool_choice = ToolChoice::kNamed;
    r->tool_choice_name = tool->name;
    spec.text = tool->parameters.empty() ? R"({"type":"object"})" : tool->parameters;
  }
  SetStructured(std::move(spec), f, r);
}

// best_of as vLLM v0: at least n, and only for whole responses (a stream
// would have to send every candidate before knowing which are the best).
void ParseBestOf(Fields* f, GenerationRequest* r) {
  r->best_of = r->n;
  if (!f->Integer("best_of", &r->best_of, 1, kMaxChoices)) return;
  if (r->best_of < r->n) {
    return f->Fail(absl::StrCat("'best_of' must be at least 'n'; got best_of ", r->best_of, " and n ", r->n), "best_of");
  }
  if (r->stream && r->best_of != r->n) return f->Fail("'best_of' other than 'n' is not allowed with \"stream\": true", "best_of");
  if (r->prompts.size() * static_cast<size_t>(r->best_of) > static_cast<size_t>(kMaxSequences)) {
    f->Fail(absl::StrCat("best_of times the number of prompts must be at most ", kMaxSequences, "; got ", r->best_of,
                         " x ", r->prompts.size()),
            "best_of");
  }
}

// Whether `body` nests arrays and objects deeper than `limit`, counting
// brackets outside strings. Linear and recursion-free; on text that is not
// JSON the answer does not matter (the parser refuses it anyway).
bool NestsDeeperThan(std::string_view body, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote perhaps
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// echo (completions only) and prompt_logprobs (both endpoints); neither is
// streamed yet. Echo with logprobs scores the prompt with logprobs' top k.
void ParseEchoAndPromptLogprobs(bool chat, Fields* f, GenerationRequest* r) {
  if (chat) {
    f->Unsupported("echo", false);
  } else {
    f->Bool("echo", &r->echo);
  }
  f->Integer("prompt_logprobs", &r->prompt_logprobs, 0, kMaxLogprobs);
  if (r->stream && r->echo) f->Fail("'echo' is not supported with \"stream\": true", "echo");
  if (r->stream && r->prompt_logprobs >= 0) {
    f->Fail("'prompt_logprobs' is not supported with \"stream\": true", "prompt_logprobs");
  }
  r->sampling.prompt_logprobs = std::max(r->prompt_logprobs, r->echo ? r->logprobs : -1);
}

}  // namespace

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::string ApiError::ToJson() const {
  Json error = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) error["param"] = param;
  return DumpJson(Json{{"error", std::move(error)}});
}

std::variant<GenerationRequest, ApiError> ParseGenerationRequest(Endpoint endpoint, std::string_view body) {
  // JSON is UTF-8 (RFC 8259); saying so beats the parser's generic refusal.
  if (!tokenizer_internal::IsValidUtf8(body)) return BadRequest("the request body is not valid UTF-8");
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return BadRequest(absl::StrCat("the request body nests arrays and objects deeper than ", kMaxJsonDepth, " levels"));
  }
  const Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return BadRequest("the request body is not valid JSON");
  if (!json.is_object()) return BadRequest("the request body must be a JSON object");

  GenerationRequest r;
  r.endpoint = endpoint;
  Fields f(json);
  const bool chat = endpoint == Endpoint::kChatCompletions;
  if (const Json* v = f.Get("model")) {
    if (!v->is_string()) return BadRequest("'model' must be a string", "model");
    r.model = v->get<std::string>();
  }
  if (chat) {
    ParseMessages(f.Get("messages"), &f, &r.messages);
  } else {
    ParsePrompts(f.Get("prompt"), &f, &r.prompts);
  }

  f.Integer("n", &r.n, 1, kMaxChoices);
  if (r.prompts.size() * static_cast<size_t>(r.n) > static_cast<size_t>(kMaxSequences)) {
    f.Fail(absl::StrCat("n times the number of prompts must be at most ", kMaxSequences, "; got ", r.n, " x ",
                        r.prompts.size()),
           "n");
  }
  f.Bool("stream", &r.stream);
  if (const Json* options = f.Get("stream_options")) {
    if (!options->is_object()) {
      f.Fail("'stream_options' must be an object", "stream_options");
    } else if (!r.stream) {
      f.Fail("'stream_options' is only allowed with \"stream\": true", "stream_options");
    } else {
      Fields o(*options);
      o.Bool("include_usage", &r.include_usage);
      if (o.error()) f.Fail(o.error()->message, "stream_options");
    }
  }
  // max_completion_tokens is the chat API's newer name and wins.
  int32_t max_tokens = 0;
  if (f.Integer("max_tokens", &max_tokens, 1, 1 << 24)) r.max_tokens = max_tokens;
  if (chat && f.Integer("max_completion_tokens", &max_tokens, 1, 1 << 24)) r.max_tokens = max_tokens;
  f.Integer("min_tokens", &r.sampling.min_tokens, 0, 1 << 24);
  if (r.max_tokens && r.sampling.min_tokens > *r.max_tokens) {
    f.Fail("'min_tokens' must not exceed 'max_tokens'", "min_tokens");
  }
  ParseStop(f.Get("stop"), &f, &r.stop);
  if (const Json* v = f.Get("stop_token_ids")) {
    if (!v->is_array() || !ParseTokenArray(*v, &r.sampling.stop_token_ids)) {
      f.Fail("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    }
  }
  f.Bool("include_stop_str_in_output", &r.include_stop_str_in_output);
  f.Bool("skip_special_tokens", &r.skip_special_tokens);
  f.Bool("ignore_eos", &r.sampling.ignore_eos);

  r.sampling.temperature = 1.0f;
  f.Number("temperature", &r.sampling.temperature, 0, 2);
  f.Number("top_p", &r.sampling.top_p, 0, 1, /*open_lo=*/true);
  f.Integer("top_k", &r.sampling.top_k, -1, 1 << 24);
  if (r.sampling.top_k < 0) r.sampling.top_k = 0;  // vLLM's -1: no limit
  f.Number("min_p", &r.sampling.min_p, 0, 1);
  f.Number("presence_penalty", &r.sampling.presence_penalty, -2, 2);
  f.Number("frequency_penalty", &r.sampling.frequency_penalty, -2, 2);
  f.Number("repetition_penalty", &r.sampling.repetition_penalty, 0, 2, /*open_lo=*/true);
  int64_t seed = 0;
  if (f.Integer("seed", &seed, INT64_MIN, INT64_MAX)) r.sampling.seed = static_cast<uint64_t>(seed);
  f.Integer("priority", &r.priority, INT32_MIN, INT32_MAX);

  if (chat) {
    bool logprobs = false;
    f.Bool("logprobs", &logprobs);
    int32_t top = 0;
    const bool has_top = f.Integer("top_logprobs", &top, 0, kMaxLogprobs);
    if (has_top && !logprobs) f.Fail("'top_logprobs' needs \"logprobs\": true", "top_logprobs");
    if (logprobs) r.logprobs = top;
  } else {
    f.Integer("logprobs", &r.logprobs, 0, kMaxLogprobs);
  }
  r.sampling.logprobs = r.logprobs;
  if (const Json* v = f.Get("user")) {
    if (!v->is_string()) f.Fail("'user' must be a string", "user");
    else r.user = v->get<std::string>();
  }

  // Known parameters we do not implement: refused, not silently ignored.
  ParseEchoAndPromptLogprobs(chat, &f, &r);
  f.Unsupported("suffix", "");
  if (auto e = ParseLogitBias(f.Get("logit_bias"), &r.sampling.logit_bias)) f.Fail(*e, "logit_bias");
  if (auto e = ParseBadWords(f.Get("bad_words"), &r.bad_words)) f.Fail(*e, "bad_words");
  ParseTools(endpoint, body, &f, &r);
  ParseResponseFormat(f.Get("response_format"), body, &f, &r);
  ParseGuided(body, &f, &r);
  ParseBestOf(&f, &r);
  if (chat) {
    // Read by the frontend, which renders the chat template; checked here.
    if (const Json* v = f.Get("chat_template_kwargs"); v != nullptr && !v->is_object()) {
      f.Fail("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    }
    bool add_generation_prompt = true;
    f.Bool("add_generation_prompt", &add_generation_prompt);
  }
  f.RefuseUnread();
  if (f.error()) return *f.error();
  return r;
}

}  // namespace tandem::openai

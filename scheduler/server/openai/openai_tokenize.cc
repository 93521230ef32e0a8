#include "scheduler/server/openai/openai_tokenize.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {
namespace {

using Json = nlohmann::ordered_json;

std::variant<Json, ApiError> ParseObject(const std::string& body) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return BadRequest("the request body must be a JSON object");
  return j;
}

// The optional "model" must name the served model, as on /v1/*.
std::optional<ApiError> CheckModel(const Json& j, const TokenizeContext& c) {
  const auto model = j.find("model");
  if (model == j.end() || model->is_null()) return std::nullopt;
  if (!model->is_string()) return BadRequest("'model' must be a string", "model");
  if (model->get<std::string>().empty() || *model == c.served_model_name) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.type = "not_found_error";
  e.param = "model";
  e.message = absl::StrCat("The model `", model->get<std::string>(), "` does not exist; this server serves `",
                           c.served_model_name, "`.");
  return e;
}

std::optional<bool> OptionalBool(const Json& j, const char* key, bool dflt, std::optional<ApiError>* error) {
  const auto v = j.find(key);
  if (v == j.end() || v->is_null()) return dflt;
  if (!v->is_boolean()) {
    *error = BadRequest(absl::StrCat("'", key, "' must be a boolean"), key);
    return std::nullopt;
  }
  return v->get<bool>();
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

std::variant<std::string, ApiError> Tokenize(const std::string& body, const TokenizeContext& c) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  if (auto e = CheckModel(j, c)) return *e;
  const bool chat = j.contains("messages");
  if (chat == j.contains("prompt")) return BadRequest("send either 'prompt' or 'messages'", chat ? "prompt" : "prompt");
  std::optional<ApiError> error;
  const std::optional<bool> add_special = OptionalBool(j, "add_special_tokens", /*dflt=*/!chat, &error);
  const std::optional<bool> return_strs = OptionalBool(j, "return_token_strs", false, &error);
  if (error) return *error;
  std::vector<TokenId> ids;
  if (chat) {
    const std::optional<bool> gen = OptionalBool(j, "add_generation_prompt", true, &error);
    if (error) return *error;
    if (!c.chat_template->ok()) return BadRequest(std::string(c.chat_template->status().message()), "messages");
    ChatRenderInput in;
    in.messages = j["messages"];
    in.tools = j.value("tools", Json());
    in.chat_template_kwargs = j.value("chat_template_kwargs", Json());
    in.add_generation_prompt = *gen;
    absl::StatusOr<std::string> text = (*c.chat_template)->Render(in);
    if (!text.ok()) return BadRequest(std::string(text.status().message()), "messages");
    // The template writes the special tokens itself, as for chat completions.
    ids = c.tokenizer->Encode(*text, *add_special, /*parse_special=*/true);
  } else {
    const Json& prompt = j["prompt"];
    if (!prompt.is_string()) return BadRequest("'prompt' must be a string", "prompt");
    // As /v1/completions encodes a prompt: special-token text stays text.
    ids = c.tokenizer->Encode(prompt.get<std::string>(), *add_special, /*parse_special=*/false);
  }
  Json out = {{"count", ids.size()}, {"max_model_len", c.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (*return_strs) {
    Json strs = Json::array();
    for (TokenId id : ids) strs.push_back(c.tokenizer->TokenBytes(id));
    out["token_strs"] = std::move(strs);
  }
  return Dump(out);
}

std::variant<std::string, ApiError> Detokenize(const std::string& body, const TokenizeContext& c) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& j = std::get<Json>(parsed);
  if (auto e = CheckModel(j, c)) return *e;
  const auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array()) return BadRequest("'tokens' must be a list of token ids", "tokens");
  std::vector<TokenId> ids;
  for (const Json& t : *tokens) {
    if (!t.is_number_integer()) return BadRequest("'tokens' must be a list of token ids", "tokens");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= c.tokenizer->vocab_size()) {
      return BadRequest(absl::StrCat("token id ", id, " is outside the vocabulary (", c.tokenizer->vocab_size(),
                                     " tokens)"),
                        "tokens");
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  return Dump(Json{{"prompt", c.tokenizer->Decode(ids)}});
}

}  // namespace tandem::openai

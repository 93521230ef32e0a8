#include "scheduler/server/openai/openai_frontend.h"

#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/server/openai/json_util.h"
#include "scheduler/server/openai/logits_fields.h"
#include "scheduler/server/openai/openai_call.h"
#include "scheduler/server/openai/openai_tokenize.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::json;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError NotFound(std::string message) {
  ApiError e;
  e.status = 404;
  e.type = "not_found_error";
  e.message = std::move(message);
  return e;
}

// A random suffix for response ids: unique across restarts too.
std::string RandomHex() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x", rng());
}

// What the chat template is given, from the request as the client sent it
// (key order kept: tools print with tojson). The body already parsed.
ChatRenderInput ChatInputOf(const std::string& body) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  ChatRenderInput in;
  if (!j.is_object()) return in;
  in.messages = j.value("messages", nlohmann::ordered_json::array());
  in.tools = j.value("tools", nlohmann::ordered_json());
  in.chat_template_kwargs = j.value("chat_template_kwargs", nlohmann::ordered_json());
  const auto gen = j.find("add_generation_prompt");
  in.add_generation_prompt = gen == j.end() || !gen->is_boolean() || gen->get<bool>();
  return in;
}

}  // namespace

OpenAiFrontend::OpenAiFrontend(OpenAiFrontendOptions options, scheduler::ServingEngine* engine,
                               const Tokenizer* tokenizer, absl::StatusOr<ChatTemplate> chat_template,
                               scheduler::ServingMetrics* metrics, std::function<GroupView()> group)
    : options_(std::move(options)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(std::move(chat_template)),
      metrics_(metrics),
      group_(std::move(group)),
      created_(UnixSeconds()) {
  if (chat_template_.ok()) {
    for (const std::string& token : chat_template_->end_of_turn_tokens()) {
      if (const TokenId id = tokenizer_->FindToken(token); id >= 0) end_of_turn_ids_.push_back(id);
    }
  }
}

int32_t OpenAiFrontend::MaxModelLen() const {
  const int32_t len = engine_->Snapshot().max_model_len;
  return len > 0 ? len : options_.model_context_length;
}

void OpenAiFrontend::RespondJson(http::ResponseWriter& writer, int status, const std::string& body) {
  metrics_->OnHttpResponse(status);
  writer.Respond(status, "application/json", body);
}

void OpenAiFrontend::RespondError(http::ResponseWriter& writer, const ApiError& error) {
  RespondJson(writer, error.status, error.ToJson());
}

http::ErrorBody OpenAiFrontend::ErrorBodyOf(int status, const std::string& message) {
  ApiError error;
  error.status = status;
  error.message = message;
  return {"application/json", error.ToJson()};
}

void OpenAiFrontend::Handle(http::HttpRequest request, std::shared_ptr<http::ResponseWriter> writer) {
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  auto method_not_allowed = [&] {
    ApiError e;
    e.status = 405;
    e.message = absl::StrCat("method ", request.method, " is not allowed on ", path);
    RespondError(*writer, e);
  };
  if (path == "/health") {
    if (!get) return method_not_allowed();
    return RespondJson(*writer, 200, R"({"status":"ok"})");
  }
  if (path == "/ready") {
    if (!get) return method_not_allowed();
    const GroupView group = group_();
    const bool ready = group.ready && !draining_;
    Json body = {{"ready", ready}, {"status", draining_ ? "shutting down" : group.description}};
    return RespondJson(*writer, ready ? 200 : 503, DumpJson(body));
  }
  if (path == "/metrics") {
    if (!get) return method_not_allowed();
    scheduler::ScrapeInput input;
    input.engine = engine_->Snapshot();
    input.workers = group_().workers;
    input.model_name = options_.served_model_name;
    metrics_->OnHttpResponse(200);
    return writer->Respond(200, "text/plain; version=0.0.4; charset=utf-8", metrics_->Render(input));
  }
  const bool tokenize = path == "/tokenize" || path == "/detokenize";  // vLLM's paths, outside /v1
  if (path.rfind("/v1/", 0) != 0 && !tokenize) return RespondError(*writer, NotFound(absl::StrCat("no route for ", path)));

  if (!options_.api_key.empty() && request.header("authorization") != absl::StrCat("Bearer ", options_.api_key)) {
    ApiError e;
    e.status = 401;
    e.type = "authentication_error";
    e.message = "a valid API key is required: send the header 'Authorization: Bearer <key>'";
    return RespondError(*writer, e);
  }
  if (tokenize) {
    if (!post) return method_not_allowed();
    const TokenizeContext context{tokenizer_, &chat_template_, options_.served_model_name, MaxModelLen()};
    auto result = path == "/tokenize" ? Tokenize(request.body, context) : Detokenize(request.body, context);
    if (auto* error = std::get_if<ApiError>(&result)) return RespondError(*writer, *error);
    return RespondJson(*writer, 200, std::get<std::string>(result));
  }
  if (path == "/v1/models") {
    if (!get) return method_not_allowed();
    Json model = {{"id", options_.served_model_name}, {"object", "model"},     {"created", created_},
                  {"owned_by", "tandem"},              {"root", options_.served_model_name}, {"max_model_len", MaxModelLen()}};
    return RespondJson(*writer, 200, DumpJson(Json{{"object", "list"}, {"data", Json::array({model})}}));
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return method_not_allowed();
    if (draining_) {
      ApiError e;
      e.status = 503;
      e.type = "server_error";
      e.message = "the server is shutting down; send the request to another replica";
      return RespondError(*writer, e);
    }
    return HandleGeneration(path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions, request,
                            std::move(writer));
  }
  RespondError(*writer, NotFound(absl::StrCat("no route for ", path)));
}

void OpenAiFrontend::HandleGeneration(Endpoint endpoint, const http::HttpRequest& request,
                                      std::shared_ptr<http::ResponseWriter> writer) {
  const auto arrival = std::chrono::steady_clock::now();
  auto parsed = ParseGenerationRequest(endpoint, request.body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return RespondError(*writer, *error);
  GenerationRequest& r = std::get<GenerationRequest>(parsed);
  if (r.tool_choice == ToolChoice::kAuto && !options_.auto_tool_choice) {
    return RespondError(*writer, BadRequest("'tool_choice' \"auto\" (the default with 'tools') needs the server started "
                                            "with --enable-auto-tool-choice --tool-call-parser hermes; or use "
                                            "\"required\", a named function or \"none\"",
                                            "tool_choice"));
  }
  if (!r.model.empty() && r.model != options_.served_model_name) {
    ApiError e = NotFound(absl::StrCat("The model `", r.model, "` does not exist; this server serves `",
                                       options_.served_model_name, "`."));
    e.param = "model";
    return RespondError(*writer, e);
  }

  // Prompts to token ids.
  std::vector<std::vector<TokenId>> prompts;
  if (endpoint == Endpoint::kChatCompletions) {
    if (!chat_template_.ok()) return RespondError(*writer, BadRequest(std::string(chat_template_.status().message()), "messages"));
    absl::StatusOr<std::string> text = chat_template_->Render(ChatInputOf(request.body));
    if (!text.ok()) return RespondError(*writer, BadRequest(std::string(text.status().message()), "messages"));
    // The template writes the special tokens (and BOS, if the model wants one) itself.
    prompts.push_back(tokenizer_->Encode(*text, /*add_special=*/false, /*parse_special=*/true));
    r.sampling.stop_token_ids.insert(r.sampling.stop_token_ids.end(), end_of_turn_ids_.begin(), end_of_turn_ids_.end());
  } else {
    for (const Prompt& p : r.prompts) {
      // Special-token text in a user's prompt stays text.
      prompts.push_back(p.is_tokens ? p.token_ids : tokenizer_->Encode(p.text, /*add_special=*/true, /*parse_special=*/false));
    }
  }
  if (auto e = CheckLogitBiasVocab(r.sampling.logit_bias, *tokenizer_)) return RespondError(*writer, BadRequest(*e, "logit_bias"));
  r.sampling.bad_words_token_ids = TokenizeBadWords(r.bad_words, *tokenizer_);
  const int32_t max_model_len = MaxModelLen();
  for (const std::vector<TokenId>& ids : prompts) {
    if (ids.empty()) return RespondError(*writer, BadRequest("the prompt is empty", "prompt"));
    for (TokenId id : ids) {
      if (id < 0 || id >= tokenizer_->vocab_size()) {
        return RespondError(*writer, BadRequest(absl::StrCat("token id ", id, " is outside the vocabulary (",
                                                                       tokenizer_->vocab_size(), " tokens)"),
                                                          "prompt"));
      }
    }
    const auto len = static_cast<int64_t>(ids.size());
    if (max_model_len > 0 && len >= max_model_len) {
      return RespondError(*writer, BadRequest(absl::StrCat("This model's maximum context length is ", max_model_len,
                                                                     " tokens. However, your prompt has ", len,
                                                                     " tokens; shorten it."),
                                                        endpoint == Endpoint::kChatCompletions ? "messages" : "prompt"));
    }
    if (r.max_tokens && max_model_len > 0 && len + *r.max_tokens > max_model_len) {
      return RespondError(*writer, BadRequest(
                                       absl::StrCat("This model's maximum context length is ", max_model_len,
                                                    " tokens. However, you requested ", len + *r.max_tokens, " tokens (",
                                                    len, " in the prompt, ", *r.max_tokens,
                                                    " in the completion). Reduce the prompt or max_tokens."),
                                       "max_tokens"));
    }
  }

  CallSetup setup;
  if (r.structured) {
    absl::StatusOr<std::shared_ptr<const structured::CompiledStructure>> grammar = grammars_.Compile(*r.structured);
    if (!grammar.ok()) return RespondError(*writer, BadRequest(std::string(grammar.status().message()), r.structured->param));
    setup.grammar = *std::move(grammar);
  }
  setup.id = absl::StrCat(endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", RandomHex(),
                          next_call_.fetch_add(1));
  setup.model = options_.served_model_name;
  setup.created = UnixSeconds();
  setup.arrival = arrival;
  setup.max_model_len = max_model_len;
  auto call = OpenAiCall::Create(std::move(r), std::move(setup), std::move(prompts), engine_, tokenizer_,
                                           metrics_, std::move(writer));
  call->Start();
}

}  // namespace tandem::openai

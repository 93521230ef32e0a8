#include "scheduler/server/openai/openai_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/server/openai/tool_call_parser.h"
#include "scheduler/server/openai/prompt_logprobs_json.h"

namespace tandem::openai {
namespace {

using Json = nlohmann::json;
using scheduler::FinishReason;
using scheduler::RequestOutput;

double SecondsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// An engine error as the client sees it.
ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      e.status = 400;
      break;
    case absl::StatusCode::kAlreadyExists:
      e.status = 409;
      break;
    case absl::StatusCode::kResourceExhausted:  // the queue is full (--max-queued-requests)
      e.status = 429;
      e.type = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "server_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "server_error";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  if (e.message.empty()) e.message = status.ToString();
  return e;
}

// Retry-After on the answers that say "later" (RFC 9110 §10.2.3): a full
// queue drains within about a second; a group that is not ready (a worker
// restarting) takes longer.
http::HeaderList RetryAfter(int status) {
  if (status == 429) return {{"Retry-After", "1"}};
  if (status == 503) return {{"Retry-After", "5"}};
  return {};
}

std::string Event(const Json& json) { return absl::StrCat("data: ", DumpJson(json), "\n\n"); }
std::string ErrorEvent(const ApiError& error) { return absl::StrCat("data: ", error.ToJson(), "\n\n"); }

Json TokenBytesJson(const std::string& bytes) {
  Json list = Json::array();
  for (unsigned char c : bytes) list.push_back(static_cast<int>(c));
  return list;
}

// A sink per engine request; it holds the call alive until its last output.
class ChoiceSink : public scheduler::RequestSink {
 public:
  ChoiceSink(std::shared_ptr<OpenAiCall> call, size_t index) : call_(std::move(call)), index_(index) {}
  void OnOutput(const RequestOutput& output) override { call_->Deliver(index_, output); }

 private:
  const std::shared_ptr<OpenAiCall> call_;
  const size_t index_;
};

}  // namespace

std::shared_ptr<OpenAiCall> OpenAiCall::Create(GenerationRequest request, CallSetup setup,
                                               std::vector<std::vector<TokenId>> prompts,
                                               scheduler::ServingEngine* engine, const Tokenizer* tokenizer,
                                               scheduler::ServingMetrics* metrics,
                                               std::shared_ptr<http::ResponseWriter> writer) {
  return std::make_shared<OpenAiCall>(std::move(request), std::move(setup), std::move(prompts), engine, tokenizer,
                                      metrics, std::move(writer));
}

OpenAiCall::OpenAiCall(GenerationRequest request, CallSetup setup, std::vector<std::vector<TokenId>> prompts,
                       scheduler::ServingEngine* engine, const Tokenizer* tokenizer, scheduler::ServingMetrics* metrics,
                       std::shared_ptr<http::ResponseWriter> writer)
    : request_(std::move(request)),
      setup_(std::move(setup)),
      prompts_(std::move(prompts)),
      engine_(engine),
      tokenizer_(tokenizer),
      metrics_(metrics),
      writer_(std::move(writer)) {}

void OpenAiCall::Start() {
  const int32_t n = request_.best_of;
  choices_.resize(prompts_.size() * n);
  for (size_t p = 0; p < prompts_.size(); ++p) {
    for (int32_t j = 0; j < n; ++j) {
      Choice& c = choices_[p * n + j];
      c.prompt = p;
      c.engine_id = absl::StrCat(setup_.id, "-", p * n + j);
      c.text.emplace(tokenizer_, request_.stop, request_.include_stop_str_in_output, request_.skip_special_tokens,
                     request_.sampling.min_tokens);
      if (!chat()) c.logprobs = Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()},
                                     {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
      else c.logprobs = Json{{"content", Json::array()}};
    }
  }
  // Set before any output can finish the response.
  writer_->OnClientGone([self = shared_from_this()] { self->OnClientGone(); });
  for (size_t i = 0; i < choices_.size(); ++i) {
    const std::vector<TokenId>& prompt = prompts_[choices_[i].prompt];
    scheduler::RequestSpec spec;
    spec.prompt_token_ids = prompt;
    spec.sampling = request_.sampling;
    spec.priority = request_.priority;
    const int32_t room = setup_.max_model_len > 0 ? setup_.max_model_len - static_cast<int32_t>(prompt.size()) : 1 << 20;
    // OpenAI's defaults: 16 tokens for a completion, the rest of the context for a chat turn.
    spec.sampling.max_tokens = request_.max_tokens.value_or(chat() ? room : std::min(16, room));
    spec.sampling.min_tokens = std::min(spec.sampling.min_tokens, spec.sampling.max_tokens);
    if (tokenizer_->eos_token_id() >= 0) spec.sampling.eos_token_id = tokenizer_->eos_token_id();
    if (setup_.grammar != nullptr) {
      // The structure may end on any token that ends the request.
      std::vector<TokenId> stops = spec.sampling.stop_token_ids;
      if (spec.sampling.eos_token_id) stops.push_back(*spec.sampling.eos_token_id);
      spec.grammar = structured::GrammarFactory::NewGrammar(setup_.grammar, std::move(stops));
    }
    // Choices with one seed would all be the same; each gets its own.
    if (spec.sampling.seed) *spec.sampling.seed += i % n;
    // best_of ranks candidates by their sampled tokens' logprobs, asked for even when the client did not.
    if (n > request_.n) spec.sampling.logprobs = std::max(spec.sampling.logprobs, 0);
    // Outputs are posted to this strand, so none is handled before this returns.
    choices_[i].request_id =
        engine_->Submit(choices_[i].engine_id, std::move(spec), std::make_shared<ChoiceSink>(shared_from_this(), i));
  }
}

void OpenAiCall::Deliver(size_t index, const RequestOutput& output) {
  writer_->Post([self = shared_from_this(), index, output] { self->OnOutput(index, output); });
}

void OpenAiCall::OnClientGone() {
  client_gone_ = true;
  for (const Choice& c : choices_) {
    if (!c.finished) engine_->Abort(c.request_id);
  }
}

Json OpenAiCall::TakeLogprobs(Choice& choice) {
  const size_t count = std::min(static_cast<size_t>(choice.text->num_released() - choice.logprobs_out),
                                choice.pending_logprobs.size());
  choice.logprobs_out = choice.text->num_released();
  if (request_.logprobs < 0 || count == 0) return nullptr;
  std::vector<std::pair<TokenId, scheduler::TokenLogprob>> taken(choice.pending_logprobs.begin(),
                                                                  choice.pending_logprobs.begin() + count);
  choice.pending_logprobs.erase(choice.pending_logprobs.begin(), choice.pending_logprobs.begin() + count);
  if (chat()) {
    Json content = Json::array();
    for (const auto& [id, lp] : taken) {
      const std::string token = tokenizer_->TokenBytes(id);
      Json top = Json::array();
      for (const auto& [top_id, value] : lp.top) {
        const std::string t = tokenizer_->TokenBytes(top_id);
        top.push_back({{"token", t}, {"logprob", value}, {"bytes", TokenBytesJson(t)}});
      }
      content.push_back({{"token", token}, {"logprob", lp.logprob}, {"bytes", TokenBytesJson(token)}, {"top_logprobs", top}});
    }
    return Json{{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const auto& [id, lp] : taken) {
    const std::string token = tokenizer_->TokenBytes(id);
    tokens.push_back(token);
    token_logprobs.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [top_id, value] : lp.top) top[tokenizer_->TokenBytes(top_id)] = value;
    tops.push_back(std::move(top));
    offsets.push_back(choice.text_offset);
    choice.text_offset += static_cast<int32_t>(token.size());
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

void OpenAiCall::OnOutput(size_t index, const RequestOutput& output) {
  Choice& choice = choices_[index];
  if (choice.finished) return;  // e.g. the abort that follows a stop string
  if (!output.prompt_logprobs.empty()) choice.prompt_logprobs = output.prompt_logprobs;
  const auto now = std::chrono::steady_clock::now();
  if (!output.new_token_ids.empty()) {
    if (choice.last_token == std::chrono::steady_clock::time_point()) {
      metrics_->OnTimeToFirstToken(SecondsBetween(setup_.arrival, now));
    } else {
      metrics_->OnInterTokenLatency(SecondsBetween(choice.last_token, now));
    }
    choice.last_token = now;
  }

  if (output.finish_reason == FinishReason::kError) {
    const ApiError error = ToApiError(output.error);
    if (request_.stream && stream_started_) {
      writer_->Write(ErrorEvent(error));
    } else if (!error_) {
      error_ = error;
    }
    Finish(choice, "error");
    return;
  }

  const int32_t counted_before = choice.text->num_tokens();
  TextDelta delta = choice.text->Add(output.new_token_ids);
  const size_t counted = std::min(output.logprobs.size(), static_cast<size_t>(choice.text->num_tokens() - counted_before));
  for (size_t i = 0; i < counted; ++i) {
    choice.cumulative_logprob += output.logprobs[i].logprob;
    if (request_.logprobs >= 0) choice.pending_logprobs.emplace_back(output.new_token_ids[i], output.logprobs[i]);
  }
  std::string text = std::move(delta.text);
  std::string reason;
  if (delta.stopped) {
    // The stop string ends the request now: free its blocks at once.
    engine_->Abort(choice.request_id);
    reason = "stop";
    choice.stop_reason = delta.stop;
  } else if (output.finished()) {
    text += choice.text->Finish();
    reason = output.finish_reason == FinishReason::kLength ? "length"
             : output.finish_reason == FinishReason::kAbort ? "abort"
                                                             : "stop";
  }
  if (request_.stream) {
    // A tool call's text is held until the call is complete (SendChunk), and its logprobs with it.
    const bool held = tool_call() && reason.empty();
    const Json logprobs = held ? Json(nullptr) : TakeLogprobs(choice);
    if (!held && (!text.empty() || !reason.empty() || !logprobs.is_null())) {
      choice.finish_reason = reason;
      SendChunk(choice, index, text, logprobs, !reason.empty());
    }
  } else if (const Json logprobs = TakeLogprobs(choice); !logprobs.is_null()) {
    // A whole response: its text is choice.text->emitted().
    for (auto& [key, values] : logprobs.items()) {
      for (const Json& v : values) choice.logprobs[key].push_back(v);
    }
  }
  if (!reason.empty()) Finish(choice, reason);
}

void OpenAiCall::SendChunk(Choice& choice, size_t index, const std::string& text, const Json& logprobs,
                           bool final) {
  if (!stream_started_) {
    stream_started_ = true;
    writer_->StartStream(200, "text/event-stream");
    if (error_) writer_->Write(ErrorEvent(*error_));
  }
  // Most chunks: text alone (a chat stream's first carries the role).
  if (!final && logprobs.is_null() && !(chat() && (tool_call() || !choice.role_sent))) {
    if (!text_chunks_) text_chunks_.emplace(chat(), setup_.id, setup_.created, setup_.model);
    writer_->Write(text_chunks_->Event(index, text));
    return;
  }
  Json c = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  if (chat()) {
    Json delta = Json::object();
    if (!choice.role_sent) {
      delta["role"] = "assistant";
      choice.role_sent = true;
    }
    if (tool_call()) {
      // A call is sent whole in the last chunk, once its arguments are complete.
      std::string content = choice.text->emitted();
      Json calls = final ? ToolCalls(index, choice.text->emitted(), &content) : Json(nullptr);
      if (!calls.is_null()) {
        for (size_t k = 0; k < calls.size(); ++k) calls[k]["index"] = k;
        delta["tool_calls"] = std::move(calls);
        if (request_.tool_choice == ToolChoice::kAuto && !content.empty()) delta["content"] = content;
      } else if (final) {
        delta["content"] = choice.text->emitted();
      }
    } else if (!text.empty() || !final) {
      delta["content"] = text;
    }
    c["delta"] = std::move(delta);
  } else {
    c["text"] = text;
  }
  if (final) {
    c["finish_reason"] = FinishReasonJson(choice, index);
    c["stop_reason"] = choice.stop_reason ? Json(*choice.stop_reason) : Json(nullptr);
  }
  writer_->Write(Event({{"id", setup_.id},
                        {"object", chat() ? "chat.completion.chunk" : "text_completion"},
                        {"created", setup_.created},
                        {"model", setup_.model},
                        {"choices", Json::array({std::move(c)})}}));
}

void OpenAiCall::Finish(Choice& choice, std::string reason) {
  choice.finished = true;
  choice.finish_reason = std::move(reason);
  ++num_finished_;
  scheduler::ServingMetrics::RequestRecord record;
  record.finish_reason = choice.finish_reason;
  record.prompt_tokens = static_cast<int64_t>(prompts_[choice.prompt].size());
  record.generation_tokens = choice.text->num_tokens();
  record.e2e_seconds = SecondsBetween(setup_.arrival, std::chrono::steady_clock::now());
  metrics_->OnRequestFinished(record);
  if (num_finished_ == choices_.size()) Complete();
}

Json OpenAiCall::Usage() const {
  int64_t prompt = 0, completion = 0;
  for (const std::vector<TokenId>& p : prompts_) prompt += static_cast<int64_t>(p.size());
  // Tokens up to the one that completed a stop string, as the model would have stopped there.
  for (const Choice& c : choices_) completion += c.text->num_tokens();
  return Json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

Json OpenAiCall::ToolCalls(size_t index, const std::string& text, std::string* content) const {
  auto call = [&](size_t k, const std::string& name, std::string arguments) {
    return Json{{"id", absl::StrCat("call_", setup_.id.substr(setup_.id.find('-') + 1), "_", index, "_", k)},
                {"type", "function"},
                {"function", {{"name", name}, {"arguments", std::move(arguments)}}}};
  };
  if (request_.tool_choice == ToolChoice::kAuto) {
    ParsedOutput parsed = ParseHermesToolCalls(text);
    if (content != nullptr) *content = parsed.calls.empty() ? text : std::move(parsed.content);
    if (parsed.calls.empty()) return nullptr;
    Json calls = Json::array();
    for (size_t k = 0; k < parsed.calls.size(); ++k) calls.push_back(call(k, parsed.calls[k].name, parsed.calls[k].arguments));
    return calls;
  }
  if (request_.tool_choice == ToolChoice::kNamed) {
    if (!Json::accept(text)) return nullptr;
    return Json::array({call(0, request_.tool_choice_name, text)});
  }
  // "required": [{"name": ..., "parameters": {...}}, ...], as its schema made the model write it.
  const nlohmann::ordered_json list = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array() || list.empty()) return nullptr;
  Json calls = Json::array();
  for (size_t k = 0; k < list.size(); ++k) {
    const auto& item = list[k];
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("parameters")) {
      return nullptr;
    }
    calls.push_back(call(k, item["name"].get<std::string>(), item["parameters"].dump()));
  }
  return calls;
}

// "tool_calls" when the output is a list of calls ("required"); a named
// function's call ends with "stop", as OpenAI's forced function calls do.
std::string OpenAiCall::FinishReasonJson(const Choice& choice, size_t index) const {
  const bool listed = request_.tool_choice == ToolChoice::kRequired || request_.tool_choice == ToolChoice::kAuto;
  if (listed && choice.finish_reason == "stop" && !ToolCalls(index, choice.text->emitted()).is_null()) {
    return "tool_calls";
  }
  return choice.finish_reason;
}

std::vector<size_t> OpenAiCall::Returned() const {
  const size_t best_of = request_.best_of, n = request_.n;
  std::vector<size_t> returned;
  for (size_t first = 0; first < choices_.size(); first += best_of) {
    std::vector<size_t> candidates(best_of);
    for (size_t j = 0; j < best_of; ++j) candidates[j] = first + j;
    if (best_of > n) {
      std::stable_sort(candidates.begin(), candidates.end(), [this](size_t a, size_t b) {
        return choices_[a].cumulative_logprob > choices_[b].cumulative_logprob;
      });
    }
    returned.insert(returned.end(), candidates.begin(), candidates.begin() + n);
  }
  return returned;
}

void OpenAiCall::Complete() {
  if (client_gone_) return;
  if (request_.stream && stream_started_) {
    if (request_.include_usage) {
      writer_->Write(Event({{"id", setup_.id},
                            {"object", chat() ? "chat.completion.chunk" : "text_completion"},
                            {"created", setup_.created},
                            {"model", setup_.model},
                            {"choices", Json::array()},
                            {"usage", Usage()}}));
    }
    writer_->Write("data: [DONE]\n\n");
    writer_->End();
    metrics_->OnHttpResponse(200);
    return;
  }
  if (error_) {
    metrics_->OnHttpResponse(error_->status);
    writer_->Respond(error_->status, "application/json", error_->ToJson(), RetryAfter(error_->status));
    return;
  }
  Json choices = Json::array();
  const std::vector<size_t> returned = Returned();
  for (size_t k = 0; k < returned.size(); ++k) {
    const size_t i = returned[k];
    const Choice& c = choices_[i];
    Json logprobs = request_.logprobs >= 0 ? c.logprobs : Json(nullptr);
    Json entry = {{"index", k},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", FinishReasonJson(c, i)},
                  {"stop_reason", c.stop_reason ? Json(*c.stop_reason) : Json(nullptr)}};
    std::string content;
    Json calls = tool_call() ? ToolCalls(i, c.text->emitted(), &content) : Json(nullptr);
    if (chat() && !calls.is_null()) {
      // "auto" keeps the text around the calls as content, as vLLM's parsers do.
      entry["message"] = {{"role", "assistant"},
                          {"content", content.empty() ? Json(nullptr) : Json(content)},
                          {"tool_calls", std::move(calls)}};
    } else if (chat()) {
      entry["message"] = {{"role", "assistant"}, {"content", c.text->emitted()}};
    } else {
      entry["text"] = c.text->emitted();
    }
    if (request_.prompt_logprobs >= 0) entry["prompt_logprobs"] = PromptLogprobsJson(c.prompt_logprobs, *tokenizer_);
    if (request_.echo) {
      const Prompt& p = request_.prompts[c.prompt];
      entry["text"] = (p.is_tokens ? tokenizer_->Decode(prompts_[c.prompt]) : p.text) + entry["text"].get<std::string>();
      if (request_.logprobs >= 0) {
        entry["logprobs"] = EchoLogprobs(prompts_[c.prompt], c.prompt_logprobs, request_.logprobs, *tokenizer_, entry["logprobs"]);
      }
    }
    choices.push_back(std::move(entry));
  }
  Json body = {{"id", setup_.id},
               {"object", chat() ? "chat.completion" : "text_completion"},
               {"created", setup_.created},
               {"model", setup_.model},
               {"choices", std::move(choices)},
               {"usage", Usage()}};
  metrics_->OnHttpResponse(200);
  writer_->Respond(200, "application/json", DumpJson(body));
}

}  // namespace tandem::openai

#include "scheduler/server/grpc/grpc_generate_service.h"

#include <atomic>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_options.h"
#include "common/tokenizer/incremental_decoder.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {
namespace {

class GenerateReactor;

// The engine's handle on one stream. The reactor may go away first (client
// cancelled); the sink then drops what it is given.
class StreamSink : public RequestSink {
 public:
  StreamSink(GenerateReactor* reactor, const Tokenizer* tokenizer) : reactor_(reactor), decoder_(tokenizer) {}
  void OnOutput(const RequestOutput& output) override ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_);
  IncrementalDecoder decoder_;  // engine thread only
};

class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(ServingEngine* engine, std::string external_id)
      : engine_(engine), external_id_(std::move(external_id)) {}

  void Start(std::shared_ptr<StreamSink> sink, RequestSpec spec, int32_t num_prompt_tokens) {
    sink_ = sink;
    num_prompt_tokens_ = num_prompt_tokens;
    request_id_ = engine_->Submit(external_id_, std::move(spec), std::move(sink));
  }

  // From the sink (engine thread): queue one response; `final` ends the stream.
  void Push(v1::GenerateResponse response, bool final, grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (first_) {
      response.set_num_prompt_tokens(num_prompt_tokens_);
      first_ = false;
    }
    queue_.push_back(std::move(response));
    if (final) {
      final_ = true;
      status_ = status;
    }
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    queue_.pop_front();
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away"));
      return;
    }
    WriteNextLocked();
  }

  // By the engine's id, not the client's name: a cancel that arrives after
  // the request ended must not abort a new request that reuses the name.
  void OnCancel() override { engine_->Abort(request_id_); }

  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
    } else if (final_) {
      FinishLocked(status_);
    }
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  ServingEngine* const engine_;
  const std::string external_id_;
  std::atomic<RequestId> request_id_{0};  // set by Start, before gRPC can call OnCancel
  std::shared_ptr<StreamSink> sink_;
  int32_t num_prompt_tokens_ = 0;
  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);  // front is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool final_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

void StreamSink::OnOutput(const RequestOutput& output) {
  v1::GenerateResponse response;
  response.mutable_token_ids()->Add(output.new_token_ids.begin(), output.new_token_ids.end());
  if (!output.logprobs.empty()) {
    v1::TokenLogprobs* logprobs = response.mutable_logprobs();
    for (const TokenLogprob& token : output.logprobs) {
      logprobs->add_sampled_logprobs(token.logprob);
      for (const auto& [id, logprob] : token.top) {
        logprobs->add_top_token_ids(id);
        logprobs->add_top_logprobs(logprob);
      }
    }
  }
  std::string text = decoder_.Add(output.new_token_ids);
  if (output.finished()) text += decoder_.Finish();
  response.set_text(std::move(text));
  grpc::Status status;
  if (output.finished()) {
    response.set_finish_reason(FinishReasonName(output.finish_reason));
    if (output.finish_reason == FinishReason::kError) status = rpc::ToGrpc(output.error);
  }
  absl::MutexLock lock(&mu_);
  if (reactor_ != nullptr) reactor_->Push(std::move(response), output.finished(), status);
}

class ImmediateReactor : public grpc::ServerUnaryReactor {
 public:
  explicit ImmediateReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* GrpcGenerateService::Generate(grpc::CallbackServerContext* context,
                                                                              const v1::GenerateRequest* request) {
  const std::string external_id =
      request->request_id().empty() ? absl::StrCat("grpc-anonymous-", next_anonymous_++) : request->request_id();
  auto* reactor = new GenerateReactor(engine_, external_id);
  RequestSpec spec;
  if (request->prompt_token_ids_size() > 0) {
    spec.prompt_token_ids.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  } else {
    spec.prompt_token_ids = tokenizer_->Encode(request->prompt());
  }
  spec.sampling = DecodeSamplingParams(request->sampling());
  if (spec.sampling.max_tokens == 0) spec.sampling.max_tokens = 16;
  if (!spec.sampling.eos_token_id && tokenizer_->eos_token_id() >= 0) {
    spec.sampling.eos_token_id = tokenizer_->eos_token_id();
  }
  const auto num_prompt_tokens = static_cast<int32_t>(spec.prompt_token_ids.size());
  reactor->Start(std::make_shared<StreamSink>(reactor, tokenizer_), std::move(spec), num_prompt_tokens);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcGenerateService::Abort(grpc::CallbackServerContext* context,
                                                     const v1::AbortRequest* request, v1::AbortResponse* response) {
  response->set_found(engine_->AbortByName(request->request_id()));
  return new ImmediateReactor(grpc::Status::OK);
}

grpc::ServerUnaryReactor* GrpcGenerateService::Health(grpc::CallbackServerContext* context,
                                                      const v1::HealthRequest* request,
                                                      v1::HealthResponse* response) {
  const GroupStatus group = group_->Status();
  const ServingSnapshot engine = engine_->Snapshot();
  response->set_ready(group.ready);
  response->set_status(group.description);
  response->set_world_size(static_cast<int32_t>(group.workers.size()));
  for (const WorkerStatus& w : group.workers) {
    v1::WorkerHealth* h = response->add_workers();
    h->set_rank(w.rank);
    h->set_connected(w.connected);
    h->set_busy_seconds(w.busy_seconds);
    h->set_idle_seconds(w.idle_seconds);
    h->set_steps(w.steps);
  }
  response->set_num_running(engine.num_running);
  response->set_num_waiting(engine.num_waiting);
  response->set_wasted_rows(engine.stats.num_wasted_rows);
  response->set_preemptions(engine.stats.num_preemptions);
  response->set_steps_in_flight(engine.num_steps_in_flight);
  return new ImmediateReactor(grpc::Status::OK);
}

}  // namespace tandem::scheduler

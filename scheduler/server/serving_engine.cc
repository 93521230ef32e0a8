#include "scheduler/server/serving_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::scheduler {

ServingEngine::ServingEngine(EngineConfig config, ExecutorGroup* group, std::vector<StepObserver*> observers,
                             int32_t model_context_length)
    : config_template_(config),
      group_(group),
      observers_(std::move(observers)),
      model_context_length_(model_context_length) {}

ServingEngine::~ServingEngine() { Stop(); }

void ServingEngine::Start() { thread_ = std::thread([this] { Run(); }); }

void ServingEngine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

// Writers only change state under mu_: the engine thread's Await in Run
// re-evaluates its condition whenever mu_ is released, so no notify is needed.
void ServingEngine::Submit(std::string external_id, RequestSpec spec, std::shared_ptr<RequestSink> sink) {
  absl::MutexLock lock(&mu_);
  spec.id = next_id_++;
  if (!external_id.empty()) {
    if (!live_external_.emplace(external_id, spec.id).second) {
      RequestOutput out;
      out.id = spec.id;
      out.finish_reason = FinishReason::kError;
      out.error = absl::AlreadyExistsError(absl::StrCat("request id '", external_id, "' is already in use"));
      sink->OnOutput(out);
      return;
    }
  }
  submissions_.push_back({std::move(external_id), std::move(spec), std::move(sink), std::chrono::steady_clock::now()});
}

bool ServingEngine::Abort(const std::string& external_id) {
  absl::MutexLock lock(&mu_);
  if (!live_external_.contains(external_id)) return false;
  aborts_.push_back(external_id);
  return true;
}

void ServingEngine::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

ServingSnapshot ServingEngine::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void ServingEngine::PublishSnapshot() {
  ServingSnapshot s;
  s.executor_ready = group_->ready();
  s.num_waiting = static_cast<int64_t>(waiting_for_group_.size());
  if (scheduler_) {
    s.num_running = static_cast<int64_t>(scheduler_->num_running());
    s.num_waiting += static_cast<int64_t>(scheduler_->num_waiting());
    s.stats = scheduler_->stats();
    const KvCacheManager& kv = scheduler_->kv_cache();
    s.prefix_cache_queries = kv.prefix_cache_stats().queries;
    s.prefix_cache_hits = kv.prefix_cache_stats().hits;
    s.kv_blocks_total = kv.pool().num_blocks() - 1;  // all but the null block
    s.kv_cache_usage = kv.pool().Usage();
    s.max_model_len = scheduler_->config().max_model_len;
  }
  if (engine_) {
    s.num_steps_in_flight = static_cast<int64_t>(engine_->in_flight().size());
    s.scheduler_seconds = engine_->scheduler_seconds();
  }
  absl::MutexLock lock(&mu_);
  snapshot_ = s;
}

absl::Status ServingEngine::EnsureScheduler() {
  const int32_t blocks = group_->pool_blocks();
  if (scheduler_ && scheduler_->config().num_kv_blocks == blocks) return absl::OkStatus();
  if (scheduler_) {
    // Re-formed with a different pool: nothing runs now (a failure preceded
    // this), but requests queued in the old scheduler cannot move over.
    std::vector<RequestOutput> outputs;
    std::vector<RequestId> queued;
    for (const Request* r : scheduler_->AllRequests()) queued.push_back(r->id());
    scheduler_->AbortRequests(queued, &outputs);
    for (RequestOutput& out : outputs) {
      out.finish_reason = FinishReason::kError;
      out.error = absl::UnavailableError("the worker group re-formed with a different KV cache size");
    }
    Dispatch(outputs);
  }
  EngineConfig config = config_template_;
  config.num_kv_blocks = blocks;
  if (config.max_model_len == 0) {
    const int32_t cache_tokens = (blocks - 1) * config.block_size;
    config.max_model_len = model_context_length_ > 0 ? std::min(model_context_length_, cache_tokens) : cache_tokens;
  }
  TANDEM_ASSIGN_OR_RETURN(scheduler_, Scheduler::Create(config));
  engine_ = std::make_unique<EngineCore>(scheduler_.get(), group_);
  engine_->AddObserver(&queue_timer_);
  for (StepObserver* observer : observers_) engine_->AddObserver(observer);
  return absl::OkStatus();
}

void ServingEngine::QueueTimer::OnScheduled(const EngineCore& engine, const SchedulerOutput& step) {
  if (step.new_requests.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  for (const NewRequestData& request : step.new_requests) {
    auto it = engine_->arrival_.find(request.id);
    if (it == engine_->arrival_.end()) continue;  // resumed after a preemption: counted once
    if (engine_->listener_ != nullptr) {
      engine_->listener_->OnFirstScheduled(std::chrono::duration<double>(now - it->second).count());
    }
    engine_->arrival_.erase(it);
  }
}

void ServingEngine::FailWith(RequestId id, const std::shared_ptr<RequestSink>& sink, const absl::Status& status) {
  arrival_.erase(id);
  RequestOutput out;
  out.id = id;
  out.finish_reason = FinishReason::kError;
  out.error = status;
  sink->OnOutput(out);
  absl::MutexLock lock(&mu_);
  if (auto it = external_of_.find(id); it != external_of_.end()) live_external_.erase(it->second);
  external_of_.erase(id);
}

void ServingEngine::Admit(Submission submission) {
  const RequestId id = submission.spec.id;
  if (!submission.external_id.empty()) external_of_[id] = submission.external_id;
  if (absl::Status s = scheduler_->AddRequest(std::move(submission.spec)); !s.ok()) {
    FailWith(id, submission.sink, s);
    return;
  }
  arrival_[id] = submission.arrival;
  sinks_[id] = std::move(submission.sink);
}

void ServingEngine::Dispatch(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& out : outputs) {
    auto it = sinks_.find(out.id);
    if (it == sinks_.end()) continue;
    it->second->OnOutput(out);
    if (!out.finished()) continue;
    sinks_.erase(it);
    arrival_.erase(out.id);
    absl::MutexLock lock(&mu_);
    if (auto e = external_of_.find(out.id); e != external_of_.end()) {
      live_external_.erase(e->second);
      external_of_.erase(e);
    }
  }
}

void ServingEngine::HandleFailure(const absl::Status& status) {
  if (engine_ != nullptr) {  // null if the group broke before its first use
    std::vector<RequestOutput> outputs;
    scheduler_->FailStartedRequests(status, &outputs);
    engine_->DropInFlight();
    Dispatch(outputs);
  }
  group_->Reset();
}

void ServingEngine::Run() {
  for (;;) {
    std::vector<Submission> submissions;
    std::vector<std::string> aborts;
    {
      absl::MutexLock lock(&mu_);
      const bool busy = engine_ != nullptr && engine_->HasWork() && group_->ready();
      if (!busy) {
        // Idle, or waiting for the group: sleep until there is news. The
        // timeout covers a readiness change that raced with this check.
        auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || woken_ || !submissions_.empty() || !aborts_.empty();
        };
        mu_.AwaitWithTimeout(absl::Condition(&news), absl::Milliseconds(100));
      }
      if (stop_) return;
      woken_ = false;
      submissions.swap(submissions_);
      aborts.swap(aborts_);
    }
    for (Submission& s : submissions) waiting_for_group_.push_back(std::move(s));
    // A group that broke between steps (a worker lost while the engine was
    // idle or dispatching) is failed here; otherwise its started requests
    // would wait for a group that cannot re-form until it is reset.
    if (absl::Status broken = group_->failure(); !broken.ok()) HandleFailure(broken);
    if (group_->ready()) {
      if (absl::Status s = EnsureScheduler(); !s.ok()) {
        for (Submission& sub : waiting_for_group_) FailWith(sub.spec.id, sub.sink, s);
        waiting_for_group_.clear();
      } else {
        for (Submission& sub : waiting_for_group_) Admit(std::move(sub));
        waiting_for_group_.clear();
      }
    }
    for (const std::string& external : aborts) {
      RequestId id = 0;
      {
        absl::MutexLock lock(&mu_);
        auto it = live_external_.find(external);
        if (it == live_external_.end()) continue;
        id = it->second;
      }
      // Not yet admitted: answer it here; otherwise the engine applies it
      // right before its next update.
      auto queued = std::find_if(waiting_for_group_.begin(), waiting_for_group_.end(),
                                 [id](const Submission& s) { return s.spec.id == id; });
      if (queued != waiting_for_group_.end()) {
        RequestOutput out;
        out.id = id;
        out.finish_reason = FinishReason::kAbort;
        queued->sink->OnOutput(out);
        waiting_for_group_.erase(queued);
        absl::MutexLock lock(&mu_);
        live_external_.erase(external);
        external_of_.erase(id);
      } else if (engine_ != nullptr) {
        engine_->Abort(id);
      }
    }
    if (engine_ != nullptr && group_->ready() && engine_->HasWork()) {
      const double scheduler_before = engine_->scheduler_seconds();
      absl::StatusOr<EngineStepResult> result = engine_->Step();
      if (result.ok() && listener_ != nullptr && (result->executed || result->updated)) {
        listener_->OnSchedulerTime(engine_->scheduler_seconds() - scheduler_before);
      }
      if (result.ok()) {
        Dispatch(result->outputs);
      } else {
        HandleFailure(result.status());
      }
    }
    PublishSnapshot();
  }
}

}  // namespace tandem::scheduler

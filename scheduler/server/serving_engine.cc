#include "scheduler/server/serving_engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::scheduler {

ServingEngine::ServingEngine(EngineConfig config, ExecutorGroup* group, std::vector<StepObserver*> observers,
                             int32_t model_context_length, ServingOptions options)
    : config_template_(config),
      group_(group),
      observers_(std::move(observers)),
      model_context_length_(model_context_length),
      options_(std::move(options)) {}

ServingEngine::~ServingEngine() { Stop(); }

void ServingEngine::Start() { thread_ = std::thread([this] { Run(); }); }

void ServingEngine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::chrono::steady_clock::time_point ServingEngine::Now() const {
  return options_.clock ? options_.clock() : std::chrono::steady_clock::now();
}

// Writers only change state under mu_: the engine thread's Await in Run
// re-evaluates its condition whenever mu_ is released, so no notify is needed.
RequestId ServingEngine::Submit(std::string external_id, RequestSpec spec, std::shared_ptr<RequestSink> sink) {
  absl::MutexLock lock(&mu_);
  const RequestId id = next_id_++;
  spec.id = id;
  absl::Status refused;
  if (!external_id.empty() && live_external_.contains(external_id)) {
    refused = absl::AlreadyExistsError(absl::StrCat("request id '", external_id, "' is already in use"));
  } else if (options_.max_queued_requests > 0 && num_queued_ >= options_.max_queued_requests) {
    refused = absl::ResourceExhaustedError(absl::StrCat("the server already has ", num_queued_,
                                                        " requests queued (--max-queued-requests); retry later"));
  }
  if (!refused.ok()) {
    RequestOutput out;
    out.id = id;
    out.finish_reason = FinishReason::kError;
    out.error = std::move(refused);
    sink->OnOutput(out);
    return id;
  }
  if (!external_id.empty()) live_external_.emplace(external_id, id);
  live_.emplace(id, std::move(external_id));
  ++num_queued_;
  submissions_.push_back({std::move(spec), std::move(sink), Now()});
  return id;
}

bool ServingEngine::Abort(RequestId id) {
  absl::MutexLock lock(&mu_);
  if (!live_.contains(id)) return false;
  aborts_.push_back(id);
  return true;
}

bool ServingEngine::AbortByName(const std::string& external_id) {
  absl::MutexLock lock(&mu_);
  auto it = live_external_.find(external_id);
  if (it == live_external_.end()) return false;
  aborts_.push_back(it->second);  // resolved now: the name may be reused before the engine sees this
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
  const auto now = engine_->Now();
  for (const NewRequestData& request : step.new_requests) {
    auto it = engine_->arrival_.find(request.id);
    if (it == engine_->arrival_.end()) continue;  // resumed after a preemption: counted once
    if (engine_->listener_ != nullptr) {
      engine_->listener_->OnFirstScheduled(std::chrono::duration<double>(now - it->second).count());
    }
    engine_->Dequeued(request.id);
  }
}

void ServingEngine::Dequeued(RequestId id) {
  if (arrival_.erase(id) == 0) return;
  absl::MutexLock lock(&mu_);
  --num_queued_;
}

void ServingEngine::Forget(RequestId id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  if (!it->second.empty()) live_external_.erase(it->second);
  live_.erase(it);
}

void ServingEngine::FailWith(RequestId id, const std::shared_ptr<RequestSink>& sink, const absl::Status& status) {
  Dequeued(id);
  // Forgotten before the client hears of the end, so that it may reuse the name at once.
  Forget(id);
  RequestOutput out;
  out.id = id;
  out.finish_reason = FinishReason::kError;
  out.error = status;
  sink->OnOutput(out);
}

void ServingEngine::Admit(Submission submission) {
  const RequestId id = submission.spec.id;
  if (absl::Status s = scheduler_->AddRequest(std::move(submission.spec)); !s.ok()) {
    FailWith(id, submission.sink, s);
    return;
  }
  if (!sinks_.insert_or_assign(id, std::move(submission.sink)).second) sink_order_.clear();  // a sink replaced
}

RequestSink* ServingEngine::FindSink(size_t position, RequestId id) {
  auto it = sinks_.find(id);
  if (it == sinks_.end()) return nullptr;
  if (position >= sink_order_.size()) sink_order_.resize(position + 1);
  sink_order_[position] = {id, it->second.get()};
  return it->second.get();
}

void ServingEngine::Dispatch(const std::vector<RequestOutput>& outputs) {
  // Hoisted: the sinks' calls could change `outputs` for all the compiler
  // knows, and its size is a division.
  const size_t n = outputs.size();
  for (size_t i = 0; i < n; ++i) {
    const RequestOutput& out = outputs[i];
    RequestSink* const sink = i < sink_order_.size() && sink_order_[i].first == out.id ? sink_order_[i].second
                                                                                        : FindSink(i, out.id);
    if (sink == nullptr) continue;
    if (!out.finished()) {
      sink->OnOutput(out);
      continue;
    }
    auto it = sinks_.find(out.id);
    const std::shared_ptr<RequestSink> owned = std::move(it->second);
    sinks_.erase(it);
    sink_order_.clear();
    Dequeued(out.id);
    Forget(out.id);
    owned->OnOutput(out);
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

void ServingEngine::ApplyAborts(const std::vector<RequestId>& ids) {
  std::vector<RequestOutput> outputs;
  for (RequestId id : ids) {
    auto queued = std::find_if(waiting_for_group_.begin(), waiting_for_group_.end(),
                               [id](const Submission& s) { return s.spec.id == id; });
    if (queued != waiting_for_group_.end()) {  // never admitted: answered here
      const std::shared_ptr<RequestSink> sink = std::move(queued->sink);
      waiting_for_group_.erase(queued);
      Dequeued(id);
      Forget(id);
      RequestOutput out;
      out.id = id;
      out.finish_reason = FinishReason::kAbort;
      sink->OnOutput(out);
    } else if (engine_ != nullptr && sinks_.contains(id)) {
      // With no step in flight nothing can still write its blocks: apply it
      // now, so that a request queued while the group is down leaves at once.
      // Otherwise the engine applies it right before its next update.
      if (engine_->in_flight().empty()) {
        scheduler_->AbortRequests({id}, &outputs);
      } else {
        engine_->Abort(id);
      }
    }
  }
  Dispatch(outputs);
}

void ServingEngine::ExpireQueued() {
  if (options_.queue_timeout_seconds <= 0 || arrival_.empty() || group_->ready()) return;
  const auto cutoff = Now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(options_.queue_timeout_seconds));
  const absl::Status status = absl::UnavailableError(
      absl::StrCat("no worker group was ready within the queue timeout (--queue-timeout ",
                   options_.queue_timeout_seconds, " s); retry later"));
  std::vector<Submission> still_waiting;
  for (Submission& sub : waiting_for_group_) {
    if (sub.arrival <= cutoff) {
      FailWith(sub.spec.id, sub.sink, status);
    } else {
      still_waiting.push_back(std::move(sub));
    }
  }
  waiting_for_group_.swap(still_waiting);
  // Admitted before the group broke, never scheduled: they hold no blocks.
  std::vector<RequestId> expired;
  for (const auto& [id, arrival] : arrival_) {
    if (arrival <= cutoff && sinks_.contains(id)) expired.push_back(id);
  }
  if (expired.empty()) return;
  std::vector<RequestOutput> outputs;
  scheduler_->AbortRequests(expired, &outputs);
  for (RequestOutput& out : outputs) {
    out.finish_reason = FinishReason::kError;
    out.error = status;
  }
  Dispatch(outputs);
}

void ServingEngine::Run() {
  for (;;) {
    std::vector<Submission> submissions;
    std::vector<RequestId> aborts;
    {
      absl::MutexLock lock(&mu_);
      const bool busy = engine_ != nullptr && engine_->HasWork() && group_->ready();
      if (!busy) {
        // Idle, or waiting for the group: sleep until there is news. The
        // timeout covers a readiness change that raced with this check, and
        // the queue timeout.
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
    for (Submission& s : submissions) {
      arrival_[s.spec.id] = s.arrival;
      waiting_for_group_.push_back(std::move(s));
    }
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
    ApplyAborts(aborts);
    ExpireQueued();
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

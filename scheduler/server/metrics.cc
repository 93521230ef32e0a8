#include "scheduler/server/metrics.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::scheduler {
namespace {

// vLLM's buckets for request latencies (seconds).
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                                         1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                             30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
// The scheduler's own cost per step: microseconds to milliseconds.
const std::vector<double> kSchedulerBuckets = {5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2};

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return absl::StrFormat("%.9g", v);
}

void Family(std::string* out, const std::string& name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Sample(std::string* out, const std::string& name, const std::string& labels, double value) {
  absl::StrAppend(out, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ", Number(value), "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

void Histogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  std::vector<uint64_t> counts;
  double sum = 0;
  {
    absl::MutexLock lock(&mu_);
    counts = counts_;
    sum = sum_;
  }
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts[i];
    const std::string le = i < bounds_.size() ? Number(bounds_[i]) : "+Inf";
    absl::StrAppend(out, name, "_bucket{", labels, labels.empty() ? "" : ",", "le=\"", le, "\"} ", cumulative, "\n");
  }
  const std::string braced = labels.empty() ? "" : absl::StrCat("{", labels, "}");
  absl::StrAppend(out, name, "_sum", braced, " ", Number(sum), "\n", name, "_count", braced, " ", cumulative, "\n");
}

ServingMetrics::ServingMetrics()
    : ttft_(kTtftBuckets),
      inter_token_(kItlBuckets),
      e2e_(kRequestBuckets),
      queue_time_(kRequestBuckets),
      scheduler_step_(kSchedulerBuckets),
      grammar_mask_(kSchedulerBuckets) {}

void ServingMetrics::OnRequestFinished(const RequestRecord& r) {
  if (r.finish_reason == "stop") {
    ++finished_stop_;
  } else if (r.finish_reason == "length") {
    ++finished_length_;
  } else if (r.finish_reason == "abort") {
    ++finished_abort_;
  } else {
    ++finished_error_;
  }
  prompt_tokens_ += r.prompt_tokens;
  generation_tokens_ += r.generation_tokens;
  e2e_.Observe(r.e2e_seconds);
}

void ServingMetrics::OnHttpResponse(int status) {
  if (status >= 500) {
    ++http_5xx_;
  } else if (status >= 400) {
    ++http_4xx_;
  } else {
    ++http_2xx_;
  }
}

std::string ServingMetrics::Render(const ScrapeInput& in) const {
  std::string out;
  const std::string model = absl::StrCat("model_name=\"", in.model_name, "\"");
  const scheduler::ServingSnapshot& e = in.engine;
  auto gauge = [&](const char* name, const char* help, double value) {
    Family(&out, name, "gauge", help);
    Sample(&out, name, model, value);
  };
  auto counter = [&](const char* name, const char* help, double value) {
    const std::string total = absl::StrCat(name, "_total");
    Family(&out, total, "counter", help);
    Sample(&out, total, model, value);
  };
  gauge("tandem:num_requests_running", "Requests in the running batch.", static_cast<double>(e.num_running));
  gauge("tandem:num_requests_waiting", "Requests waiting to be scheduled (or for the workers).",
        static_cast<double>(e.num_waiting));
  gauge("tandem:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
        e.kv_cache_usage);
  gauge("tandem:kv_cache_blocks", "KV-cache blocks in the pool.", e.kv_blocks_total);
  gauge("tandem:ready", "1 when every worker is up and the model is loaded.", e.executor_ready ? 1 : 0);
  counter("tandem:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(e.prefix_cache_queries));
  counter("tandem:prefix_cache_hits", "Prompt tokens found in the prefix cache.", static_cast<double>(e.prefix_cache_hits));
  counter("tandem:num_preemptions", "Requests preempted to free KV blocks.", static_cast<double>(e.stats.num_preemptions));
  counter("tandem:prompt_tokens", "Prompt tokens of finished requests.", static_cast<double>(prompt_tokens_.load()));
  counter("tandem:generation_tokens", "Tokens generated for finished requests.",
          static_cast<double>(generation_tokens_.load()));

  Family(&out, "tandem:request_success_total", "counter", "Finished requests by finish reason.");
  const std::pair<const char*, int64_t> reasons[] = {{"stop", finished_stop_.load()},
                                                     {"length", finished_length_.load()},
                                                     {"abort", finished_abort_.load()},
                                                     {"error", finished_error_.load()}};
  for (const auto& [reason, count] : reasons) {
    Sample(&out, "tandem:request_success_total", absl::StrCat(model, ",finished_reason=\"", reason, "\""),
           static_cast<double>(count));
  }
  Family(&out, "tandem:http_responses_total", "counter", "HTTP responses by status class.");
  Sample(&out, "tandem:http_responses_total", absl::StrCat(model, ",code=\"2xx\""), static_cast<double>(http_2xx_.load()));
  Sample(&out, "tandem:http_responses_total", absl::StrCat(model, ",code=\"4xx\""), static_cast<double>(http_4xx_.load()));
  Sample(&out, "tandem:http_responses_total", absl::StrCat(model, ",code=\"5xx\""), static_cast<double>(http_5xx_.load()));

  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    Family(&out, name, "histogram", help);
    h.Render(name, model, &out);
  };
  histogram("tandem:time_to_first_token_seconds", "Time from arrival to the first token.", ttft_);
  histogram("tandem:inter_token_latency_seconds", "Time between successive token deliveries of a request.",
            inter_token_);
  histogram("tandem:e2e_request_latency_seconds", "Time from arrival to the last token.", e2e_);
  histogram("tandem:request_queue_time_seconds", "Time from arrival to first being scheduled.", queue_time_);
  histogram("tandem:scheduler_step_duration_seconds",
            "The scheduler's own time (schedule + update) per engine step, without the model.", scheduler_step_);
  histogram("tandem:grammar_mask_duration_seconds",
            "Time the engine thread spent building the structured-output masks of a step that had any.",
            grammar_mask_);
  counter("tandem:grammar_mask_rows", "Structured-output rows whose mask the engine built (one per row per step).",
          static_cast<double>(grammar_rows_.load()));

  counter("tandem:scheduler_time_seconds", "Time spent in the scheduler's schedule and update.", e.scheduler_seconds);
  counter("tandem:engine_steps", "Steps executed by the workers.", static_cast<double>(e.stats.num_steps));
  counter("tandem:wasted_rows", "Rows computed for requests that had already finished (async scheduling's price).",
          static_cast<double>(e.stats.num_wasted_rows));
  // Its name until 0.2; it always counted rows, not steps.
  counter("tandem:wasted_steps", "Deprecated: the same as tandem:wasted_rows_total, removed after 0.2.",
          static_cast<double>(e.stats.num_wasted_rows));
  Family(&out, "tandem:worker_idle_seconds_total", "counter", "Time a worker waited between finishing a step and starting the next.");
  for (const WorkerTimes& w : in.workers) {
    Sample(&out, "tandem:worker_idle_seconds_total", absl::StrCat(model, ",rank=\"", w.rank, "\""), w.idle_seconds);
  }
  Family(&out, "tandem:worker_busy_seconds_total", "counter", "Time a worker spent running steps.");
  for (const WorkerTimes& w : in.workers) {
    Sample(&out, "tandem:worker_busy_seconds_total", absl::StrCat(model, ",rank=\"", w.rank, "\""), w.busy_seconds);
  }
  Family(&out, "tandem:worker_connected", "gauge", "1 while the worker is registered.");
  for (const WorkerTimes& w : in.workers) {
    Sample(&out, "tandem:worker_connected", absl::StrCat(model, ",rank=\"", w.rank, "\""), w.connected ? 1 : 0);
  }
  Family(&out, "tandem:worker_info", "gauge", "1 for each registered worker, with the backend and device it runs.");
  for (const WorkerTimes& w : in.workers) {
    if (!w.connected) continue;
    Sample(&out, "tandem:worker_info",
           absl::StrCat(model, ",rank=\"", w.rank, "\",backend=\"", w.backend, "\",device=\"", w.device, "\""), 1);
  }
  return out;
}

}  // namespace tandem::scheduler

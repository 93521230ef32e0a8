// Prometheus metrics of the serving process, in the text exposition format.
// Names follow vLLM's (under the `tandem:` prefix) so dashboards built for
// vLLM work after renaming the prefix: request counts and finish reasons,
// token counters, KV-cache usage, prefix-cache queries and hits,
// preemptions, and histograms of time to first token, inter-token latency,
// end-to-end latency and queue time. Ours on top: the scheduler's time per
// step, each worker's idle and busy seconds, wasted steps.
//
// Thread-safe. The frontend records per-request events; the engine thread
// records queue and scheduler times through ServingListener; gauges are read
// from snapshots when scraped.
#ifndef TANDEM_SCHEDULER_SERVER_METRICS_H_
#define TANDEM_SCHEDULER_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/server/serving_engine.h"

namespace tandem::scheduler {

// A cumulative histogram with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends the _bucket, _sum and _count lines of `name`.
  // `labels` (may be empty) go on every sample, before `le`.
  void Render(const std::string& name, const std::string& labels, std::string* out) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // one per bound, then +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// A worker as the metrics see it.
struct WorkerTimes {
  int32_t rank = 0;
  bool connected = false;
  double busy_seconds = 0;
  double idle_seconds = 0;
  int64_t steps = 0;
  std::string backend;  // empty while not registered
  std::string device;
};

// What is read from the rest of the process at scrape time.
struct ScrapeInput {
  scheduler::ServingSnapshot engine;
  std::vector<WorkerTimes> workers;
  std::string model_name;
};

class ServingMetrics : public scheduler::ServingListener {
 public:
  ServingMetrics();

  // --- engine thread (ServingListener) ---
  void OnFirstScheduled(double seconds) override { queue_time_.Observe(seconds); }
  void OnSchedulerTime(double seconds) override { scheduler_step_.Observe(seconds); }
  void OnGrammarMasks(int32_t rows, double seconds) override {
    grammar_mask_.Observe(seconds);
    grammar_rows_ += rows;
  }

  // --- frontend, once per finished request ---
  struct RequestRecord {
    std::string finish_reason;   // "stop", "length", "abort", "error"
    int64_t prompt_tokens = 0;
    int64_t generation_tokens = 0;
    double e2e_seconds = 0;
    double ttft_seconds = -1;    // < 0: no token came
  };
  void OnRequestFinished(const RequestRecord& record);
  // Between two successive token deliveries of one request.
  void OnInterTokenLatency(double seconds) { inter_token_.Observe(seconds); }
  void OnTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
  // An HTTP request answered with this status (4xx/5xx counted by code).
  void OnHttpResponse(int status);

  std::string Render(const ScrapeInput& input) const;

 private:
  Histogram ttft_;
  Histogram inter_token_;
  Histogram e2e_;
  Histogram queue_time_;
  Histogram scheduler_step_;
  Histogram grammar_mask_;  // per step with structured-output rows
  std::atomic<int64_t> grammar_rows_{0};
  std::atomic<int64_t> finished_stop_{0}, finished_length_{0}, finished_abort_{0}, finished_error_{0};
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0};
  std::atomic<int64_t> http_2xx_{0}, http_4xx_{0}, http_5xx_{0};
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SERVER_METRICS_H_

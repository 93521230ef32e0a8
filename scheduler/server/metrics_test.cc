#include "scheduler/server/metrics.h"

#include <algorithm>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::scheduler {
namespace {

using ::testing::HasSubstr;

TEST(HistogramTest, BucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.5);
  h.Observe(7);
  std::string out;
  h.Render("x", "", &out);
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 2\n"
            "x_bucket{le=\"1\"} 3\n"
            "x_bucket{le=\"+Inf\"} 4\n"
            "x_sum 7.65\n"
            "x_count 4\n");
  out.clear();
  h.Render("x", "m=\"a\"", &out);
  EXPECT_EQ(out,
            "x_bucket{m=\"a\",le=\"0.1\"} 2\n"
            "x_bucket{m=\"a\",le=\"1\"} 3\n"
            "x_bucket{m=\"a\",le=\"+Inf\"} 4\n"
            "x_sum{m=\"a\"} 7.65\n"
            "x_count{m=\"a\"} 4\n");
}

TEST(ServingMetricsTest, RendersVllmNamesAndOurs) {
  ServingMetrics metrics;
  metrics.OnRequestFinished({"stop", 10, 5, 0.5, 0.1});
  metrics.OnRequestFinished({"length", 3, 16, 1.5, 0.2});
  metrics.OnRequestFinished({"abort", 3, 0, 0.2, -1});
  metrics.OnTimeToFirstToken(0.1);
  metrics.OnInterTokenLatency(0.02);
  metrics.OnFirstScheduled(0.003);
  metrics.OnSchedulerTime(15e-6);
  metrics.OnGrammarMasks(3, 15e-6);
  metrics.OnGrammarMasks(2, 1e-3);
  ScrapeInput in;
  in.model_name = "m";
  in.engine.num_running = 2;
  in.engine.num_waiting = 1;
  in.engine.kv_blocks_total = 100;
  in.engine.kv_cache_usage = 0.25;
  in.engine.prefix_cache_queries = 64;
  in.engine.prefix_cache_hits = 32;
  in.engine.stats.num_preemptions = 4;
  in.engine.stats.num_wasted_rows = 6;
  in.workers = {{0, true, 2.0, 0.5, 10, "cuda", "cuda:0"}, {1, false, 1.0, 1.5, 9, "", ""}};
  const std::string text = metrics.Render(in);
  EXPECT_THAT(text, HasSubstr("tandem:num_requests_running{model_name=\"m\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tandem:num_requests_waiting{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"));
  EXPECT_THAT(text, HasSubstr("tandem:prefix_cache_queries_total{model_name=\"m\"} 64\n"));
  EXPECT_THAT(text, HasSubstr("tandem:prefix_cache_hits_total{model_name=\"m\"} 32\n"));
  EXPECT_THAT(text, HasSubstr("tandem:num_preemptions_total{model_name=\"m\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("tandem:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:request_success_total{model_name=\"m\",finished_reason=\"length\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:request_success_total{model_name=\"m\",finished_reason=\"abort\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:prompt_tokens_total{model_name=\"m\"} 16\n"));
  EXPECT_THAT(text, HasSubstr("tandem:generation_tokens_total{model_name=\"m\"} 21\n"));
  EXPECT_THAT(text, HasSubstr("tandem:time_to_first_token_seconds_count{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:inter_token_latency_seconds_count{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:e2e_request_latency_seconds_count{model_name=\"m\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("tandem:request_queue_time_seconds_count{model_name=\"m\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:scheduler_step_duration_seconds_bucket{model_name=\"m\",le=\"2e-05\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:wasted_rows_total{model_name=\"m\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("tandem:grammar_mask_duration_seconds_bucket{model_name=\"m\",le=\"2e-05\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("tandem:grammar_mask_duration_seconds_count{model_name=\"m\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("tandem:grammar_mask_rows_total{model_name=\"m\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("tandem:wasted_steps_total{model_name=\"m\"} 6\n"));  // the old name, until 0.2
  EXPECT_THAT(text, HasSubstr("tandem:worker_idle_seconds_total{model_name=\"m\",rank=\"1\"} 1.5\n"));
  // Which backend and device each registered rank runs.
  EXPECT_THAT(text, HasSubstr("tandem:worker_info{model_name=\"m\",rank=\"0\",backend=\"cuda\",device=\"cuda:0\"} 1\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("tandem:worker_info{model_name=\"m\",rank=\"1\"")));
  // Every sample carries the model's name, as vLLM's dashboards filter on it.
  EXPECT_THAT(text, HasSubstr("# TYPE tandem:time_to_first_token_seconds histogram\n"));
  // Every sample line is "name{labels} value" or "name value".
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(std::count(line.begin(), line.end(), ' '), 1) << line;
    EXPECT_THAT(line, HasSubstr("{model_name=\"m\"")) << line;
  }
}

}  // namespace
}  // namespace tandem::scheduler

// fault_campaign: faults under load (issue 11, item 7; fault_campaign.h says
// what a cycle does). For each pipeline size it starts a tandem-scheduler and
// its workers on a tiny random model (made here, as `tandem make-model` and
// the distributed test do, unless --model is given), keeps --in-flight
// streaming requests going and runs --cycles fault cycles, then prints the
// requests completed, errored, lost and mismatched and the detection and
// recovery times. Exit status 1 when anything was lost or mismatched or a
// property did not hold.
//
//   build/bin/fault_campaign --stages 1,2 --cycles 20 --in-flight 64
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/flags.h"
#include "common/gguf/random_llama.h"
#include "tools/bench/fault_campaign.h"

namespace tandem::tools {
namespace {

// The distributed test's model: three layers (up to three stages), weights
// large enough that outputs depend on the whole context.
absl::StatusOr<TemporaryFile> MakeTinyModel() {
  gguf::RandomLlamaOptions options;
  options.layers = 3;
  options.context = 512;
  options.type = gguf::GgmlType::kQ8_0;
  options.weight_scale = 0.2;
  options.seed = 23;
  auto bytes = gguf::MakeRandomLlama(options);
  if (!bytes.ok()) return bytes.status();
  return TemporaryFile::Create("fault_campaign_model", *bytes);
}

std::string MeanMax(const std::vector<FaultCycle>& cycles, bool detection, const std::vector<FaultKind>& kinds) {
  std::vector<double> v;
  for (const FaultCycle& c : cycles) {
    if (std::find(kinds.begin(), kinds.end(), c.kind) != kinds.end()) v.push_back(detection ? c.detection_s : c.recovery_s);
  }
  if (v.empty()) return "-";
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f / %.2f", mean, *std::max_element(v.begin(), v.end()));
  return text;
}

void PrintReport(int32_t stages, const FaultCampaignReport& r) {
  const RequestTally& t = r.requests;
  const std::vector<FaultKind> kill = {FaultKind::kKill}, hang = {FaultKind::kHangResume, FaultKind::kHangKill};
  std::printf("| %d | %zu | %lld | %lld | %lld | %lld | %s | %s | %s | %s |\n", stages, r.cycles.size(),
              static_cast<long long>(t.completed), static_cast<long long>(t.errored), static_cast<long long>(t.lost),
              static_cast<long long>(t.mismatched), MeanMax(r.cycles, true, kill).c_str(),
              MeanMax(r.cycles, false, kill).c_str(), MeanMax(r.cycles, true, hang).c_str(),
              MeanMax(r.cycles, false, hang).c_str());
  std::printf("    preemptions: %lld\n", static_cast<long long>(r.preemptions));
  for (const auto& [error, count] : t.errors) std::printf("    error x%lld: %s\n", static_cast<long long>(count), error.c_str());
  if (t.failed_after_recovery > 0) {
    std::printf("    FAILED AFTER RECOVERY: %lld\n", static_cast<long long>(t.failed_after_recovery));
  }
  for (const std::string& e : t.examples) std::printf("    %s\n", e.c_str());
  for (const std::string& p : r.problems) std::printf("    PROBLEM: %s\n", p.c_str());
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  FaultCampaignOptions base;
  base.cluster.scheduler.shutdown_grace = 0;
  base.cluster.scheduler.max_num_seqs = 64;
  // About 200 blocks of 16 tokens at PP 1: 64 requests in flight preempt.
  base.cluster.worker.kv_cache_memory = int64_t{1} << 20;
  base.cluster.worker.threads = 1;
  std::string stages_list = "1,2", log_dir;
  int64_t cycles = 20, in_flight = 64, workload_size = 96, seed = 1;
  bool verbose = false;
  FlagParser flags("fault_campaign", "Worker faults under a load of streaming requests; every request accounted for.");
  std::string model;
  flags.AddString("model", &model, "GGUF model (default: a tiny random one made here)");
  flags.AddString("stages", &stages_list, "pipeline sizes to run, comma-separated");
  flags.AddInt("cycles", &cycles, "fault cycles per pipeline size (kill, hang+resume, hang+kill in turn)", 1, 10000);
  flags.AddInt("in-flight", &in_flight, "streaming requests kept in flight", 1, 4096);
  flags.AddInt("workload", &workload_size, "distinct requests (their fault-free outputs are computed first)", 1, 100000);
  flags.AddInt("seed", &seed, "of the workload and the fault times and ranks", 0);
  flags.AddInt("max-num-seqs", &base.cluster.scheduler.max_num_seqs, "the scheduler's running requests at most", 1);
  flags.AddBytes("kv-cache-memory", &base.cluster.worker.kv_cache_memory, "KV memory per worker (small: preemption)");
  flags.AddDouble("request-deadline", &base.request_deadline_s, "seconds after which a request counts as lost");
  flags.AddDouble("wait", &base.wait_s, "seconds any awaited state may take before it is a problem");
  flags.AddString("log-dir", &log_dir, "keep the processes' logs under this folder (one subfolder per size)");
  flags.AddBool("verbose", &verbose, "a line per cycle");
  if (std::optional<int> exit_code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) {
    return *exit_code;
  }
  std::optional<TemporaryFile> tiny;
  base.cluster.scheduler.model = model;
  if (model.empty()) {
    auto made = MakeTinyModel();
    if (!made.ok()) {
      std::fprintf(stderr, "fault_campaign: %s\n", made.status().ToString().c_str());
      return 1;
    }
    tiny.emplace(std::move(*made));
    base.cluster.scheduler.model = tiny->path();
  }
  auto workload = MakeFaultWorkload(base.cluster.scheduler.model, static_cast<int32_t>(workload_size),
                                    static_cast<uint64_t>(seed));
  if (!workload.ok()) {
    std::fprintf(stderr, "fault_campaign: the reference run failed: %s\n", workload.status().ToString().c_str());
    return 1;
  }
  base.cycles = static_cast<int32_t>(cycles);
  base.in_flight = static_cast<int32_t>(in_flight);
  base.seed = static_cast<uint64_t>(seed);
  if (verbose) base.log = [](const std::string& line) { std::fprintf(stderr, "fault_campaign: %s\n", line.c_str()); };
  std::printf("%lld streaming requests in flight, %lld cycles per size, %zu distinct requests\n",
              static_cast<long long>(in_flight), static_cast<long long>(cycles), workload->size());
  std::printf("| PP | cycles | completed | errored | lost | mismatched | kill: detected s (mean / max) | "
              "kill: ready again s | hang: detected s | hang: ready again s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  bool ok = true;
  for (absl::string_view s : absl::StrSplit(stages_list, ',')) {
    int32_t stages = 0;
    if (!absl::SimpleAtoi(s, &stages) || stages < 1) {
      std::fprintf(stderr, "fault_campaign: bad --stages entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    FaultCampaignOptions o = base;
    o.cluster.scheduler.pipeline_parallel_size = stages;
    if (!log_dir.empty()) o.cluster.directory = absl::StrCat(log_dir, "/pp", stages);
    auto report = RunFaultCampaign(o, *workload);
    if (!report.ok()) {
      std::fprintf(stderr, "fault_campaign: PP %d: %s\n", stages, report.status().ToString().c_str());
      return 1;
    }
    PrintReport(stages, *report);
    ok = ok && report->ok();
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) { return tandem::tools::Main(argc, argv); }

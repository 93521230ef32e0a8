// control_plane_bench: the control plane's ceiling (issue 13 item 6). The
// scheduler runs in this process: the real WorkerGroup, ServingEngine and
// gRPC server (SchedulerServer), and P real tandem-worker processes dial it
// with --fake-model, whose model costs nothing. So a step is what the
// scheduler, gRPC, the worker and the worker-to-worker channel cost.
//
// Requests are submitted in process (ServingEngine::Submit with a sink that
// counts): 1,024 Generate streams, each answered token by token, would
// measure the client and the Generate service's per-token writes instead of
// the step path, and on a shared 2-core machine the client would be the
// bottleneck.
//
// For each configuration (running requests x stages x async) it waits until
// every request runs, then measures --steps steps: steps/s (wall), the CPU
// time per step of this process (the scheduler) and of each worker
// (/proc/PID/stat), the context switches per step of the scheduler and of
// the workers together (every thread's, /proc/PID/task/*/status; the
// scheduler's include the bench's own 5 ms polls, about 0.04 a step), and,
// after the timed window, the bytes on the wire per scheduled request per step, from the serialized messages in their compact
// form (the execute command to every rank, the sample command to the last,
// the result back).
//
//   build/bin/control_plane_bench --running 64,256,1024 --stages 1,2
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/default_model.h"
#include "common/flags.h"
#include "common/gguf/llama_config.h"
#include "common/gguf/model_file.h"
#include "proto/diff/step_diff.h"
#include "scheduler/server/grpc/grpc_scheduler_server.h"
#include "scheduler/server/serving_engine.h"
#include "scheduler/wire/compact_step.h"
#include "scheduler/wire/step_codec.h"
#include "scheduler/wire/worker_group.h"
#include "tandem/v1/worker_service.pb.h"
#include "tools/cluster/local_cluster.h"

// Callgrind's client requests when valgrind's headers are installed (they are
// no-ops outside valgrind); a machine without them builds the bench unchanged.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS_AT(name)
#endif

extern char** environ;

namespace tandem::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Counts updated steps; while `measure_bytes`, adds up the serialized size
// of each step's messages in the form the stream carries them (the execute
// as a diff against the steps before, the result without its rows:
// proto/diff/step_diff.h), from a StepDiffState of its own fed the same
// steps in the same order, so it compacts exactly as the WorkerGroup does.
// The first steps after measuring starts are not counted: the state has no
// base yet. Engine thread; the counters are read elsewhere.
class WireMeter : public scheduler::StepObserver {
 public:
  explicit WireMeter(int32_t stages) : stages_(stages) {}
  void OnUpdated(const scheduler::EngineCore&, const scheduler::SchedulerOutput& step,
                 const scheduler::ModelRunnerOutput& result, absl::Span<const scheduler::RequestOutput>) override {
    const int64_t step_count = steps_.fetch_add(1, std::memory_order_relaxed) + 1;
    CallgrindWindow(step_count);
    if (!measure_bytes.load(std::memory_order_relaxed) || step.scheduled.empty()) return;
    v1::SchedulerMessage execute;
    // Encoded as WorkerGroup::Execute does.
    scheduler::EncodeStepWithoutRows(step, execute.mutable_execute());
    if (!encoder_.EncodeRows(step, execute.mutable_execute(), execute.mutable_execute_diff())) {
      execute.clear_execute_diff();
    }
    if (++seen_ <= wire::StepDiffState::kMaxBase) return;
    v1::SchedulerMessage sample;
    scheduler::EncodeSampleCommand(step.step_seq, nullptr, sample.mutable_sample());
    v1::WorkerMessage back;
    back.mutable_result()->set_epoch(1);
    scheduler::EncodeRunnerOutput(result, back.mutable_result()->mutable_output());
    wire::CompactResult(back.mutable_result());
    down_bytes_ += static_cast<int64_t>(execute.ByteSizeLong()) * stages_ + static_cast<int64_t>(sample.ByteSizeLong());
    up_bytes_ += static_cast<int64_t>(back.ByteSizeLong());
    rows_ += static_cast<int64_t>(step.scheduled.size());
    measured_.fetch_add(1, std::memory_order_release);
  }
  int64_t steps() const { return steps_.load(std::memory_order_relaxed); }
  // Under callgrind: zero the counts at the next update and dump them `steps`
  // updates later, both on the engine thread, so the dump holds exactly
  // `steps` steps (outside valgrind the requests are no-ops).
  void ArmCallgrind(int64_t steps) { callgrind_steps_.store(steps, std::memory_order_release); }
  int64_t measured() const { return measured_.load(std::memory_order_acquire); }
  // Per scheduled row; read after measured() stopped moving.
  double down_per_row() const { return rows_ ? double(down_bytes_) / rows_ : 0; }
  double up_per_row() const { return rows_ ? double(up_bytes_) / rows_ : 0; }

  std::atomic<bool> measure_bytes{false};

 private:
  void CallgrindWindow(int64_t step_count) {
    const int64_t window = callgrind_steps_.load(std::memory_order_acquire);
    if (window <= 0) return;
    if (callgrind_from_ < 0) {
      callgrind_from_ = step_count;
      CALLGRIND_ZERO_STATS;
    } else if (step_count == callgrind_from_ + window) {
      CALLGRIND_DUMP_STATS_AT("control_plane_bench window");
      callgrind_steps_.store(0, std::memory_order_relaxed);
    }
  }

  const int32_t stages_;
  std::atomic<int64_t> callgrind_steps_{0};
  int64_t callgrind_from_ = -1;
  scheduler::CompactStepEncoder encoder_;
  int64_t seen_ = 0;
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> measured_{0};
  int64_t down_bytes_ = 0, up_bytes_ = 0, rows_ = 0;
};

class CountingSink : public scheduler::RequestSink {
 public:
  void OnOutput(const scheduler::RequestOutput& output) override {
    if (!output.finished()) return;
    if (finished.fetch_add(1, std::memory_order_relaxed) == 0) {
      absl::MutexLock lock(&mu_);
      first_ = absl::StrCat(scheduler::FinishReasonName(output.finish_reason), " after ", output.num_output_tokens,
                            " tokens", output.error.ok() ? "" : ": ", output.error.message());
    }
  }
  // How the first request to finish did, for a message.
  std::string first() const {
    absl::MutexLock lock(&mu_);
    return first_;
  }
  std::atomic<int64_t> finished{0};

 private:
  mutable absl::Mutex mu_;
  std::string first_ ABSL_GUARDED_BY(mu_);
};

// CPU seconds (user + system) of a process: this one, or a child by pid.
double CpuSeconds(pid_t pid) {
  if (pid == 0) {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(in, line);
  // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
  std::vector<std::string> f = absl::StrSplit(line.substr(line.rfind(')') + 2), ' ');
  double ticks = 0;
  if (f.size() > 13) ticks = std::stod(f[11]) + std::stod(f[12]);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Context switches (voluntary and not) of a process's threads so far: this
// process, or a child by pid. A thread that exits is no longer counted; the
// window measured has none.
int64_t ContextSwitches(pid_t pid) {
  const std::string dir = pid == 0 ? std::string("/proc/self/task") : absl::StrCat("/proc/", pid, "/task");
  int64_t total = 0;
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator(dir, error)) {
    std::ifstream in(task.path() / "status");
    for (std::string line; std::getline(in, line);) {
      absl::string_view rest = line;
      if (!absl::ConsumePrefix(&rest, "voluntary_ctxt_switches:") &&
          !absl::ConsumePrefix(&rest, "nonvoluntary_ctxt_switches:")) {
        continue;
      }
      int64_t n = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &n)) total += n;
    }
  }
  return total;
}

struct Config {
  int64_t running = 256;
  int32_t stages = 1;
  bool async = true;
};

struct Figures {
  double steps_per_second = 0;
  double scheduler_us_per_step = 0;
  std::vector<double> worker_us_per_step;
  double scheduler_switches_per_step = 0, worker_switches_per_step = 0;  // all workers together
  double down_bytes = 0, up_bytes = 0;  // per scheduled request per step
};

struct BenchOptions {
  std::string model;
  std::string worker;
  int64_t steps = 2000;
  int64_t prompt_tokens = 8;
  int64_t repeats = 1;
  std::string log_dir = "/tmp";
  // Where the workers dial: "socket" (a Unix socket of their own, as
  // `tandem serve` has them), "port" (a TCP port of their own, as on
  // Kubernetes) or "main" (the Generate API's port).
  std::string workers = "socket";
};

bool WaitFor(const std::function<bool()>& done, double seconds) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

absl::StatusOr<pid_t> SpawnWorker(const BenchOptions& o, const Config& c, const std::string& target, int rank,
                                  int64_t kv_bytes) {
  std::vector<std::string> argv = {o.worker, "--scheduler", target, "--rank",
                                   absl::StrCat(rank), "--world-size", absl::StrCat(c.stages), "--model", o.model,
                                   "--fake-model", absl::StrCat("--kv-cache-memory=", kv_bytes)};
  const std::string log = absl::StrCat(o.log_dir, "/control_plane_bench.worker", rank, ".log");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return absl::InternalError(absl::StrCat("cannot start ", o.worker, ": error ", error));
  return pid;
}

absl::StatusOr<Figures> RunOne(const BenchOptions& o, const gguf::LlamaConfig& model, const Config& c) {
  const int32_t cadence = c.async ? c.stages : 1;
  const int64_t output_tokens = (o.steps + 4096) / cadence + 64;
  scheduler::EngineConfig config;
  config.async_scheduling = c.async;
  config.pipeline_parallel_size = c.stages;
  config.max_num_seqs = static_cast<int32_t>(c.running);
  config.max_num_batched_tokens = static_cast<int32_t>(std::max<int64_t>(2048, c.running));
  config.max_model_len = static_cast<int32_t>(o.prompt_tokens + output_tokens + 16);
  config.vocab_size = model.vocab_size;
  const int64_t blocks = c.running * (config.max_model_len / config.block_size + 2) + 64;
  WireMeter meter(c.stages);
  std::unique_ptr<scheduler::ServingEngine> engine;
  scheduler::WorkerGroupOptions group_options;
  group_options.world_size = c.stages;
  group_options.block_size = config.block_size;
  group_options.on_change = [&engine] {
    if (engine) engine->Wake();
  };
  scheduler::WorkerGroup group(group_options);
  engine = std::make_unique<scheduler::ServingEngine>(config, &group, std::vector<scheduler::StepObserver*>{&meter});
  scheduler::SchedulerServer::WorkerListen listen;
  if (o.workers == "port") listen.port = 0;
  if (o.workers == "socket") listen.socket = absl::StrCat("/tmp/control_plane_bench.", getpid(), ".sock");
  auto server = scheduler::SchedulerServer::Start("127.0.0.1", 0, &group, engine.get(), nullptr, {}, listen);
  if (!server.ok()) return server.status();
  const std::string target = o.workers == "socket" ? "unix:" + listen.socket
                                                   : absl::StrCat("127.0.0.1:", (*server)->worker_port());
  engine->Start();
  std::vector<pid_t> workers;
  auto stop = [&] {
    (*server)->Shutdown();
    engine->Stop();
    for (pid_t pid : workers) kill(pid, SIGTERM);
    for (pid_t pid : workers) waitpid(pid, nullptr, 0);
  };
  for (int r = 0; r < c.stages; ++r) {
    auto pid = SpawnWorker(o, c, target, r, blocks * 8 * config.block_size);
    if (!pid.ok()) {
      stop();
      return pid.status();
    }
    workers.push_back(*pid);
  }
  if (!WaitFor([&] { return group.ready(); }, 60)) {
    stop();
    return absl::DeadlineExceededError(absl::StrCat("the workers did not form a group; see ", o.log_dir,
                                                    "/control_plane_bench.worker*.log"));
  }
  auto sink = std::make_shared<CountingSink>();
  std::mt19937 rng(1);
  for (int64_t i = 0; i < c.running; ++i) {
    scheduler::RequestSpec spec;
    for (int64_t t = 0; t < o.prompt_tokens; ++t) spec.prompt_token_ids.push_back(rng() % model.vocab_size);
    spec.sampling.temperature = 0;
    spec.sampling.ignore_eos = true;
    spec.sampling.max_tokens = static_cast<int32_t>(output_tokens);
    engine->Submit("", std::move(spec), sink);
  }
  // Every request running, its prefill done.
  // A failed step fails the requests: stop waiting then.
  const bool steady = WaitFor([&] { return sink->finished > 0 || engine->Snapshot().num_running == c.running; }, 120) &&
                      WaitFor([&, from = meter.steps()] { return sink->finished > 0 || meter.steps() >= from + 64; }, 120);
  if (!steady || sink->finished > 0) {
    stop();
    return absl::InternalError(absl::StrCat("the batch did not reach ", c.running, " running requests (",
                                            sink->finished.load(), " ended early; see the workers' logs in ",
                                            o.log_dir, ")"));
  }
  meter.ArmCallgrind(o.steps);
  const int64_t steps0 = meter.steps();
  const auto wall0 = Clock::now();
  std::vector<double> cpu0 = {CpuSeconds(0)};
  for (pid_t pid : workers) cpu0.push_back(CpuSeconds(pid));
  std::vector<int64_t> switches0 = {ContextSwitches(0)};
  for (pid_t pid : workers) switches0.push_back(ContextSwitches(pid));
  // Requests that end stop the steps: the run is lost then (below), not waited out.
  WaitFor([&] { return sink->finished > 0 || meter.steps() >= steps0 + o.steps; }, 600);
  const int64_t steps = meter.steps() - steps0;
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  Figures f;
  f.steps_per_second = steps / wall;
  f.scheduler_us_per_step = (CpuSeconds(0) - cpu0[0]) / steps * 1e6;
  for (size_t i = 0; i < workers.size(); ++i) {
    f.worker_us_per_step.push_back((CpuSeconds(workers[i]) - cpu0[i + 1]) / steps * 1e6);
  }
  f.scheduler_switches_per_step = static_cast<double>(ContextSwitches(0) - switches0[0]) / steps;
  for (size_t i = 0; i < workers.size(); ++i) {
    f.worker_switches_per_step += static_cast<double>(ContextSwitches(workers[i]) - switches0[i + 1]) / steps;
  }
  meter.measure_bytes = true;
  WaitFor([&] { return meter.measured() >= 64; }, 60);
  meter.measure_bytes = false;
  WaitFor([&, last = int64_t{-1}]() mutable {
    const int64_t now = meter.measured();
    const bool same = now == last;
    last = now;
    return same;
  }, 10);
  f.down_bytes = meter.down_per_row();
  f.up_bytes = meter.up_per_row();
  const bool lost = sink->finished > 0;
  stop();
  if (lost) {
    return absl::InternalError(absl::StrCat(sink->finished.load(), " requests finished during the measurement (the first: ",
                                            sink->first(), " of ", output_tokens, ")"));
  }
  return f;
}

double TotalCpu(const Figures& f) {
  double total = f.scheduler_us_per_step;
  for (double w : f.worker_us_per_step) total += w;
  return total;
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

int Main(int argc, char** argv) {
  // As tandem-scheduler does (scheduler/server/main.cc).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  BenchOptions o;
  o.model = DefaultModelPath();
  o.worker = ProgramDirectory() + "/tandem-worker";
  std::string running = "64,256,1024", stages = "1,2", async = "on,off";
  FlagParser flags("control_plane_bench",
                   "Steps/s, CPU time per step and wire bytes per request per step of scheduler -> gRPC ->\n"
                   "tandem-worker --fake-model -> back (the scheduler runs in this process).");
  flags.AddString("model", &o.model, "GGUF model file (only its shape and vocabulary are used)");
  flags.AddString("worker", &o.worker, "the tandem-worker executable");
  flags.AddString("running", &running, "running decode requests, comma-separated");
  flags.AddString("stages", &stages, "pipeline stages, comma-separated");
  flags.AddString("async", &async, "on, off or on,off");
  flags.AddInt("steps", &o.steps, "steps measured per configuration");
  flags.AddInt("prompt-tokens", &o.prompt_tokens, "prompt length of each request");
  flags.AddInt("repeats", &o.repeats,
               "runs per configuration; the one with the least CPU per step is shown (on a shared\n"
               "machine the others are inflated by contention), every run's steps/s on stderr");
  flags.AddString("log-dir", &o.log_dir, "where the workers' logs go");
  flags.AddString("workers", &o.workers,
                  "where the workers dial: socket (a Unix socket of their own: tandem-scheduler --worker-socket,\n"
                  "as tandem serve has them), port (a TCP port of their own: --worker-port, as on Kubernetes)\n"
                  "or main (the Generate API's port)");
  if (std::optional<int> code = flags.ParseOrExitCode(std::vector<std::string>(argv + 1, argv + argc))) return *code;
  const std::vector<int64_t> running_list = ParseList(running), stage_list = ParseList(stages);
  if (running_list.empty() || stage_list.empty() || o.steps < 1 || o.prompt_tokens < 1 || o.repeats < 1 ||
      (async != "on" && async != "off" && async != "on,off") ||
      (o.workers != "socket" && o.workers != "port" && o.workers != "main")) {
    std::fprintf(stderr,
                 "control_plane_bench: --running, --stages: positive integers, comma-separated; --steps, "
                 "--prompt-tokens, --repeats: at least 1; --async: on, off or on,off; --workers: socket, port or "
                 "main\n");
    return 2;
  }
  auto file = gguf::OpenModelFile(o.model);
  if (!file.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", std::string(file.status().message()).c_str());
    return 1;
  }
  auto model = gguf::ReadLlamaConfig(**file);
  if (!model.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  // As tandem-scheduler does for workers with a server of their own, before
  // gRPC starts.
  if (o.workers != "main") setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  signal(SIGPIPE, SIG_IGN);
  std::printf("Workers dial: %s.\n\n", o.workers == "socket" ? "a Unix socket of their own"
                                     : o.workers == "port"   ? "a TCP port of their own"
                                                             : "the Generate API's port");
  std::printf("| running | stages | async | steps/s (wall) | scheduler CPU us/step | worker CPU us/step | "
              "bytes/request/step down | up | switches/step scheduler, workers |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t r : running_list) {
    for (int64_t s : stage_list) {
      for (bool a : {true, false}) {
        if ((a && async == "off") || (!a && async == "on")) continue;
        absl::StatusOr<Figures> f;
        std::vector<double> rates;  // every run's steps/s
        for (int64_t k = 0; k < o.repeats; ++k) {
          absl::StatusOr<Figures> one = RunOne(o, *model, {r, static_cast<int32_t>(s), a});
          if (one.ok()) rates.push_back(one->steps_per_second);
          if (!one.ok() || !f.ok() || TotalCpu(*one) < TotalCpu(*f)) f = std::move(one);
          if (!f.ok()) break;
        }
        if (!f.ok()) {
          std::fprintf(stderr, "control_plane_bench: %lld running, %lld stages, async %s: %s\n",
                       static_cast<long long>(r), static_cast<long long>(s), a ? "on" : "off",
                       std::string(f.status().message()).c_str());
          return 1;
        }
        std::string workers;
        for (double w : f->worker_us_per_step) absl::StrAppend(&workers, workers.empty() ? "" : ", ", absl::StrFormat("%.1f", w));
        std::printf("| %lld | %lld | %s | %.0f | %.1f | %s | %.2f | %.2f | %.2f, %.2f |\n", static_cast<long long>(r),
                    static_cast<long long>(s), a ? "on" : "off", f->steps_per_second, f->scheduler_us_per_step,
                    workers.c_str(), f->down_bytes, f->up_bytes, f->scheduler_switches_per_step,
                    f->worker_switches_per_step);
        std::fflush(stdout);
        if (rates.size() > 1) {
          // The least-CPU run is not the typical one where the VM steals time
          // (little CPU, a low rate): every run's rate, to stderr.
          std::sort(rates.begin(), rates.end());
          std::string all;
          for (double rate : rates) absl::StrAppend(&all, all.empty() ? "" : ", ", absl::StrFormat("%.0f", rate));
          std::fprintf(stderr, "control_plane_bench: %lld running, %lld stages, async %s: steps/s of the %zu runs: %s\n",
                       static_cast<long long>(r), static_cast<long long>(s), a ? "on" : "off", rates.size(),
                       all.c_str());
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::tools

int main(int argc, char** argv) { return tandem::tools::Main(argc, argv); }

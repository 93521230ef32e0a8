#include "tests/integration/cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tools/engine/grpc_generate_client.h"

extern char** environ;

namespace tandem::testing {

std::string BinaryPath(const std::string& name) { return std::string(TANDEM_BIN_DIR) + "/" + name; }

absl::StatusOr<pid_t> Cluster::Spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": error ", error));
  return pid;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const ClusterOptions& options) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->options_ = options;
  char pattern[] = "/tmp/tandem_cluster_XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
  c->dir_ = pattern;
  const std::string port_file = c->dir_ + "/port";
  std::vector<std::string> argv = {BinaryPath("tandem-scheduler"),
                                   "--model", options.model_path,
                                   "--port", "0",
                                   "--port-file", port_file,
                                   "--pipeline-parallel-size", std::to_string(options.pipeline_parallel_size),
                                   "--max-num-seqs", std::to_string(options.max_num_seqs),
                                   "--max-num-batched-tokens", std::to_string(options.max_num_batched_tokens),
                                   "--max-model-len", std::to_string(options.max_model_len),
                                   "--step-timeout", std::to_string(options.step_timeout_seconds)};
  if (!options.async_scheduling) argv.push_back("--no-async-scheduling");
  if (options.trace_steps) {
    argv.push_back("--trace-steps");
    argv.push_back(c->trace_path());
  }
  auto scheduler = c->Spawn(argv, c->dir_ + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  c->scheduler_ = *scheduler;
  for (int i = 0; i < 200 && c->port_ == 0; ++i) {
    std::ifstream(port_file) >> c->port_;
    if (c->port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (c->port_ == 0) return absl::UnavailableError("the scheduler did not report its port; see " + c->dir_);
  c->workers_.assign(options.pipeline_parallel_size, -1);
  for (int32_t r = 0; r < options.pipeline_parallel_size; ++r) {
    if (absl::Status s = c->StartWorker(r); !s.ok()) return s;
  }
  if (absl::Status s = c->WaitReady(true, 60); !s.ok()) return s;
  return c;
}

absl::Status Cluster::StartWorker(int32_t rank) {
  auto pid = Spawn({BinaryPath("tandem-worker"), "--scheduler", target(), "--rank", std::to_string(rank),
                    "--world-size", std::to_string(options_.pipeline_parallel_size), "--model", options_.model_path,
                    "--kv-cache-memory", options_.kv_cache_memory, "--threads",
                    std::to_string(options_.worker_threads), "--peer-timeout", "10"},
                   absl::StrCat(dir_, "/worker", rank, ".log"));
  if (!pid.ok()) return pid.status();
  workers_[rank] = *pid;
  return absl::OkStatus();
}

void Cluster::KillWorker(int32_t rank) {
  if (workers_[rank] <= 0) return;
  kill(workers_[rank], SIGKILL);
  waitpid(workers_[rank], nullptr, 0);
  workers_[rank] = -1;
}

bool Cluster::SchedulerAlive() { return scheduler_ > 0 && waitpid(scheduler_, nullptr, WNOHANG) == 0; }

absl::Status Cluster::WaitReady(bool ready, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    auto health = tools::QueryHealth(target());
    if (health.ok()) {
      if (health->ready == ready) return absl::OkStatus();
      last = health->status;
    } else {
      last = std::string(health.status().message());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("the group did not become ", ready ? "ready" : "not ready", " in ",
                                                  seconds, " s (", last, "); logs in ", dir_));
}

Cluster::~Cluster() {
  for (pid_t& pid : workers_) {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  if (scheduler_ > 0) {
    kill(scheduler_, SIGTERM);
    for (int i = 0; i < 100 && waitpid(scheduler_, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(scheduler_, SIGKILL);
    waitpid(scheduler_, nullptr, 0);
  }
  if (std::getenv("TANDEM_KEEP_CLUSTER_LOGS") == nullptr) {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }
}

}  // namespace tandem::testing

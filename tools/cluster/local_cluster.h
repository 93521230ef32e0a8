// LocalCluster: a tandem-scheduler and its tandem-worker processes on one
// machine, started as children of this process (`tandem serve`, the
// integration tests, the benchmarks). The scheduler reports the port it
// bound through --port-file, so port 0 works. Each process logs to a file in
// the cluster's directory (or inherits this process's stderr); the destructor
// stops whatever is still running.
#ifndef TANDEM_TOOLS_CLUSTER_LOCAL_CLUSTER_H_
#define TANDEM_TOOLS_CLUSTER_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/server/scheduler_flags.h"
#include "worker/server/worker_flags.h"

namespace tandem::tools {

struct LocalClusterOptions {
  // On one machine a peer silent for 10 s is gone: a group recovers sooner
  // than with the worker's own default.
  LocalClusterOptions() { worker.peer_timeout = 10; }

  // Forwarded to tandem-scheduler, and its model and block size to the
  // workers too.
  scheduler::SchedulerFlags scheduler;
  // Forwarded to every tandem-worker; threads 0: the machine's hardware
  // threads divided among the workers.
  worker::WorkerFlags worker;
  std::string host = "127.0.0.1";
  int32_t port = 0;       // gRPC; 0: any free port
  // Where the workers dial (worker_target()).
  enum class WorkerLink {
    // A Unix socket in the cluster's directory (tandem-scheduler
    // --worker-socket): the fastest; a port of their own instead with TLS
    // (certificates name hosts) or when the directory's path is too long
    // for a socket's.
    kSocket,
    kPort,      // a TCP port of their own on `host` (--worker-port=0)
    kMainPort,  // the Generate API's port
  };
  WorkerLink worker_link = WorkerLink::kSocket;
  int32_t http_port = 0;  // the OpenAI API on `host`; 0: any free port; -1: none
  // Empty: a fresh directory under /tmp, removed by the destructor unless
  // `keep_directory`. Logs go there unless `inherit_output`.
  std::string directory;
  bool keep_directory = false;
  bool inherit_output = false;
  // Trace every step to trace_path() (unless scheduler.trace_steps names a file).
  bool trace_steps = false;
  // The executables; empty: next to this program.
  std::string bin_dir;
};

class LocalCluster {
 public:
  // Starts the scheduler and every worker and waits until the group is ready.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();

  // The gRPC Generate API.
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  // Where the workers dial: unix:PATH or 127.0.0.1:PORT.
  std::string worker_target() const {
    return worker_socket_.empty() ? "127.0.0.1:" + std::to_string(worker_port_) : "unix:" + worker_socket_;
  }
  // The OpenAI API's port; 0 without one.
  int http_port() const { return http_port_; }
  const std::string& directory() const { return dir_; }
  std::string trace_path() const { return dir_ + "/trace.jsonl"; }

  // Sends `signal` to worker `rank`; SIGKILL also reaps it.
  void SignalWorker(int32_t rank, int signal);
  void KillWorker(int32_t rank) { SignalWorker(rank, 9); }
  // Starts worker `rank` again.
  absl::Status StartWorker(int32_t rank);
  // Waits up to `seconds` for worker `rank` to exit by itself and reaps it;
  // returns how it ended ("exited with status 1"), or DeadlineExceeded.
  absl::StatusOr<std::string> WaitWorkerExit(int32_t rank, double seconds);
  // Ranks whose process has exited since it was started (reaped here), each
  // with how it ended; a campaign restarts them.
  std::vector<std::pair<int32_t, std::string>> ReapExitedWorkers();
  // The scheduler's /metrics text (the OpenAI API's port; 5 s timeout).
  absl::StatusOr<std::string> FetchMetrics() const;
  // Waits until Health says ready (or not), up to `seconds`.
  absl::Status WaitReady(bool ready, double seconds);
  bool SchedulerAlive();
  // Waits until any process of the group exits; returns its name and how it
  // ended ("worker 1 was killed by signal 9"). Returns early, with "", when
  // `stop` becomes true (checked every 100 ms).
  std::string WaitForExit(const std::function<bool()>& stop);
  // Stops every process: the scheduler first (it drains for
  // --shutdown-grace; when `hurry` returns true it is told again, which
  // ends the drain), then the workers; SIGKILL for any that linger.
  void Stop(const std::function<bool()>& hurry = nullptr);

 private:
  LocalCluster() = default;
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log);
  std::string Binary(const std::string& name) const;
  int32_t WorkerThreads() const;

  LocalClusterOptions options_;
  std::string dir_;
  int port_ = 0;
  int worker_port_ = 0;
  std::string worker_socket_;  // "" unless the workers dial one
  int http_port_ = 0;
  pid_t scheduler_ = -1;
  std::vector<pid_t> workers_;
};

// The value of the first sample of `name` in a Prometheus text (labels
// ignored); NotFound without one.
absl::StatusOr<double> MetricValue(const std::string& metrics_text, const std::string& name);

// The directory of this program (where the build puts every executable).
std::string ProgramDirectory();

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_CLUSTER_LOCAL_CLUSTER_H_

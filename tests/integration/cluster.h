// File: tests/integration/cluster.h
//
// Cluster: a real tandem-scheduler and its tandem-worker processes on
// 127.0.0.1 (port 0, discovered through --port-file), for integration tests.
// Every process logs to a file in the cluster's directory; the destructor
// kills whatever is still running.
#ifndef TANDEM_TESTS_INTEGRATION_CLUSTER_H_
#define TANDEM_TESTS_INTEGRATION_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::testing {

struct ClusterOptions {
  std::string model_path;
  int32_t pipeline_parallel_size = 1;
  bool async_scheduling = true;
  std::string kv_cache_memory = "64MiB";   // per worker
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;
  double step_timeout_seconds = 10;
  bool trace_steps = false;
  int32_t worker_threads = 1;
};

class Cluster {
 public:
  // Starts the scheduler and every worker and waits until the group is ready.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterOptions& options);
  ~Cluster();

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& directory() const { return dir_; }
  std::string trace_path() const { return dir_ + "/trace.jsonl"; }

  // SIGKILLs worker `rank` and reaps it.
  void KillWorker(int32_t rank);
  // Starts worker `rank` again.
  absl::Status StartWorker(int32_t rank);
  // Waits until Health says ready (or not), up to `seconds`.
  absl::Status WaitReady(bool ready, double seconds);
  bool SchedulerAlive();

 private:
  Cluster() = default;
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log);

  ClusterOptions options_;
  std::string dir_;
  int port_ = 0;
  pid_t scheduler_ = -1;
  std::vector<pid_t> workers_;
};

// Where the build put the executables.
std::string BinaryPath(const std::string& name);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_CLUSTER_H_

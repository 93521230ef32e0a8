#include "tools/cluster/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/grpc_options.h"
#include "tools/client/grpc_generate_client.h"

extern char** environ;

namespace tandem::tools {

std::string ProgramDirectory() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : exe.parent_path().string();
}

std::string LocalCluster::Binary(const std::string& name) const {
  return (options_.bin_dir.empty() ? ProgramDirectory() : options_.bin_dir) + "/" + name;
}

absl::StatusOr<pid_t> LocalCluster::Spawn(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options_.inherit_output) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  // Children start with no signals blocked, whatever this process blocks.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  // Each child in its own process group: a Ctrl-C at the terminal reaches
  // only this process, which stops the children in order (the scheduler
  // drains while its workers still run).
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": error ", error));
  return pid;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const LocalClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  if (options.directory.empty()) {
    char pattern[] = "/tmp/tandem_cluster_XXXXXX";
    if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
    c->dir_ = pattern;
  } else {
    c->dir_ = options.directory;
    std::error_code error;
    std::filesystem::create_directories(c->dir_, error);
  }
  const std::string port_file = c->dir_ + "/port";
  const std::string http_port_file = c->dir_ + "/http_port";
  scheduler::SchedulerFlags scheduler_flags = options.scheduler;
  if (options.trace_steps && scheduler_flags.trace_steps.empty()) scheduler_flags.trace_steps = c->trace_path();
  std::vector<std::string> argv = {c->Binary("tandem-scheduler"),
                                   "--host=" + options.host,
                                   absl::StrCat("--port=", options.port),
                                   "--port-file=" + port_file,
                                   "--http-host=" + options.host,
                                   absl::StrCat("--http-port=", options.http_port)};
  if (options.http_port >= 0) argv.push_back("--http-port-file=" + http_port_file);
  const std::string worker_port_file = c->dir_ + "/worker_port";
  LocalClusterOptions::WorkerLink link = options.worker_link;
  if (link == LocalClusterOptions::WorkerLink::kSocket) {
    const std::string socket = c->dir_ + "/workers.sock";
    // With TLS the workers check the scheduler's certificate against the
    // host they dial, and a socket has none ("localhost" to gRPC): a port.
    if (!scheduler_flags.tls.enabled() && rpc::CheckUnixSocketPath(socket).ok()) {
      c->worker_socket_ = socket;
      argv.push_back("--worker-socket=" + socket);
    } else {
      link = LocalClusterOptions::WorkerLink::kPort;
    }
  }
  if (link == LocalClusterOptions::WorkerLink::kPort) {
    argv.push_back("--worker-port=0");
    argv.push_back("--worker-port-file=" + worker_port_file);
  }
  for (std::string& arg : scheduler_flags.ToArgs()) argv.push_back(std::move(arg));
  for (std::string& arg : scheduler_flags.tls.ToArgs()) argv.push_back(std::move(arg));  // one set for all
  auto scheduler = c->Spawn(argv, c->dir_ + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  c->scheduler_ = *scheduler;
  const std::string logs = options.inherit_output ? "its messages above" : c->dir_ + "/scheduler.log";
  // The scheduler writes each port once it is listening; it exits if it cannot.
  auto read_port = [&](const std::string& file, const char* what, int* port) -> absl::Status {
    for (int i = 0; i < 400 && *port == 0; ++i) {
      std::ifstream(file) >> *port;
      if (*port != 0) break;
      if (!c->SchedulerAlive()) {
        c->scheduler_ = -1;
        return absl::UnavailableError(absl::StrCat("the scheduler exited before listening on its ", what, " port; see ", logs));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (*port == 0) return absl::UnavailableError(absl::StrCat("the scheduler did not report its ", what, " port; see ", logs));
    return absl::OkStatus();
  };
  if (absl::Status s = read_port(port_file, "gRPC", &c->port_); !s.ok()) return s;
  c->worker_port_ = link == LocalClusterOptions::WorkerLink::kMainPort ? c->port_ : 0;
  if (link == LocalClusterOptions::WorkerLink::kPort) {
    if (absl::Status s = read_port(worker_port_file, "workers'", &c->worker_port_); !s.ok()) return s;
  }
  if (options.http_port >= 0) {
    if (absl::Status s = read_port(http_port_file, "HTTP", &c->http_port_); !s.ok()) return s;
  }
  c->workers_.assign(options.scheduler.pipeline_parallel_size, -1);
  for (int32_t r = 0; r < options.scheduler.pipeline_parallel_size; ++r) {
    if (absl::Status s = c->StartWorker(r); !s.ok()) return s;
  }
  if (absl::Status s = c->WaitReady(true, 60); !s.ok()) return s;
  return c;
}

absl::Status LocalCluster::StartWorker(int32_t rank) {
  worker::WorkerFlags worker_flags = options_.worker;
  worker_flags.threads = WorkerThreads();
  std::vector<std::string> argv = {Binary("tandem-worker"),
                                   "--scheduler=" + worker_target(),
                                   absl::StrCat("--rank=", rank),
                                   absl::StrCat("--world-size=", options_.scheduler.pipeline_parallel_size),
                                   "--model=" + options_.scheduler.model,
                                   absl::StrCat("--block-size=", options_.scheduler.block_size)};
  for (std::string& arg : worker_flags.ToArgs()) argv.push_back(std::move(arg));
  for (std::string& arg : options_.scheduler.tls.ToArgs()) argv.push_back(std::move(arg));
  auto pid = Spawn(argv, absl::StrCat(dir_, "/worker", rank, ".log"));
  if (!pid.ok()) return pid.status();
  workers_[rank] = *pid;
  return absl::OkStatus();
}

int32_t LocalCluster::WorkerThreads() const {
  if (options_.worker.threads > 0) return static_cast<int32_t>(options_.worker.threads);
  const int32_t hardware = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max<int32_t>(1, hardware / static_cast<int32_t>(options_.scheduler.pipeline_parallel_size));
}

void LocalCluster::SignalWorker(int32_t rank, int signal) {
  if (workers_[rank] <= 0) return;
  kill(workers_[rank], signal);
  if (signal != SIGKILL) return;
  waitpid(workers_[rank], nullptr, 0);
  workers_[rank] = -1;
}

namespace {

std::string DescribeExit(const std::string& who, int status) {
  if (WIFEXITED(status)) return absl::StrCat(who, " exited with status ", WEXITSTATUS(status));
  return absl::StrCat(who, " was killed by signal ", WTERMSIG(status));
}

}  // namespace

absl::StatusOr<std::string> LocalCluster::WaitWorkerExit(int32_t rank, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (workers_[rank] > 0) {
    int status = 0;
    if (waitpid(workers_[rank], &status, WNOHANG) == workers_[rank]) {
      workers_[rank] = -1;
      return DescribeExit(absl::StrCat("worker ", rank), status);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("worker ", rank, " did not exit within ", seconds, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::StrCat("worker ", rank, " was not running");
}

std::vector<std::pair<int32_t, std::string>> LocalCluster::ReapExitedWorkers() {
  std::vector<std::pair<int32_t, std::string>> exited;
  for (size_t r = 0; r < workers_.size(); ++r) {
    int status = 0;
    if (workers_[r] > 0 && waitpid(workers_[r], &status, WNOHANG) == workers_[r]) {
      workers_[r] = -1;
      exited.emplace_back(static_cast<int32_t>(r), DescribeExit(absl::StrCat("worker ", r), status));
    }
  }
  return exited;
}

absl::StatusOr<std::string> LocalCluster::FetchMetrics() const {
  if (http_port_ <= 0) return absl::FailedPreconditionError("the cluster has no HTTP API");
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(http_port_));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return absl::UnavailableError("cannot connect to the HTTP API");
  }
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  // The body by its Content-Length (or until the server closes).
  std::string reply;
  char buffer[8192];
  size_t want = std::string::npos;
  while (reply.size() < want) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    reply.append(buffer, static_cast<size_t>(n));
    const size_t end = reply.find("\r\n\r\n");
    const size_t length_at = reply.find("Content-Length: ");
    if (want == std::string::npos && end != std::string::npos && length_at < end) {
      want = end + 4 + std::strtoul(reply.c_str() + length_at + 16, nullptr, 10);
    }
  }
  close(fd);
  const size_t body = reply.find("\r\n\r\n");
  if (body == std::string::npos || reply.compare(0, 12, "HTTP/1.1 200") != 0 ||
      (want != std::string::npos && reply.size() < want)) {
    return absl::UnavailableError(absl::StrCat("no /metrics answer: ", reply.substr(0, 64)));
  }
  return reply.substr(body + 4);
}

absl::StatusOr<double> MetricValue(const std::string& metrics_text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    double value = 0;
    const size_t space = line.rfind(' ');
    if (absl::SimpleAtod(line.substr(space + 1), &value)) return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample of ", name));
}

std::string LocalCluster::WaitForExit(const std::function<bool()>& stop) {
  auto describe = DescribeExit;
  while (!stop()) {
    int status = 0;
    if (scheduler_ > 0 && waitpid(scheduler_, &status, WNOHANG) == scheduler_) {
      scheduler_ = -1;
      return describe("the scheduler", status);
    }
    for (size_t r = 0; r < workers_.size(); ++r) {
      if (workers_[r] > 0 && waitpid(workers_[r], &status, WNOHANG) == workers_[r]) {
        workers_[r] = -1;
        return describe(absl::StrCat("worker ", r), status);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

bool LocalCluster::SchedulerAlive() { return scheduler_ > 0 && waitpid(scheduler_, nullptr, WNOHANG) == 0; }

absl::Status LocalCluster::WaitReady(bool ready, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    auto health = tools::QueryHealth(target(), options_.scheduler.tls);
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

namespace {

// SIGTERM to each, then up to `grace` for all to exit; SIGKILL for the rest.
// When `hurry` says so, each gets a second SIGTERM (which ends a drain).
void TerminateAll(const std::vector<pid_t*>& pids, double grace_seconds, const std::function<bool()>& hurry) {
  for (pid_t* pid : pids) {
    if (*pid > 0) kill(*pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  for (pid_t* pid : pids) {
    while (*pid > 0 && std::chrono::steady_clock::now() < deadline) {
      if (waitpid(*pid, nullptr, WNOHANG) == *pid) {
        *pid = -1;  // reaped: its id may be reused, never signal it again
        break;
      }
      if (hurry && hurry()) kill(*pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (*pid > 0) {
      kill(*pid, SIGKILL);
      waitpid(*pid, nullptr, 0);
      *pid = -1;
    }
  }
}

}  // namespace

void LocalCluster::Stop(const std::function<bool()>& hurry) {
  // The scheduler first, so that it can drain while its workers still run.
  TerminateAll({&scheduler_}, options_.scheduler.shutdown_grace + 2, hurry);
  std::vector<pid_t*> workers;
  for (pid_t& pid : workers_) workers.push_back(&pid);
  TerminateAll(workers, 2, nullptr);
}

LocalCluster::~LocalCluster() {
  Stop();
  if (options_.directory.empty() && !options_.keep_directory) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace tandem::tools

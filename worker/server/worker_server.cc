#include "worker/server/worker_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"
#include "worker/server/gpu_memory.h"

namespace tandem::worker {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  if (options.fake_model) return Create(options, nullptr);
  BackendChoice choice;
  choice.backend = options.backend;
  choice.device = options.device;
  choice.threads = options.threads;
  choice.kv_cache_dtype = options.kv_cache_dtype;
  choice.enforce_eager = options.enforce_eager;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeBackend(choice));
  return Create(options, std::move(backend));
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options,
                                                                   std::unique_ptr<Backend> backend) {
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, world size ", options.world_size, ")"));
  }
  std::unique_ptr<WorkerServer> w(new WorkerServer(options));
  if (options.fake_model) return CreateFake(std::move(w));
  w->backend_ = std::move(backend);
  // A GPU's memory before anything is loaded (the KV cache's share is
  // computed from it); unavailable for a backend in host memory.
  const absl::StatusOr<DeviceMemory> at_start = DeviceMemoryOf(*w->backend_);
  TANDEM_RETURN_IF_ERROR(w->OpenModelStage());
  TANDEM_ASSIGN_OR_RETURN(w->model_, LlamaModel::Load(*w->file_, w->config_, w->backend_.get(), w->stage_));
  TANDEM_RETURN_IF_ERROR(w->SizeKvCache(at_start.ok() ? &*at_start : nullptr));
  if (options.world_size > 1 && options.comm != "tcp") {
    TANDEM_ASSIGN_OR_RETURN(w->nccl_identity_, NcclDeviceIdentity(*w->backend_));
    if (options.comm == "nccl" && w->nccl_identity_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("--comm nccl: the ", w->backend_->name(), " backend",
                                                        BuildHasNccl() ? "" : " of a build without NCCL",
                                                        " cannot use NCCL; use --comm tcp"));
    }
  }
  return w;
}

absl::Status WorkerServer::OpenModelStage() {
  TANDEM_ASSIGN_OR_RETURN(file_, gguf::OpenModelFile(options_.model_path));
  TANDEM_ASSIGN_OR_RETURN(config_, gguf::ReadLlamaConfig(*file_));
  if (options_.world_size > config_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.world_size, " pipeline stages for a model of ", config_.num_layers, " layers"));
  }
  stage_ = PipelineStage(config_.num_layers, options_.world_size, options_.rank);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::CreateFake(std::unique_ptr<WorkerServer> w) {
  const WorkerOptions& options = w->options_;
  TANDEM_RETURN_IF_ERROR(w->OpenModelStage());
  // The fake model's KV is nothing; the budget still bounds the pool, at a
  // nominal 8 bytes per cell.
  const int64_t per_block = w->KvBytesPerBlock(options);
  w->max_kv_blocks_ = static_cast<int32_t>(std::min<int64_t>(options.kv_cache_bytes / per_block, 1 << 24));
  if (w->max_kv_blocks_ < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-memory of ", options.kv_cache_bytes,
                                                   " bytes holds fewer than 2 fake KV blocks of ", per_block,
                                                   " bytes"));
  }
  return w;
}

int64_t WorkerServer::KvBytesPerBlock(const WorkerOptions& options) const {
  if (options.fake_model) return int64_t{8} * options.block_size;
  return model_->KvBytesPerBlock(options.block_size);
}

WorkerServer::~WorkerServer() = default;

namespace {

// The host memory the kernel could give us now (MemAvailable), or -1 where
// /proc/meminfo does not say.
int64_t HostMemoryAvailable() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace

absl::Status WorkerServer::SizeKvCache(const DeviceMemory* at_start) {
  const int64_t per_block = model_->KvBytesPerBlock(options_.block_size);
  int64_t budget = options_.kv_cache_bytes;
  std::string where = absl::StrCat("--kv-cache-memory of ", options_.kv_cache_bytes, " bytes");
  if (at_start != nullptr) {
    GpuMemoryPlan plan;
    plan.utilization = options_.gpu_memory_utilization;
    plan.total_bytes = at_start->total_bytes;
    plan.free_at_start = at_start->free_bytes;
    TANDEM_ASSIGN_OR_RETURN(DeviceMemory after_weights, DeviceMemoryOf(*backend_));
    plan.free_after_weights = after_weights.free_bytes;
    TANDEM_ASSIGN_OR_RETURN(plan.step_io_bytes, ProfileLargestStep(*backend_, *model_, options_.profile_tokens,
                                                                   options_.profile_rows, options_.block_size));
    TANDEM_ASSIGN_OR_RETURN(DeviceMemory after_profile, DeviceMemoryOf(*backend_));
    plan.free_after_profile = after_profile.free_bytes;
    TANDEM_ASSIGN_OR_RETURN(budget, KvCacheBytesFor(plan));
    std::fprintf(stderr, "tandem-worker %d: %s: %s; KV cache %.2f GiB\n", options_.rank,
                 DeviceName(*backend_).c_str(), plan.Describe().c_str(), budget / double(int64_t{1} << 30));
    where = plan.Describe();
  }
  if (at_start == nullptr) {
    // In host memory the cache is made resident at start (CpuBackend::
    // Allocate): more than the machine has would end in the OOM killer
    // rather than in a message.
    const int64_t available = HostMemoryAvailable();
    if (available >= 0 && budget > available) {
      return absl::InvalidArgumentError(absl::StrCat(where, " is more than this machine's available memory (",
                                                     available, " bytes, MemAvailable in /proc/meminfo)"));
    }
  }
  max_kv_blocks_ = static_cast<int32_t>(std::min<int64_t>(budget / per_block, 1 << 24));
  if (max_kv_blocks_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " holds fewer than 2 KV blocks of ", per_block, " bytes"));
  }
  return absl::OkStatus();
}

v1::RegisterWorker WorkerServer::Registration() const {
  v1::RegisterWorker r;
  r.set_rank(options_.rank);
  r.set_world_size(options_.world_size);
  r.set_model_name(config_.name);
  r.set_num_layers(config_.num_layers);
  r.set_first_layer(stage_.first_layer);
  r.set_end_layer(stage_.end_layer);
  r.set_block_size(options_.block_size);
  r.set_kv_bytes_per_block(KvBytesPerBlock(options_));
  r.set_max_kv_blocks(max_kv_blocks_);
  r.set_backend(backend_ ? backend_->name() : "fake");
  r.set_device(backend_ ? DeviceName(*backend_) : "fake");
  r.set_incarnation(static_cast<int64_t>(std::random_device{}()));
  r.set_vocab_size(config_.vocab_size);
  return r;
}

// Run's Await re-evaluates its condition whenever mu_ is released, so the
// transport threads do not signal.
void WorkerServer::OnMessage(v1::SchedulerMessage message) {
  absl::MutexLock lock(&mu_);
  inbox_.push_back(std::move(message));
}

void WorkerServer::OnDisconnected(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  disconnected_ = true;
  disconnect_reason_ = reason;
}

absl::Status WorkerServer::Configure(const v1::ConfigureGroup& configure, SchedulerLink* link) {
  // A new epoch: whatever the group held is gone.
  runner_.reset();
  fake_.reset();
  transport_.reset();
  tcp_.reset();
  broken_ = false;
  epoch_ = configure.epoch();
  diff_.Reset();
  if (configure.block_size() != options_.block_size || configure.num_kv_blocks() > max_kv_blocks_ ||
      configure.num_kv_blocks() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("cannot hold ", configure.num_kv_blocks(), " blocks of ",
                                                   configure.block_size(), " tokens"));
  }
  if (configure.num_kv_blocks() != allocated_blocks_ && !options_.fake_model) {
    TANDEM_RETURN_IF_ERROR(model_->AllocateKvCache(configure.num_kv_blocks(), options_.block_size));
    allocated_blocks_ = configure.num_kv_blocks();
  }
  v1::WorkerMessage reply;
  v1::WorkerConfigured* configured = reply.mutable_configured();
  configured->set_epoch(epoch_);
  if (options_.world_size > 1) {
    // TCP always listens: the group falls back to it when not every rank
    // can use NCCL.
    TcpCommunicator::Options comm;
    comm.host = options_.comm_host;
    comm.port = static_cast<uint16_t>(options_.comm_port);
    comm.tls = options_.comm_tls;
    TANDEM_ASSIGN_OR_RETURN(tcp_, TcpCommunicator::Listen(options_.rank, options_.world_size, comm));
    configured->set_comm_address(tcp_->address());
    if (!nccl_identity_.empty()) {
      configured->set_device_id(nccl_identity_);
      if (options_.rank == 0) {
        // Two communicators: hidden states and sampled ids.
        TANDEM_ASSIGN_OR_RETURN(*configured->mutable_nccl_unique_id(), NewNcclUniqueIds(2));
      }
    }
  }
  link->Send(reply);
  return absl::OkStatus();
}

absl::Status WorkerServer::Connect(const v1::ConnectGroup& connect) {
  if (options_.fake_model) return ConnectFake(connect);
  if (options_.world_size > 1) {
    TANDEM_ASSIGN_OR_RETURN(
        bool nccl, ChooseNccl(options_.comm, options_.world_size,
                              {connect.device_ids().begin(), connect.device_ids().end()},
                              !connect.nccl_unique_id().empty()));
    if (nccl) {
      tcp_.reset();
      // NCCL's init waits for every rank and sets up its connections: more
      // than a peer's usual silence.
      TANDEM_ASSIGN_OR_RETURN(transport_,
                              ConnectNccl(*backend_, options_.rank, options_.world_size, connect.nccl_unique_id(),
                                          std::max(options_.peer_timeout, absl::Seconds(60))));
    } else {
      if (tcp_ == nullptr) return absl::FailedPreconditionError("connect before configure");
      TANDEM_RETURN_IF_ERROR(tcp_->Connect({connect.comm_addresses().begin(), connect.comm_addresses().end()},
                                           static_cast<uint64_t>(epoch_), options_.peer_timeout));
      transport_ = OverHostCommunicator(*backend_, std::move(tcp_));
    }
    std::fprintf(stderr, "tandem-worker %d: pipeline stages connected over %s\n", options_.rank,
                 transport_->name().c_str());
  }
  ModelRunnerOptions runner;
  runner.block_size = options_.block_size;
  runner.unseeded_rng_key = std::random_device{}();
  runner.communicator = transport_ ? transport_->hidden() : nullptr;
  runner.token_communicator = transport_ ? transport_->tokens() : nullptr;
  runner.peer_timeout = options_.peer_timeout;
  runner_ = std::make_unique<ModelRunner>(backend_.get(), model_.get(), runner);
  return absl::OkStatus();
}

absl::Status WorkerServer::ConnectFake(const v1::ConnectGroup& connect) {
  FakeStageOptions fake;
  fake.rank = options_.rank;
  fake.world_size = options_.world_size;
  fake.vocab_size = config_.vocab_size;
  fake.peer_timeout = options_.peer_timeout;
  if (options_.world_size > 1) {
    // Host memory on both ends: the TCP communicator carries it as is.
    if (tcp_ == nullptr) return absl::FailedPreconditionError("connect before configure");
    TANDEM_RETURN_IF_ERROR(tcp_->Connect({connect.comm_addresses().begin(), connect.comm_addresses().end()},
                                         static_cast<uint64_t>(epoch_), options_.peer_timeout));
    fake.communicator = tcp_.get();
  }
  fake_ = std::make_unique<FakeStageRunner>(fake);
  return absl::OkStatus();
}

void WorkerServer::Post(Outgoing outgoing) {
  absl::MutexLock lock(&out_mu_);
  outbox_.push_back(std::move(outgoing));
}

void WorkerServer::SendOrPost(SchedulerLink* link, uint64_t step_seq, v1::ModelRunnerOutput output) {
  {
    absl::MutexLock lock(&out_mu_);
    // Nothing ahead of it: sending here keeps the step order and saves the
    // hop to the output thread (scheduler/README.md §6).
    if (outbox_.empty() && !output_sending_ && failed_epoch_ != epoch_) {
      v1::WorkerMessage result;
      result.mutable_result()->set_epoch(epoch_);
      *result.mutable_result()->mutable_output() = std::move(output);
      wire::CompactResult(result.mutable_result());
      link->Send(result);
      return;
    }
  }
  Post({epoch_, step_seq, nullptr, absl::OkStatus(), std::move(output)});
}

void WorkerServer::ReportError(uint64_t step_seq, const absl::Status& status) {
  broken_ = true;
  if (step_seq == 0) {
    // The scheduler heeds errors of running groups only: say it here too.
    std::fprintf(stderr, "tandem-worker %d: epoch %lld: %s\n", options_.rank, static_cast<long long>(epoch_),
                 std::string(status.message()).c_str());
  }
  Post({epoch_, step_seq, nullptr, status, std::nullopt});
}

void WorkerServer::SendError(SchedulerLink* link, int64_t epoch, uint64_t step_seq, const absl::Status& status) {
  v1::WorkerMessage message;
  v1::WorkerError* error = message.mutable_error();
  error->set_epoch(epoch);
  error->set_step_seq(step_seq);
  error->set_message(std::string(status.message()));
  link->Send(message);
}

bool WorkerServer::StepsAllowed() {
  if (broken_ || !running()) return false;
  // A step that failed on the output thread breaks the epoch here too.
  absl::MutexLock lock(&out_mu_);
  broken_ = failed_epoch_ == epoch_;
  return !broken_;
}

void WorkerServer::ExecuteStep(const v1::SchedulerOutput& step) {
  if (!StepsAllowed()) return;
  ++steps_;
  if (absl::Status s = fake_ ? fake_->Execute(step) : runner_->Execute(step); !s.ok()) {
    ReportError(step.step_seq(), s);
  }
}

void WorkerServer::SampleStep(const v1::SampleCommand& command, SchedulerLink* link) {
  if (!StepsAllowed()) return;
  const uint64_t seq = command.step_seq();
  if (fake_ != nullptr) {
    absl::StatusOr<v1::ModelRunnerOutput> output = fake_->Sample(command);
    if (!output.ok()) {
      ReportError(seq, output.status());
      return;
    }
    SendOrPost(link, seq, *std::move(output));
    return;
  }
  if (absl::Status s = runner_->Sample(command); !s.ok()) {
    ReportError(seq, s);
    return;
  }
  // The copy of the ids may be in flight: then the output thread waits for it.
  absl::StatusOr<std::shared_ptr<StepOutput>> output = runner_->TakeOutput(seq);
  if (!output.ok()) {
    ReportError(seq, output.status());
    return;
  }
  if ((*output)->Done()) {  // the ids are on the host already (the CPU backend)
    absl::StatusOr<v1::ModelRunnerOutput> ready = (*output)->Serialize();
    if (!ready.ok()) {
      ReportError(seq, ready.status());
      return;
    }
    SendOrPost(link, seq, *std::move(ready));
    return;
  }
  Post({epoch_, seq, *std::move(output), absl::OkStatus(), std::nullopt});
}

absl::Status WorkerServer::ExpandExecute(v1::SchedulerMessage& message) {
  v1::SchedulerOutput* step = message.has_execute_and_sample() ? message.mutable_execute_and_sample()->mutable_execute()
                                                              : message.mutable_execute();
  // Every execute of the epoch goes through the state, steps this worker
  // ignores too: the diffs that follow refer to them.
  return message.has_execute_diff() ? diff_.Expand(message.execute_diff(), step) : diff_.Record(*step);
}

void WorkerServer::Process(v1::SchedulerMessage& message, SchedulerLink* link) {
  if (message.has_execute() || message.has_execute_and_sample()) {
    if (absl::Status s = ExpandExecute(message); !s.ok()) {
      const uint64_t seq = message.has_execute() ? message.execute().step_seq()
                                                 : message.execute_and_sample().execute().step_seq();
      if (StepsAllowed()) ReportError(seq, s);
      return;
    }
  }
  switch (message.kind_case()) {
    case v1::SchedulerMessage::kConfigure:
      if (absl::Status s = Configure(message.configure(), link); !s.ok()) ReportError(0, s);
      return;
    case v1::SchedulerMessage::kConnect: {
      if (message.connect().epoch() != epoch_) return;  // an older formation
      if (absl::Status s = Connect(message.connect()); !s.ok()) {
        ReportError(0, s);
        return;
      }
      v1::WorkerMessage ready;
      ready.mutable_ready()->set_epoch(epoch_);
      link->Send(ready);
      return;
    }
    case v1::SchedulerMessage::kExecute:
      ExecuteStep(message.execute());
      return;
    case v1::SchedulerMessage::kSample:
      SampleStep(message.sample(), link);
      return;
    case v1::SchedulerMessage::kExecuteAndSample:
      ExecuteStep(message.execute_and_sample().execute());
      SampleStep(message.execute_and_sample().sample(), link);
      return;
    default:
      return;
  }
}

void WorkerServer::OutputLoop(SchedulerLink* link) {
  // Waiting on the copies' events uses the device's context.
  if (absl::Status s = backend_ ? BindThreadToBackend(*backend_) : absl::OkStatus(); !s.ok()) {
    std::fprintf(stderr, "tandem-worker %d: output thread: %s\n", options_.rank, std::string(s.message()).c_str());
  }
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) { return stop_output_ || !outbox_.empty(); };
  auto next_stats = Clock::now() + std::chrono::milliseconds(500);
  for (;;) {
    if (Clock::now() >= next_stats) {
      link->Send(StatsMessage());
      next_stats = Clock::now() + std::chrono::milliseconds(500);
    }
    Outgoing item;
    {
      absl::MutexLock lock(&out_mu_);
      if (!out_mu_.AwaitWithTimeout(absl::Condition(&woken), absl::FromChrono(next_stats - Clock::now()))) continue;
      // Stopping: the scheduler is gone. What is left is dropped (a
      // StepOutput's destructor waits for its copies).
      if (stop_output_) return;
      item = std::move(outbox_.front());
      outbox_.pop_front();
      if (item.epoch == failed_epoch_) continue;  // the epoch's failure was reported once
      output_sending_ = true;  // the compute thread must not overtake it
    }
    Send(link, std::move(item));
    absl::MutexLock lock(&out_mu_);
    output_sending_ = false;
  }
}

void WorkerServer::Send(SchedulerLink* link, Outgoing item) {
  absl::StatusOr<v1::ModelRunnerOutput> output =
      item.output != nullptr ? item.output->Serialize()
      : item.ready     ? absl::StatusOr<v1::ModelRunnerOutput>(*std::move(item.ready))
                       : absl::StatusOr<v1::ModelRunnerOutput>(item.error);
  item.output.reset();
  if (!output.ok()) {
    {
      absl::MutexLock lock(&out_mu_);
      failed_epoch_ = item.epoch;
    }
    SendError(link, item.epoch, item.step_seq, output.status());
    return;
  }
  v1::WorkerMessage result;
  result.mutable_result()->set_epoch(item.epoch);
  *result.mutable_result()->mutable_output() = *std::move(output);
  wire::CompactResult(result.mutable_result());
  link->Send(result);
}

bool WorkerServer::Pop(v1::SchedulerMessage* message, std::string* gone) {
  auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return disconnected_ || !inbox_.empty(); };
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&news));
  if (disconnected_) {
    *gone = disconnect_reason_;
    return false;
  }
  *message = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

void WorkerServer::BeginWait() {
  const bool counted = running();
  absl::MutexLock lock(&stats_mu_);
  if (counted) waiting_since_ = Clock::now();
}

void WorkerServer::EndWait() {
  absl::MutexLock lock(&stats_mu_);
  if (waiting_since_) idle_seconds_ += Seconds(Clock::now() - *waiting_since_);
  waiting_since_.reset();
}

void WorkerServer::AddBusy(Clock::time_point work_start) {
  if (!running()) return;
  const double busy = Seconds(Clock::now() - work_start);
  absl::MutexLock lock(&stats_mu_);
  busy_seconds_ += busy;
  reported_steps_ = steps_;
}

v1::WorkerMessage WorkerServer::StatsMessage() {
  v1::WorkerMessage stats;
  stats.mutable_stats()->set_rank(options_.rank);
  absl::MutexLock lock(&stats_mu_);
  // The wait under way counts as far as it has gone.
  const double waiting = waiting_since_ ? Seconds(Clock::now() - *waiting_since_) : 0;
  stats.mutable_stats()->set_busy_seconds(busy_seconds_);
  stats.mutable_stats()->set_idle_seconds(idle_seconds_ + waiting);
  stats.mutable_stats()->set_steps(reported_steps_);
  return stats;
}

absl::Status WorkerServer::Run(SchedulerLink* link) {
  v1::WorkerMessage hello;
  *hello.mutable_register_() = Registration();
  link->Send(hello);
  {
    absl::MutexLock lock(&out_mu_);
    stop_output_ = false;
  }
  output_thread_ = std::thread([this, link] { OutputLoop(link); });
  for (;;) {
    v1::SchedulerMessage message;
    std::string gone;  // why the scheduler went away
    BeginWait();
    const bool got = link->pulls() ? link->Receive(&message, &gone) : Pop(&message, &gone);
    EndWait();
    if (!got) {
      {
        absl::MutexLock lock(&out_mu_);
        stop_output_ = true;
      }
      output_thread_.join();
      return absl::UnavailableError(gone);
    }
    const auto work_start = Clock::now();
    Process(message, link);
    AddBusy(work_start);
  }
}

}  // namespace tandem::worker

#include "worker/server/worker_server.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/gguf/model_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/comm/tcp_communicator.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  if (options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, world size ", options.world_size, ")"));
  }
  std::unique_ptr<WorkerServer> w(new WorkerServer(options));
  TANDEM_ASSIGN_OR_RETURN(w->file_, gguf::OpenModelFile(options.model_path));
  TANDEM_ASSIGN_OR_RETURN(w->config_, gguf::ReadLlamaConfig(*w->file_));
  if (options.world_size > w->config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(options.world_size, " pipeline stages for a model of ",
                                                   w->config_.num_layers, " layers"));
  }
  w->stage_ = PipelineStage(w->config_.num_layers, options.world_size, options.rank);
  w->backend_ = std::make_unique<CpuBackend>(options.threads);
  TANDEM_ASSIGN_OR_RETURN(w->model_, LlamaModel::Load(*w->file_, w->config_, w->backend_.get(), w->stage_));
  const int64_t per_block = w->model_->KvBytesPerBlock(options.block_size);
  w->max_kv_blocks_ = static_cast<int32_t>(std::min<int64_t>(options.kv_cache_bytes / per_block, 1 << 24));
  if (w->max_kv_blocks_ < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-memory of ", options.kv_cache_bytes,
                                                   " bytes holds fewer than 2 KV blocks of ", per_block, " bytes"));
  }
  return w;
}

WorkerServer::~WorkerServer() = default;

v1::RegisterWorker WorkerServer::Registration() const {
  v1::RegisterWorker r;
  r.set_rank(options_.rank);
  r.set_world_size(options_.world_size);
  r.set_model_name(config_.name);
  r.set_num_layers(config_.num_layers);
  r.set_first_layer(stage_.first_layer);
  r.set_end_layer(stage_.end_layer);
  r.set_block_size(options_.block_size);
  r.set_kv_bytes_per_block(model_->KvBytesPerBlock(options_.block_size));
  r.set_max_kv_blocks(max_kv_blocks_);
  r.set_backend(backend_->name());
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
  communicator_.reset();
  broken_ = false;
  epoch_ = configure.epoch();
  if (configure.block_size() != options_.block_size || configure.num_kv_blocks() > max_kv_blocks_ ||
      configure.num_kv_blocks() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("cannot hold ", configure.num_kv_blocks(), " blocks of ",
                                                   configure.block_size(), " tokens"));
  }
  if (configure.num_kv_blocks() != allocated_blocks_) {
    TANDEM_RETURN_IF_ERROR(model_->AllocateKvCache(configure.num_kv_blocks(), options_.block_size));
    allocated_blocks_ = configure.num_kv_blocks();
  }
  v1::WorkerMessage reply;
  reply.mutable_configured()->set_epoch(epoch_);
  if (options_.world_size > 1) {
    TcpCommunicator::Options comm;
    comm.host = options_.comm_host;
    TANDEM_ASSIGN_OR_RETURN(auto tcp, TcpCommunicator::Listen(options_.rank, options_.world_size, comm));
    reply.mutable_configured()->set_comm_address(tcp->address());
    communicator_ = std::move(tcp);
  }
  link->Send(reply);
  return absl::OkStatus();
}

absl::Status WorkerServer::Connect(const v1::ConnectGroup& connect, SchedulerLink* link) {
  if (connect.epoch() != epoch_) return absl::OkStatus();  // an older formation
  if (communicator_ != nullptr) {
    auto* tcp = static_cast<TcpCommunicator*>(communicator_.get());
    TANDEM_RETURN_IF_ERROR(tcp->Connect({connect.comm_addresses().begin(), connect.comm_addresses().end()},
                                        static_cast<uint64_t>(epoch_), options_.peer_timeout));
  }
  ModelRunnerOptions runner;
  runner.block_size = options_.block_size;
  runner.unseeded_rng_key = std::random_device{}();
  runner.communicator = communicator_.get();
  runner.peer_timeout = options_.peer_timeout;
  runner_ = std::make_unique<ModelRunner>(backend_.get(), model_.get(), runner);
  v1::WorkerMessage ready;
  ready.mutable_ready()->set_epoch(epoch_);
  link->Send(ready);
  return absl::OkStatus();
}

void WorkerServer::ReportError(uint64_t step_seq, const absl::Status& status, SchedulerLink* link) {
  broken_ = true;
  v1::WorkerMessage message;
  v1::WorkerError* error = message.mutable_error();
  error->set_epoch(epoch_);
  error->set_step_seq(step_seq);
  error->set_message(std::string(status.message()));
  link->Send(message);
}

void WorkerServer::Process(const v1::SchedulerMessage& message, SchedulerLink* link) {
  switch (message.kind_case()) {
    case v1::SchedulerMessage::kConfigure:
      if (absl::Status s = Configure(message.configure(), link); !s.ok()) ReportError(0, s, link);
      return;
    case v1::SchedulerMessage::kConnect:
      if (absl::Status s = Connect(message.connect(), link); !s.ok()) ReportError(0, s, link);
      return;
    case v1::SchedulerMessage::kExecute:
      if (broken_ || runner_ == nullptr) return;
      ++steps_;
      if (absl::Status s = runner_->Execute(message.execute()); !s.ok()) {
        ReportError(message.execute().step_seq(), s, link);
      }
      return;
    case v1::SchedulerMessage::kSample: {
      if (broken_ || runner_ == nullptr) return;
      const uint64_t seq = message.sample().step_seq();
      absl::Status s = runner_->Sample(message.sample());
      absl::StatusOr<v1::ModelRunnerOutput> output =
          s.ok() ? runner_->CollectOutput(seq) : absl::StatusOr<v1::ModelRunnerOutput>(s);
      if (!output.ok()) {
        ReportError(seq, output.status(), link);
        return;
      }
      v1::WorkerMessage result;
      result.mutable_result()->set_epoch(epoch_);
      *result.mutable_result()->mutable_output() = std::move(output).value();
      link->Send(result);
      return;
    }
    default:
      return;
  }
}

absl::Status WorkerServer::Run(SchedulerLink* link) {
  v1::WorkerMessage hello;
  *hello.mutable_register_() = Registration();
  link->Send(hello);
  auto next_stats = Clock::now() + std::chrono::milliseconds(500);
  auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return disconnected_ || !inbox_.empty(); };
  for (;;) {
    v1::SchedulerMessage message;
    const auto wait_start = Clock::now();
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&news), absl::FromChrono(next_stats - wait_start));
      if (disconnected_) return absl::UnavailableError(disconnect_reason_);
      if (!inbox_.empty()) {
        message = std::move(inbox_.front());
        inbox_.pop_front();
      }
    }
    const auto work_start = Clock::now();
    if (runner_ != nullptr) idle_seconds_ += Seconds(work_start - wait_start);
    if (message.kind_case() != v1::SchedulerMessage::KIND_NOT_SET) {
      Process(message, link);
      if (runner_ != nullptr) busy_seconds_ += Seconds(Clock::now() - work_start);
    }
    if (Clock::now() >= next_stats) {
      v1::WorkerMessage stats;
      stats.mutable_stats()->set_rank(options_.rank);
      stats.mutable_stats()->set_busy_seconds(busy_seconds_);
      stats.mutable_stats()->set_idle_seconds(idle_seconds_);
      stats.mutable_stats()->set_steps(steps_);
      link->Send(stats);
      next_stats = Clock::now() + std::chrono::milliseconds(500);
    }
  }
}

}  // namespace tandem::worker

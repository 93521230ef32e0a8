#include "scheduler/wire/worker_group.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/wire/step_codec.h"

namespace tandem::scheduler {
namespace {

// The usual result (wire::CompactResult: its rows are the step's `rows`, a
// bit each says whether the row sampled a token, no logprobs) decoded
// straight from the bits, without listing the rows and counts in the message
// first. False for any other shape or anything malformed: ExpandResult and
// DecodeRunnerOutput take those, and say what is wrong.
bool DecodeRowBits(const v1::StepResult& result, absl::Span<const RequestId> rows, ModelRunnerOutput* output) {
  const v1::ModelRunnerOutput& in = result.output();
  if (!result.rows_implied() || in.request_ids_size() != 0 || in.num_sampled_size() != 0 || in.logprobs_size() != 0 ||
      in.prompt_logprobs_size() != 0) {
    return false;
  }
  const std::string& bits = result.sampled_rows();
  const size_t n = rows.size();
  if (bits.size() > (n + 7) / 8) return false;
  output->sampled_offsets.assign(n + 1, 0);
  int32_t* offsets = output->sampled_offsets.data();
  int32_t sampled = 0;
  for (size_t byte = 0; byte < bits.size(); ++byte) {
    const uint32_t b = static_cast<uint8_t>(bits[byte]);
    for (size_t r = byte * 8; r < std::min(n, byte * 8 + 8); ++r) {
      sampled += static_cast<int32_t>(b >> (r % 8) & 1);
      offsets[r + 1] = sampled;
    }
  }
  for (size_t r = bits.size() * 8; r < n; ++r) offsets[r + 1] = sampled;  // past the bits: none
  if (sampled != in.sampled_token_ids_size()) return false;
  output->step_seq = in.step_seq();
  output->request_ids.assign(rows.begin(), rows.end());
  output->sampled_token_ids.assign(in.sampled_token_ids().begin(), in.sampled_token_ids().end());
  return true;
}

}  // namespace

WorkerGroup::WorkerGroup(WorkerGroupOptions options)
    : options_(std::move(options)), members_(options_.world_size) {}

void WorkerGroup::Notify() {
  if (options_.on_change) options_.on_change();
}

std::optional<int32_t> WorkerGroup::RankOf(WorkerLink* link) const {
  for (int32_t r = 0; r < static_cast<int32_t>(members_.size()); ++r) {
    if (members_[r] && members_[r]->link == link) return r;
  }
  return std::nullopt;
}

std::string WorkerGroup::CheckCompatible(const v1::RegisterWorker& info) const {
  if (info.world_size() != options_.world_size) {
    return absl::StrCat("the scheduler runs ", options_.world_size, " pipeline stages, the worker expects ",
                        info.world_size());
  }
  if (info.rank() < 0 || info.rank() >= options_.world_size) return absl::StrCat("rank ", info.rank(), " is out of range");
  if (info.block_size() != options_.block_size) {
    return absl::StrCat("block size ", info.block_size(), " differs from the scheduler's ", options_.block_size);
  }
  if (members_[info.rank()]) {
    return absl::StrCat("rank ", info.rank(), " is already served by ", members_[info.rank()]->link->peer());
  }
  for (const auto& m : members_) {
    if (!m) continue;
    if (m->info.model_name() != info.model_name() || m->info.num_layers() != info.num_layers() ||
        m->info.vocab_size() != info.vocab_size()) {
      return absl::StrCat("rank ", info.rank(), " loaded model '", info.model_name(), "' (", info.num_layers(),
                          " layers), rank ", m->info.rank(), " loaded '", m->info.model_name(), "' (",
                          m->info.num_layers(), " layers)");
    }
  }
  if (info.max_kv_blocks() < 2) return absl::StrCat("rank ", info.rank(), " has room for no KV cache");
  return "";
}

void WorkerGroup::OnMessage(WorkerLink* link, const v1::WorkerMessage& message) {
  absl::ReleasableMutexLock lock(&mu_);
  if (message.has_register_()) {
    Register(link, message.register_());
    lock.Release();
    Notify();
    return;
  }
  const std::optional<int32_t> rank = RankOf(link);
  if (!rank) return;  // not registered: nothing it says counts
  Member& member = *members_[*rank];
  switch (message.kind_case()) {
    case v1::WorkerMessage::kConfigured:
      OnConfigured(*rank, message.configured());
      break;
    case v1::WorkerMessage::kReady:
      OnReady(*rank, message.ready());
      break;
    case v1::WorkerMessage::kResult:
      if (message.result().epoch() == epoch_ && state_ == State::kReady) results_.push_back(message.result());
      // Readiness is unchanged: no Notify. The engine thread that waits for
      // this result waits in CollectOutput, which the release of mu_ wakes;
      // a Notify would take the engine's own lock once more per step.
      return;
    case v1::WorkerMessage::kError:
      // Only a running group can fail; a rank that reports the loss of a
      // peer after the group already failed adds nothing.
      if (message.error().epoch() == epoch_ && state_ == State::kReady) {
        FailLocked(absl::InternalError(absl::StrCat("worker rank ", *rank, " failed step ",
                                                    message.error().step_seq(), ": ", message.error().message())));
      }
      break;
    case v1::WorkerMessage::kStats:
      member.stats = message.stats();
      return;  // readiness is unchanged
    default:
      break;
  }
  lock.Release();
  Notify();
}

void WorkerGroup::Register(WorkerLink* link, const v1::RegisterWorker& info) {
  if (std::string error = CheckCompatible(info); !error.empty()) {
    link->Close(absl::StrCat("registration refused: ", error));
    return;
  }
  Member member;
  member.link = link;
  member.info = info;
  members_[info.rank()] = std::move(member);
  MaybeConfigure();
}

void WorkerGroup::MaybeConfigure() {
  if (state_ != State::kForming) return;
  for (const auto& m : members_) {
    if (!m) return;
  }
  int32_t blocks = members_[0]->info.max_kv_blocks();
  for (const auto& m : members_) blocks = std::min(blocks, m->info.max_kv_blocks());
  // Every stage holds the same block ids: the pool is the smallest stage's.
  pool_blocks_ = blocks;
  ++epoch_;
  failure_ = absl::OkStatus();
  results_.clear();
  held_execute_.reset();
  encoder_.Reset();
  in_flight_rows_.clear();
  state_ = State::kConfiguring;
  v1::SchedulerMessage message;
  v1::ConfigureGroup* configure = message.mutable_configure();
  configure->set_epoch(epoch_);
  configure->set_num_kv_blocks(pool_blocks_);
  configure->set_block_size(options_.block_size);
  for (auto& m : members_) m->link->Send(message);
}

void WorkerGroup::OnConfigured(int32_t rank, const v1::WorkerConfigured& configured) {
  if (state_ != State::kConfiguring || configured.epoch() != epoch_) return;
  Member& member = *members_[rank];
  member.configured_epoch = epoch_;
  member.comm_address = configured.comm_address();
  member.nccl_unique_id = configured.nccl_unique_id();
  member.device_id = configured.device_id();
  for (const auto& m : members_) {
    if (m->configured_epoch != epoch_) return;
  }
  state_ = State::kConnecting;
  v1::SchedulerMessage message;
  v1::ConnectGroup* connect = message.mutable_connect();
  connect->set_epoch(epoch_);
  for (const auto& m : members_) {
    connect->add_comm_addresses(m->comm_address);
    connect->add_device_ids(m->device_id);
  }
  connect->set_nccl_unique_id(members_[0]->nccl_unique_id);
  for (auto& m : members_) m->link->Send(message);
}

void WorkerGroup::OnReady(int32_t rank, const v1::WorkerReady& ready) {
  if (state_ != State::kConnecting || ready.epoch() != epoch_) return;
  members_[rank]->ready_epoch = epoch_;
  for (const auto& m : members_) {
    if (m->ready_epoch != epoch_) return;
  }
  state_ = State::kReady;
}

void WorkerGroup::FailLocked(absl::Status status) {
  if (failure_.ok()) failure_ = std::move(status);
  if (state_ == State::kReady) state_ = State::kBroken;
  held_execute_.reset();
}

void WorkerGroup::OnDisconnect(WorkerLink* link, const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    const std::optional<int32_t> rank = RankOf(link);
    if (!rank) return;
    members_[*rank].reset();
    const absl::Status lost =
        absl::UnavailableError(absl::StrCat("worker rank ", *rank, " (", link->peer(), ") disconnected: ", reason));
    if (state_ == State::kReady) {
      FailLocked(lost);
    } else if (state_ == State::kConfiguring || state_ == State::kConnecting) {
      state_ = State::kForming;  // formation restarts when the rank is back
    }
  }
  Notify();
}

void WorkerGroup::Reset() {
  {
    absl::MutexLock lock(&mu_);
    results_.clear();
    in_flight_rows_.clear();
    held_execute_.reset();
    failure_ = absl::OkStatus();
    state_ = State::kForming;
    MaybeConfigure();
  }
  Notify();
}

bool WorkerGroup::ready() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kReady;
}

absl::Status WorkerGroup::failure() const {
  absl::MutexLock lock(&mu_);
  return state_ == State::kBroken ? failure_ : absl::OkStatus();
}

std::string WorkerGroup::DescribeLocked() const {
  switch (state_) {
    case State::kReady:
      return absl::StrCat("ready: ", members_.size(), " worker(s), ", pool_blocks_, " KV blocks");
    case State::kBroken:
      return absl::StrCat("failed: ", failure_.message());
    case State::kConfiguring:
    case State::kConnecting:
      return absl::StrCat("configuring epoch ", epoch_);
    case State::kForming:
      break;
  }
  std::string missing;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (!members_[r]) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
  }
  return absl::StrCat("waiting for worker rank(s) ", missing, " to register");
}

int32_t WorkerGroup::pool_blocks() const {
  absl::MutexLock lock(&mu_);
  return pool_blocks_;
}

GroupStatus WorkerGroup::Status() const {
  absl::MutexLock lock(&mu_);
  GroupStatus status;
  status.ready = state_ == State::kReady;
  status.description = DescribeLocked();
  status.epoch = epoch_;
  status.pool_blocks = pool_blocks_;
  for (int32_t r = 0; r < static_cast<int32_t>(members_.size()); ++r) {
    WorkerStatus w;
    w.rank = r;
    if (members_[r]) {
      w.connected = true;
      w.peer = members_[r]->link->peer();
      w.busy_seconds = members_[r]->stats.busy_seconds();
      w.idle_seconds = members_[r]->stats.idle_seconds();
      w.steps = members_[r]->stats.steps();
      w.backend = members_[r]->info.backend();
      w.device = members_[r]->info.device();
      status.vocab_size = members_[r]->info.vocab_size();
    }
    status.workers.push_back(w);
  }
  return status;
}

absl::Status WorkerGroup::Execute(const SchedulerOutput& step) {
  v1::SchedulerMessage message;
  // What needs no diff state (new requests' prompts, new block ids) outside
  // the lock; the rows under it.
  EncodeStepWithoutRows(step, message.mutable_execute());
  absl::MutexLock lock(&mu_);
  if (state_ != State::kReady) {
    return failure_.ok() ? absl::UnavailableError(absl::StrCat("the worker group is not ready (", DescribeLocked(), ")"))
                         : failure_;
  }
  FlushLocked();
  // Under the lock: the diff must follow exactly what the ranks receive.
  if (!encoder_.EncodeRows(step, message.mutable_execute(), message.mutable_execute_diff())) {
    message.clear_execute_diff();
  }
  std::vector<RequestId> rows;
  if (!spare_rows_.empty()) {
    rows = std::move(spare_rows_.back());
    spare_rows_.pop_back();
  }
  rows.assign(encoder_.rows().begin(), encoder_.rows().end());
  in_flight_rows_.emplace_back(step.step_seq, std::move(rows));
  for (size_t r = 0; r + 1 < members_.size(); ++r) members_[r]->link->Send(message);
  held_execute_ = std::move(message);
  return absl::OkStatus();
}

void WorkerGroup::FlushLocked() {
  if (!held_execute_) return;
  if (state_ == State::kReady) members_.back()->link->SendOwned(std::move(*held_execute_));
  held_execute_.reset();
}

absl::Status WorkerGroup::Sample(StepSeq step_seq, const GrammarOutput* grammar) {
  v1::SchedulerMessage message;
  absl::MutexLock lock(&mu_);
  if (state_ != State::kReady) return failure_.ok() ? absl::UnavailableError("the worker group is not ready") : failure_;
  if (held_execute_ && held_execute_->execute().step_seq() == step_seq) {
    v1::ExecuteAndSample* both = message.mutable_execute_and_sample();
    *both->mutable_execute() = std::move(*held_execute_->mutable_execute());
    if (held_execute_->has_execute_diff()) message.mutable_execute_diff()->Swap(held_execute_->mutable_execute_diff());
    held_execute_.reset();
    EncodeSampleCommand(step_seq, grammar, both->mutable_sample());
  } else {
    FlushLocked();
    EncodeSampleCommand(step_seq, grammar, message.mutable_sample());
  }
  members_.back()->link->SendOwned(std::move(message));  // only the last stage samples
  return absl::OkStatus();
}

absl::StatusOr<ModelRunnerOutput> WorkerGroup::CollectOutput(StepSeq step_seq) {
  absl::MutexLock lock(&mu_);
  FlushLocked();
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !failure_.ok() || !results_.empty(); };
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  bool polling = poller_ != nullptr;
  while (polling && !done() && absl::Now() < deadline) {
    // The result is read on this thread: the transport delivers it to
    // OnMessage, which takes mu_.
    mu_.Unlock();
    polling = poller_->Poll(deadline);
    mu_.Lock();
  }
  const bool arrived = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!failure_.ok()) return failure_;
  if (!arrived) {
    FailLocked(absl::DeadlineExceededError(absl::StrCat("worker rank ", members_.size() - 1, " did not answer step ",
                                                        step_seq, " within ",
                                                        absl::FormatDuration(options_.step_timeout))));
    return failure_;
  }
  v1::StepResult result = std::move(results_.front());
  results_.pop_front();
  // Results come in step order: this one answers the oldest step sent.
  std::optional<StepSeq> oldest;
  std::vector<RequestId> rows;
  if (!in_flight_rows_.empty()) {
    oldest = in_flight_rows_.front().first;
    rows = std::move(in_flight_rows_.front().second);
    in_flight_rows_.pop_front();
  }
  ModelRunnerOutput direct;
  if (oldest == result.output().step_seq() && DecodeRowBits(result, rows, &direct)) {
    spare_rows_.push_back(std::move(rows));
    return direct;
  }
  absl::Status expanded;
  if (result.rows_implied()) {
    expanded = oldest == result.output().step_seq()
                   ? wire::ExpandResult(rows, &result)
                   : absl::InvalidArgumentError(absl::StrCat("worker rank ", members_.size() - 1, " answered step ",
                                                             result.output().step_seq(),
                                                             ", which is not the oldest in flight"));
  }
  spare_rows_.push_back(std::move(rows));
  if (!expanded.ok()) return expanded;
  return DecodeRunnerOutput(result.output());
}

}  // namespace tandem::scheduler

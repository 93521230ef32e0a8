#include "scheduler/testing/fake_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling_rule.h"
#include "common/splitmix.h"

namespace tandem::scheduler {
namespace {

uint64_t Mix(uint64_t digest, uint64_t value) { return SplitMix64(digest ^ SplitMix64(value)); }

// What a computed position's KV holds: its token, its position and (through
// `context`) everything the row attended to before it.
uint64_t KvValue(uint64_t context, TokenId token, int32_t position) {
  return Mix(context, (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) | static_cast<uint32_t>(position));
}

constexpr uint64_t kContextSeed = 0x5eed5eed5eed5eedULL;

}  // namespace

FakeExecutor::FakeExecutor(FakeExecutorOptions options)
    : options_(std::move(options)),
      kv_(static_cast<size_t>(options_.num_blocks) * options_.block_size, 0) {}

TokenId FakeExecutor::RuleToken(uint64_t digest) const {
  return static_cast<TokenId>(SplitMix64(digest) % static_cast<uint64_t>(options_.vocab_size));
}

void FakeExecutor::Log(const char* what, StepSeq seq) {
  if (options_.call_log != nullptr) options_.call_log->push_back(absl::StrCat(what, " ", seq));
}

absl::StatusOr<size_t> FakeExecutor::CellIndex(const Slot& slot, int32_t position) const {
  const size_t index = static_cast<size_t>(position / options_.block_size);
  if (index >= slot.blocks.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("position ", position, " is beyond the block table (", slot.blocks.size(), " blocks)"));
  }
  const BlockId block = slot.blocks[index];
  if (block <= 0 || block >= options_.num_blocks) {
    return absl::FailedPreconditionError(absl::StrCat("position ", position, " maps to block ", block));
  }
  return static_cast<size_t>(block) * options_.block_size + position % options_.block_size;
}

absl::StatusOr<uint64_t> FakeExecutor::Forward(RequestId id, const Slot& slot, int32_t start, int32_t count,
                                               std::vector<KvWrite>* writes) {
  if (start + count > static_cast<int32_t>(slot.tokens.size())) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, ": position ", start + count - 1,
                                                      " has no token yet (scheduled before its sample)"));
  }
  // Attention over the context computed before: read through the block table.
  uint64_t digest = kContextSeed;
  for (int32_t p = 0; p < start; ++p) {
    auto cell = CellIndex(slot, p);
    if (!cell.ok()) return cell.status();
    digest = Mix(digest, kv_[*cell]);
  }
  for (int32_t p = start; p < start + count; ++p) {
    auto cell = CellIndex(slot, p);
    if (!cell.ok()) return cell.status();
    const uint64_t value = KvValue(digest, slot.tokens[p], p);
    kv_[*cell] = value;
    writes->push_back({*cell, value});
    digest = Mix(digest, value);
  }
  return digest;
}

absl::Status FakeExecutor::ApplyDiff(const SchedulerOutput& step) {
  for (RequestId id : step.finished_request_ids) slots_.erase(id);
  for (RequestId id : step.preempted_request_ids) slots_.erase(id);
  for (const NewRequestData& data : step.new_requests) {
    auto [it, inserted] = slots_.try_emplace(data.id);
    if (!inserted) return absl::FailedPreconditionError(absl::StrCat("request ", data.id, " is already live"));
    it->second.tokens = data.prompt_token_ids;
    it->second.num_prompt_tokens = static_cast<int32_t>(data.prompt_token_ids.size());
    it->second.blocks = data.block_ids;
    it->second.logprobs = data.sampling.logprobs;
  }
  const CachedRequestData& cached = step.cached;
  size_t next_resumed = 0;
  for (size_t i = 0; i < cached.size(); ++i) {
    const RequestId id = cached.request_ids[i];
    auto blocks = cached.NewBlocks(i);
    if (cached.resumed[i]) {
      const CachedRequestData::Resumed& resumed = cached.resumed_requests[next_resumed++];
      Slot& slot = slots_[id];
      slot.tokens = resumed.token_ids;
      slot.num_prompt_tokens = resumed.num_prompt_tokens;
      slot.blocks.assign(blocks.begin(), blocks.end());
      slot.logprobs = resumed.sampling.logprobs;
      continue;
    }
    auto it = slots_.find(id);
    if (it == slots_.end()) return absl::FailedPreconditionError(absl::StrCat("request ", id, " is unknown"));
    it->second.blocks.insert(it->second.blocks.end(), blocks.begin(), blocks.end());
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::Execute(const SchedulerOutput& step) {
  Log("execute", step.step_seq);
  if (absl::Status s = ApplyDiff(step); !s.ok()) return s;
  // Where each row starts: the scheduler's C before this step.
  absl::flat_hash_map<RequestId, int32_t> start;
  for (const NewRequestData& data : step.new_requests) start[data.id] = data.num_computed_tokens;
  for (size_t i = 0; i < step.cached.size(); ++i) {
    start[step.cached.request_ids[i]] = step.cached.num_computed_tokens[i];
  }
  PendingStep& pending = pending_.emplace_back();
  pending.seq = step.step_seq;
  for (const ScheduledRequest& row : step.scheduled) {
    auto slot = slots_.find(row.id);
    if (slot == slots_.end() || !start.contains(row.id)) {
      return absl::FailedPreconditionError(absl::StrCat("scheduled request ", row.id, " is unknown"));
    }
    const int32_t from = start[row.id];
    const bool samples =
        StepSamples(from, row.num_tokens, static_cast<int64_t>(slot->second.tokens.size()));
    if (samples != row.samples) {
      return absl::InternalError(absl::StrCat("request ", row.id, ": sampling rule disagrees with the scheduler"));
    }
    auto digest = Forward(row.id, slot->second, from, row.num_tokens, &pending.writes);
    if (!digest.ok()) return digest.status();
    pending.rows.push_back({row.id, samples, *digest});
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::Sample(StepSeq step_seq, const GrammarOutput* grammar) {
  Log("sample", step_seq);
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [step_seq](const PendingStep& p) { return p.seq == step_seq; });
  if (it == pending_.end() || it->sampled) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step_seq, " is not awaiting sampling"));
  }
  if (it != pending_.begin() && !std::prev(it)->sampled) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step_seq, " sampled before an older step"));
  }
  it->sampled = true;
  it->output.step_seq = step_seq;
  std::vector<TokenId> top_ids;
  std::vector<float> top;
  for (const PendingRow& row : it->rows) {
    if (!row.samples) {
      it->output.AddRow(row.id, {});
      continue;
    }
    Slot& slot = slots_[row.id];
    TokenId token = RuleToken(row.digest);
    if (grammar != nullptr) {
      auto g = std::find(grammar->request_ids.begin(), grammar->request_ids.end(), row.id);
      if (g != grammar->request_ids.end()) {
        auto mask = grammar->Row(static_cast<size_t>(g - grammar->request_ids.begin()));
        // First allowed id at or after the rule's choice, wrapping around.
        for (int32_t k = 0; k < options_.vocab_size; ++k) {
          const TokenId t = (token + k) % options_.vocab_size;
          if (mask[t / 32] & (1u << (t % 32))) {
            token = t;
            break;
          }
        }
      }
    }
    const int32_t output_index = static_cast<int32_t>(slot.tokens.size()) - slot.num_prompt_tokens + 1;
    if (options_.force_token) {
      if (std::optional<TokenId> forced = options_.force_token(row.id, output_index)) token = *forced;
    }
    if (options_.sample_log != nullptr) {
      options_.sample_log->push_back({row.id, static_cast<int32_t>(slot.tokens.size()), token});
    }
    slot.tokens.push_back(token);
    it->output.AddRow(row.id, {token});
    if (slot.logprobs >= 0) {
      const float logprob = -static_cast<float>(SplitMix64(row.digest) % 1000) / 100.0f;
      top_ids.clear();
      top.clear();
      for (int32_t i = 0; i < slot.logprobs; ++i) {
        top_ids.push_back(i == 0 ? token : (token + i) % options_.vocab_size);
        top.push_back(logprob - static_cast<float>(i));
      }
      it->output.AddLogprob(logprob, top_ids, top);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelRunnerOutput> FakeExecutor::CollectOutput(StepSeq step_seq) {
  Log("collect", step_seq);
  if (pending_.empty() || pending_.front().seq != step_seq || !pending_.front().sampled) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step_seq, " has no output to collect"));
  }
  // The step's KV writes land again now: with correct fences no other
  // request has been given these slots while the step was in flight.
  for (const KvWrite& w : pending_.front().writes) kv_[w.cell] = w.value;
  ModelRunnerOutput output = std::move(pending_.front().output);
  pending_.pop_front();
  return output;
}

}  // namespace tandem::scheduler

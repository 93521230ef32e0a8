#include "worker/server/fake_stage_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling_rule.h"
#include "common/splitmix.h"
#include "common/status_macros.h"

namespace tandem::worker {
namespace {

constexpr uint64_t kContextSeed = 0x5eed5eed5eed5eedULL;

uint64_t Extend(uint64_t digest, int32_t token, int32_t position) {
  const uint64_t value = (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) | static_cast<uint32_t>(position);
  return SplitMix64(digest ^ SplitMix64(value));
}

absl::Status Mismatch(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat("fake model: ", what));
}

}  // namespace

std::vector<int32_t> FakeStageRunner::Tokens(int64_t id) const {
  auto it = index_.find(id);
  return it == index_.end() ? std::vector<int32_t>() : slab_[it->second].tokens;
}

FakeStageRunner::Slot* FakeStageRunner::Find(int64_t id) {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : &slab_[it->second];
}

FakeStageRunner::Slot* FakeStageRunner::Live(const Row& row) {
  Slot& slot = slab_[row.slot];
  return slot.generation == row.generation ? &slot : nullptr;
}

void FakeStageRunner::EraseSlot(int64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  slab_[it->second].generation = 0;
  free_slots_.push_back(it->second);
  index_.erase(it);
}

absl::Status FakeStageRunner::AddSlot(int64_t id, const int32_t* tokens, int32_t size, int32_t num_prompt,
                                      int32_t computed, int32_t logprobs) {
  if (size < 1 || num_prompt < 1 || num_prompt > size || computed < 0 || computed >= size) {
    return Mismatch(absl::StrCat("request ", id, " arrives with inconsistent token counts"));
  }
  auto [it, added] = index_.try_emplace(id, 0);
  if (added) {
    if (free_slots_.empty()) {
      it->second = static_cast<uint32_t>(slab_.size());
      slab_.emplace_back();
    } else {
      it->second = free_slots_.back();
      free_slots_.pop_back();
    }
  }
  Slot& slot = slab_[it->second];
  slot = Slot();
  slot.generation = next_generation_++;
  slot.id = id;
  slot.tokens.assign(tokens, tokens + size);
  slot.num_prompt = num_prompt;
  slot.total_len = size;
  slot.num_computed = computed;
  slot.logprobs = logprobs;
  slot.digest = kContextSeed;
  for (int32_t p = 0; p < computed; ++p) slot.digest = Extend(slot.digest, slot.tokens[p], p);
  return absl::OkStatus();
}

uint32_t FakeStageRunner::FindCached(int64_t id, uint32_t i, size_t* cursor) {
  uint32_t index = kNoSlot;
  if (*cursor < last_cached_slots_.size()) {
    const uint32_t guess = last_cached_slots_[*cursor];
    if (guess < slab_.size() && slab_[guess].generation != 0 && slab_[guess].id == id) index = guess;
  }
  if (index == kNoSlot) {
    auto it = index_.find(id);
    if (it == index_.end()) return kNoSlot;
    index = it->second;
  }
  // The next entry is guessed to be the one that followed this one last
  // time (after a miss too: rows that left or joined shift the rest).
  Slot& slot = slab_[index];
  *cursor = slot.entry + 1;
  slot.entry = i;
  return index;
}

absl::Status FakeStageRunner::ApplyDiff(const v1::SchedulerOutput& step) {
  for (int64_t id : step.finished_request_ids()) EraseSlot(id);
  for (int64_t id : step.preempted_request_ids()) EraseSlot(id);
  for (const v1::NewRequest& r : step.new_requests()) {
    if (index_.contains(r.request_id())) return Mismatch(absl::StrCat("request ", r.request_id(), " is already live"));
    TANDEM_RETURN_IF_ERROR(AddSlot(r.request_id(), r.prompt_token_ids().data(), r.prompt_token_ids_size(),
                                   r.prompt_token_ids_size(), r.num_computed_tokens(), r.sampling().logprobs()));
  }
  const v1::CachedRequests& c = step.cached_requests();
  if (c.resumed_size() != c.request_ids_size() || c.num_computed_tokens_size() != c.request_ids_size()) {
    return Mismatch("cached request lists differ in length");
  }
  int resumed = 0;
  cached_slots_.swap(last_cached_slots_);
  cached_slots_.assign(c.request_ids_size(), kNoSlot);
  size_t cursor = 0;
  for (int i = 0; i < c.request_ids_size(); ++i) {
    const int64_t id = c.request_ids(i);
    if (c.resumed(i)) {
      if (resumed >= c.resumed_token_ids_size() || resumed >= c.resumed_num_prompt_tokens_size() ||
          resumed >= c.resumed_sampling_size()) {
        return Mismatch("a resumed request without its tokens");
      }
      const auto& tokens = c.resumed_token_ids(resumed).token_ids();
      TANDEM_RETURN_IF_ERROR(AddSlot(id, tokens.data(), tokens.size(), c.resumed_num_prompt_tokens(resumed),
                                     c.num_computed_tokens(i), c.resumed_sampling(resumed).logprobs()));
      ++resumed;
      continue;
    }
    const uint32_t index = FindCached(id, static_cast<uint32_t>(i), &cursor);
    if (index == kNoSlot) return Mismatch(absl::StrCat("request ", id, " is not live on this worker"));
    cached_slots_[i] = index;
    const Slot* slot = &slab_[index];
    if (slot->num_computed != c.num_computed_tokens(i)) {
      return Mismatch(absl::StrCat("request ", id, ": the worker computed ", slot->num_computed,
                                   " tokens, the scheduler says ", c.num_computed_tokens(i)));
    }
  }
  return absl::OkStatus();
}

void FakeStageRunner::AppendToken(const Row& row, int32_t token) {
  // Null when the request ended (or was preempted and resumed) since: its
  // slot was rebuilt from the scheduler's tokens.
  if (Slot* slot = Live(row)) slot->tokens.push_back(token);
}

absl::Status FakeStageRunner::ReceiveOldestTokens() {
  if (incoming_.empty()) return Mismatch("a decode row needs a token no step samples");
  const Step& step = incoming_.front();
  token_message_.resize(2 + step.rows.size());
  TANDEM_RETURN_IF_ERROR(options_.communicator->Recv(options_.world_size - 1, token_message_.data(),
                                                     token_message_.size() * sizeof(int32_t),
                                                     options_.peer_timeout));
  const uint64_t seq = static_cast<uint32_t>(token_message_[0]) |
                       (static_cast<uint64_t>(static_cast<uint32_t>(token_message_[1])) << 32);
  if (seq != step.seq) return Mismatch(absl::StrCat("sampled ids of step ", seq, " where ", step.seq, " was due"));
  for (size_t i = 0; i < step.rows.size(); ++i) AppendToken(step.rows[i], token_message_[2 + i]);
  incoming_.pop_front();
  return absl::OkStatus();
}

absl::Status FakeStageRunner::ReceiveTokens(Slot& slot, int32_t count) {
  const uint64_t generation = slot.generation;
  while (static_cast<int32_t>(slot.tokens.size()) < slot.num_computed + count) {
    TANDEM_RETURN_IF_ERROR(ReceiveOldestTokens());
    // Receiving never frees a slot, so `slot` stays valid.
    if (slot.generation != generation) return Mismatch("a slot changed while its tokens arrived");
  }
  return absl::OkStatus();
}

absl::Status FakeStageRunner::Execute(const v1::SchedulerOutput& step) {
  TANDEM_RETURN_IF_ERROR(ApplyDiff(step));
  if (step.num_scheduled_tokens_size() != step.scheduled_request_ids_size()) {
    return Mismatch("scheduled lists differ in length");
  }
  const int rows = step.scheduled_request_ids_size();
  hidden_.resize(rows);
  if (!first_stage()) {
    TANDEM_RETURN_IF_ERROR(options_.communicator->Recv(options_.rank - 1, hidden_.data(),
                                                       hidden_.size() * sizeof(uint64_t), options_.peer_timeout));
  }
  Step done{step.step_seq(), {}};
  done.rows.reserve(rows);
  const auto& cached = step.cached_requests().request_ids();
  int next_cached = 0;
  for (int i = 0; i < rows; ++i) {
    const int64_t id = step.scheduled_request_ids(i);
    const int32_t count = step.num_scheduled_tokens(i);
    uint32_t index = kNoSlot;
    // A step schedules its cached rows in the order it lists them (new rows
    // apart), so their slots are usually the ones ApplyDiff found.
    if (next_cached < cached.size() && cached[next_cached] == id) index = cached_slots_[next_cached++];
    if (index == kNoSlot) {
      auto it = index_.find(id);
      if (it == index_.end()) return Mismatch(absl::StrCat("scheduled request ", id, " is not live"));
      index = it->second;
    }
    Slot& slot = slab_[index];
    if (count < 1 || slot.num_computed + count > slot.total_len) {
      return Mismatch(absl::StrCat("request ", id, ": ", count, " tokens scheduled, but it has ", slot.total_len));
    }
    const bool samples = StepSamples(slot.num_computed, count, slot.total_len);
    if (first_stage()) {
      if (static_cast<int32_t>(slot.tokens.size()) < slot.num_computed + count) {
        TANDEM_RETURN_IF_ERROR(ReceiveTokens(slot, count));
      }
      for (int32_t p = slot.num_computed; p < slot.num_computed + count; ++p) {
        slot.digest = Extend(slot.digest, slot.tokens[p], p);
      }
      hidden_[i] = slot.digest;
    }
    slot.num_computed += count;
    if (samples) ++slot.total_len;
    if (samples || last_stage()) done.rows.push_back({id, index, slot.generation, samples, hidden_[i]});
  }
  if (!last_stage()) {
    TANDEM_RETURN_IF_ERROR(
        options_.communicator->Send(options_.rank + 1, hidden_.data(), hidden_.size() * sizeof(uint64_t)));
    if (first_stage()) incoming_.push_back(std::move(done));
    return absl::OkStatus();
  }
  executed_.push_back(std::move(done));
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelRunnerOutput> FakeStageRunner::Sample(const v1::SampleCommand& command) {
  if (!last_stage()) return Mismatch("only the last stage samples");
  if (executed_.empty() || executed_.front().seq != command.step_seq()) {
    return Mismatch(absl::StrCat("step ", command.step_seq(), " is not the oldest awaiting sampling"));
  }
  Step step = std::move(executed_.front());
  executed_.pop_front();
  const int rows = static_cast<int>(step.rows.size());
  const v1::GrammarBitmask& grammar = command.grammar();
  const bool grammar_rows = grammar.request_ids_size() > 0 && grammar.words_per_row() > 0;
  v1::ModelRunnerOutput out;
  out.set_step_seq(step.seq);
  // Filled through their arrays: a row costs a store, not an Add's checks.
  out.mutable_request_ids()->Resize(rows, 0);
  out.mutable_num_sampled()->Resize(rows, 0);
  out.mutable_sampled_token_ids()->Reserve(rows);
  int64_t* ids = out.mutable_request_ids()->mutable_data();
  int32_t* counts = out.mutable_num_sampled()->mutable_data();
  token_message_.resize(2 + rows);
  token_message_[0] = static_cast<int32_t>(step.seq);
  token_message_[1] = static_cast<int32_t>(step.seq >> 32);
  int sampled = 0;
  bool any_logprobs = false;
  logprob_rows_.assign(rows, -1);
  for (int i = 0; i < rows; ++i) {
    const Row& row = step.rows[i];
    ids[i] = row.id;
    if (!row.samples) continue;
    counts[i] = 1;
    int32_t token = static_cast<int32_t>(SplitMix64(row.digest) % static_cast<uint64_t>(options_.vocab_size));
    if (auto g = grammar_rows ? std::find(grammar.request_ids().begin(), grammar.request_ids().end(), row.id)
                              : grammar.request_ids().end();
        g != grammar.request_ids().end()) {
      // The first allowed id at or after the rule's choice.
      const uint32_t* mask = grammar.bitmask().data() + (g - grammar.request_ids().begin()) * grammar.words_per_row();
      const int32_t limit = std::min(options_.vocab_size, grammar.words_per_row() * 32);
      for (int32_t k = 0; k < limit; ++k) {
        const int32_t t = (token + k) % limit;
        if (mask[t / 32] & (1u << (t % 32))) {
          token = t;
          break;
        }
      }
    }
    out.mutable_sampled_token_ids()->AddAlreadyReserved(token);
    token_message_[2 + sampled++] = token;
    if (first_stage()) AppendToken(row, token);
    const Slot* slot = Live(row);
    if (slot == nullptr) slot = Find(row.id);  // resumed since: the same request's setting
    if (slot != nullptr && slot->logprobs >= 0) {
      logprob_rows_[i] = slot->logprobs;
      any_logprobs = true;
    }
  }
  if (any_logprobs) {
    int next_token = 0;
    for (int i = 0; i < rows; ++i) {
      v1::TokenLogprobs* lp = out.add_logprobs();
      if (!step.rows[i].samples) continue;
      const int32_t token = out.sampled_token_ids(next_token++);
      if (logprob_rows_[i] < 0) continue;
      const float logprob = -static_cast<float>(SplitMix64(step.rows[i].digest) % 1000) / 100.0f;
      lp->add_sampled_logprobs(logprob);
      for (int32_t k = 0; k < logprob_rows_[i]; ++k) {
        lp->add_top_token_ids(k == 0 ? token : (token + k) % options_.vocab_size);
        lp->add_top_logprobs(logprob - static_cast<float>(k));
      }
    }
  }
  if (!first_stage()) {
    token_message_.resize(2 + sampled);
    TANDEM_RETURN_IF_ERROR(
        options_.communicator->Send(0, token_message_.data(), token_message_.size() * sizeof(int32_t)));
  }
  return out;
}

}  // namespace tandem::worker

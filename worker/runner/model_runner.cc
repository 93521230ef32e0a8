#include "worker/runner/model_runner.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/sampling_rule.h"
#include "common/splitmix.h"
#include "common/status_macros.h"
#include "worker/runner/prompt_logprobs.h"

namespace tandem::worker {
namespace {

absl::Status Mismatch(const std::string& what) {
  return absl::DataLossError(absl::StrCat("step does not match the worker's state: ", what));
}

bool NeedsHistory(const SamplingOptions& o) {
  return o.repetition_penalty != 1.0f || o.frequency_penalty != 0.0f || o.presence_penalty != 0.0f;
}

// Whether a word of more than one token exists: then which tokens are banned
// depends on the output so far, and sampling waits for the previous sample.
bool BadWordsNeedOutput(const std::vector<std::vector<TokenId>>& bad_words) {
  return std::any_of(bad_words.begin(), bad_words.end(), [](const auto& word) { return word.size() > 1; });
}

bool InVocab(TokenId t, int32_t vocab) { return t >= 0 && t < vocab; }

// The slot's logit_bias and bad_words from the wire, checked against the
// vocabulary (the scheduler validated them: a mismatch is a peer's bug).
absl::Status ReadLogitsFields(const v1::SamplingParams& p, int32_t vocab, std::vector<std::pair<TokenId, float>>* bias,
                              std::vector<std::vector<TokenId>>* bad_words) {
  if (p.logit_bias_token_ids_size() != p.logit_bias_values_size()) {
    return Mismatch("logit_bias ids and values differ in length");
  }
  bias->clear();
  for (int i = 0; i < p.logit_bias_token_ids_size(); ++i) {
    const TokenId t = p.logit_bias_token_ids(i);
    if (!InVocab(t, vocab) || (i > 0 && t <= p.logit_bias_token_ids(i - 1))) {
      return Mismatch(absl::StrCat("logit_bias token ", t, " is out of order or outside the vocabulary"));
    }
    bias->emplace_back(t, p.logit_bias_values(i));
  }
  bad_words->clear();
  for (const v1::TokenList& word : p.bad_words_token_ids()) {
    if (word.token_ids().empty()) return Mismatch("an empty bad word");
    for (TokenId t : word.token_ids()) {
      if (!InVocab(t, vocab)) return Mismatch(absl::StrCat("bad word token ", t, " is outside the vocabulary"));
    }
    bad_words->emplace_back(word.token_ids().begin(), word.token_ids().end());
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<TokenId, float>> StepBiases(const std::vector<std::pair<TokenId, float>>& logit_bias,
                                                  const std::vector<std::vector<TokenId>>& bad_words,
                                                  const TokenId* output, int32_t output_len) {
  std::vector<std::pair<TokenId, float>> biases = logit_bias;
  if (bad_words.empty()) return biases;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  for (const std::vector<TokenId>& word : bad_words) {
    const int32_t prefix = static_cast<int32_t>(word.size()) - 1;
    if (prefix > output_len || !std::equal(word.begin(), word.end() - 1, output + output_len - prefix)) continue;
    biases.emplace_back(word.back(), kBanned);
  }
  // A ban wins over a bias of the same token; stable_sort keeps a token's
  // logit_bias entry before its ban, so the last entry of each run is kept.
  std::stable_sort(biases.begin(), biases.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::pair<TokenId, float>> merged;
  for (const auto& entry : biases) {
    if (!merged.empty() && merged.back().first == entry.first) {
      merged.back().second = entry.second;
    } else {
      merged.push_back(entry);
    }
  }
  return merged;
}

SamplingOptions ToSamplingOptions(const v1::SamplingParams& p) {
  SamplingOptions o;
  o.temperature = p.temperature();
  o.top_p = p.top_p() > 0.0f ? p.top_p() : 1.0f;
  o.top_k = p.top_k();
  o.min_p = p.min_p();
  o.presence_penalty = p.presence_penalty();
  o.frequency_penalty = p.frequency_penalty();
  o.repetition_penalty = p.repetition_penalty() > 0.0f ? p.repetition_penalty() : 1.0f;
  o.logprobs = p.logprobs();
  return o;
}

ModelRunner::ModelRunner(Backend* backend, LlamaModel* model, ModelRunnerOptions options)
    : backend_(backend), model_(model), options_(options) {
  TANDEM_CHECK(options_.communicator != nullptr || (model->is_first_stage() && model->is_last_stage()))
      << "a pipeline stage needs a communicator";
}

ModelRunner::~ModelRunner() {
  // A copy still in flight writes into a step's buffers: they must outlive it.
  // Steps handed out own theirs (StepOutput's destructor waits).
  for (PendingStep& step : pending_) {
    for (auto& copy : step.copies) copy->Wait().IgnoreError();
  }
}

absl::Status ModelRunner::EnsureCapacity(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes, bool keep) {
  if (buffer != nullptr && buffer->size() >= bytes) return absl::OkStatus();
  const size_t grown = std::max<size_t>({bytes, 256, buffer ? 2 * buffer->size() : 0});
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> fresh, backend_->Allocate(grown));
  if (keep && buffer != nullptr) TANDEM_RETURN_IF_ERROR(backend_->CopyOnDevice(fresh->data(), buffer->data(), buffer->size()));
  buffer = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<int32_t> ModelRunner::CreateSlot(RequestId id) {
  if (index_.contains(id)) return Mismatch(absl::StrCat("request ", id, " is already live"));
  int32_t index;
  if (free_slots_.empty()) {
    index = static_cast<int32_t>(slots_.size());
    slots_.emplace_back();
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(last_sampled_, slots_.size() * sizeof(TokenId), /*keep=*/true));
  } else {
    index = free_slots_.back();
    free_slots_.pop_back();
  }
  Slot& slot = slots_[index];
  const uint32_t generation = slot.generation;
  slot = Slot();
  slot.id = id;
  slot.generation = generation;
  index_[id] = index;
  return index;
}

void ModelRunner::FreeSlot(RequestId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;  // finished before the worker saw it, or already gone
  Slot& slot = slots_[it->second];
  ++slot.generation;  // rows of steps in flight no longer resolve to it
  slot.id = -1;
  slot.tokens.clear();
  slot.blocks.clear();
  free_slots_.push_back(it->second);
  index_.erase(it);
}

absl::Status ModelRunner::SetBlocks(Slot& slot, const int32_t* ids, int32_t count, bool replace) {
  if (replace) slot.blocks.clear();
  for (int32_t i = 0; i < count; ++i) {
    if (ids[i] <= 0 || ids[i] >= model_->num_kv_blocks()) {
      return Mismatch(absl::StrCat("request ", slot.id, " was given block ", ids[i], " of a cache with ",
                                   model_->num_kv_blocks(), " blocks"));
    }
    slot.blocks.push_back(ids[i]);
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::ApplyDiff(const v1::SchedulerOutput& step) {
  for (int64_t id : step.finished_request_ids()) FreeSlot(id);
  for (int64_t id : step.preempted_request_ids()) FreeSlot(id);
  auto init = [&](int32_t index, std::vector<TokenId> tokens, int32_t num_prompt, int32_t computed,
                  const v1::SamplingParams& sampling) -> absl::Status {
    Slot& slot = slots_[index];
    if (tokens.empty() || num_prompt < 1 || num_prompt > static_cast<int32_t>(tokens.size()) || computed < 0 ||
        computed >= static_cast<int32_t>(tokens.size())) {
      return Mismatch(absl::StrCat("request ", slot.id, " arrives with inconsistent token counts"));
    }
    slot.total_len = static_cast<int32_t>(tokens.size());
    slot.tokens = std::move(tokens);
    slot.num_prompt_tokens = num_prompt;
    slot.num_computed = computed;
    slot.options = ToSamplingOptions(sampling);
    slot.prompt_logprobs = sampling.has_prompt_logprobs() ? sampling.prompt_logprobs() : -1;
    TANDEM_RETURN_IF_ERROR(
        ReadLogitsFields(sampling, model_->config().vocab_size, &slot.logit_bias, &slot.bad_words));
    slot.rng_key = sampling.has_seed() ? SplitMix64(sampling.seed()) : SplitMix64(options_.unseeded_rng_key + slot.id);
    return absl::OkStatus();
  };
  for (const v1::NewRequest& r : step.new_requests()) {
    TANDEM_ASSIGN_OR_RETURN(int32_t index, CreateSlot(r.request_id()));
    std::vector<TokenId> prompt(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    const int32_t num_prompt = static_cast<int32_t>(prompt.size());
    TANDEM_RETURN_IF_ERROR(init(index, std::move(prompt), num_prompt, r.num_computed_tokens(), r.sampling()));
    TANDEM_RETURN_IF_ERROR(SetBlocks(slots_[index], r.block_ids().data(), r.block_ids_size(), true));
  }
  const v1::CachedRequests& c = step.cached_requests();
  if (c.resumed_size() != c.request_ids_size() || c.num_computed_tokens_size() != c.request_ids_size() ||
      c.num_new_block_ids_size() != c.request_ids_size()) {
    return Mismatch("cached request lists differ in length");
  }
  int32_t block_offset = 0;
  int32_t resumed_index = 0;
  for (int i = 0; i < c.request_ids_size(); ++i) {
    const RequestId id = c.request_ids(i);
    const int32_t count = c.num_new_block_ids(i);
    if (count < 0 || block_offset + count > c.new_block_ids_size()) return Mismatch("block counts do not add up");
    const int32_t* blocks = c.new_block_ids().data() + block_offset;
    block_offset += count;
    if (c.resumed(i)) {
      if (resumed_index >= c.resumed_token_ids_size() || resumed_index >= c.resumed_sampling_size() ||
          resumed_index >= c.resumed_num_prompt_tokens_size()) {
        return Mismatch("a resumed request without its tokens");
      }
      FreeSlot(id);
      TANDEM_ASSIGN_OR_RETURN(int32_t index, CreateSlot(id));
      const auto& ids = c.resumed_token_ids(resumed_index).token_ids();
      TANDEM_RETURN_IF_ERROR(init(index, std::vector<TokenId>(ids.begin(), ids.end()),
                                  c.resumed_num_prompt_tokens(resumed_index), c.num_computed_tokens(i),
                                  c.resumed_sampling(resumed_index)));
      ++resumed_index;
      TANDEM_RETURN_IF_ERROR(SetBlocks(slots_[index], blocks, count, true));
      continue;
    }
    auto it = index_.find(id);
    if (it == index_.end()) return Mismatch(absl::StrCat("request ", id, " is not live on this worker"));
    Slot& slot = slots_[it->second];
    if (slot.num_computed != c.num_computed_tokens(i)) {
      return Mismatch(absl::StrCat("request ", id, ": the worker computed ", slot.num_computed,
                                   " tokens, the scheduler says ", c.num_computed_tokens(i)));
    }
    TANDEM_RETURN_IF_ERROR(SetBlocks(slot, blocks, count, false));
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::Execute(const v1::SchedulerOutput& step) {
  TANDEM_RETURN_IF_ERROR(AbsorbFinished());
  if (last_stage() && !pending_.empty() && !pending_.back().sampled) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step.step_seq(), " executed before step ",
                                                      pending_.back().seq, " was sampled"));
  }
  if (step.scheduled_request_ids_size() != step.num_scheduled_tokens_size()) {
    return Mismatch("scheduled lists differ in length");
  }
  TANDEM_RETURN_IF_ERROR(ApplyDiff(step));
  const int32_t block_size = options_.block_size;
  std::vector<TokenId> ids;
  std::vector<int32_t> positions, query_start{0}, seq_lens, table_start{0}, logits_rows, targets, target_slots;
  std::vector<int64_t> kv_slots;
  std::vector<BlockId> tables;
  std::vector<int32_t> prompt_rows;  // batch indices whose logits score a prompt token
  PendingStep pending;
  pending.seq = step.step_seq();
  IncomingTokens incoming{step.step_seq(), {}};
  uint64_t needed_tokens = 0;  // newest step whose sample this step's inputs need
  for (int i = 0; i < step.scheduled_request_ids_size(); ++i) {
    const RequestId id = step.scheduled_request_ids(i);
    const int32_t n = step.num_scheduled_tokens(i);
    auto it = index_.find(id);
    if (it == index_.end() || n <= 0) return Mismatch(absl::StrCat("scheduled request ", id, " is unknown or empty"));
    Slot& slot = slots_[it->second];
    const int32_t start = slot.num_computed;
    if (start + n > slot.total_len) {
      return absl::FailedPreconditionError(absl::StrCat("request ", id, ": positions up to ", start + n - 1,
                                                        " scheduled, but it has ", slot.total_len, " tokens"));
    }
    const bool samples = StepSamples(start, n, slot.total_len);
    for (int32_t p = start; p < start + n; ++p) {
      if (!first_stage()) {
        ids.push_back(0);  // later stages take hidden states, not ids
      } else if (p == slot.total_len - 1 && slot.last_sampled_valid) {
        // The token this group sampled last: filled in on the device.
        targets.push_back(static_cast<int32_t>(ids.size()));
        target_slots.push_back(it->second);
        ids.push_back(-1);
        needed_tokens = std::max(needed_tokens, slot.last_sample_step);
      } else if (p < static_cast<int32_t>(slot.tokens.size())) {
        ids.push_back(slot.tokens[p]);
      } else {
        return absl::FailedPreconditionError(absl::StrCat("request ", id, ": no token for position ", p));
      }
      if (p / block_size >= static_cast<int32_t>(slot.blocks.size())) {
        return Mismatch(absl::StrCat("request ", id, " has no block for position ", p));
      }
      positions.push_back(p);
      kv_slots.push_back(int64_t{slot.blocks[p / block_size]} * block_size + p % block_size);
      if (last_stage() && slot.prompt_logprobs >= 0 && p + 1 < slot.num_prompt_tokens) {
        // The logits here score prompt token p + 1 (prompt_logprobs.h).
        if (pending.prompt_scores.empty() || pending.prompt_scores.back().row != static_cast<int32_t>(pending.rows.size())) {
          pending.prompt_scores.push_back({static_cast<int32_t>(pending.rows.size()), p, slot.prompt_logprobs, {},
                                           static_cast<int64_t>(prompt_rows.size())});
        }
        pending.prompt_scores.back().targets.push_back(slot.tokens[p + 1]);
        prompt_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      }
    }
    query_start.push_back(static_cast<int32_t>(ids.size()));
    seq_lens.push_back(start + n);
    tables.insert(tables.end(), slot.blocks.begin(), slot.blocks.end());
    table_start.push_back(static_cast<int32_t>(tables.size()));
    int32_t logits_row = -1;
    if (samples) {
      logits_row = static_cast<int32_t>(logits_rows.size());
      logits_rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      incoming.slots.emplace_back(it->second, slot.generation);
    }
    pending.rows.push_back({id, it->second, slot.generation, samples, logits_row, slot.total_len});
    slot.num_computed += n;
    if (samples) {
      // The token exists for the group from now on; its id follows.
      ++slot.total_len;
      slot.last_sampled_valid = true;
      slot.last_sample_step = step.step_seq();
    }
  }
  if (ids.empty()) return Mismatch("a step with no tokens");
  // Prompt rows after the sampling rows: Sample reads rows [0, samplers).
  const size_t num_sampling_rows = logits_rows.size();
  logits_rows.insert(logits_rows.end(), prompt_rows.begin(), prompt_rows.end());
  if (first_stage() && !last_stage()) {
    // Also every message sent long ago, needed or not: over NCCL the last
    // stage's send completes only once received, and its staging buffers are
    // reused two messages later, so no message may wait for a step that never
    // needs it (requests that end after one token). The scheduler issues step
    // k once it has the results of step k - (P + 1) (its queue depth with P
    // stages): those steps' ids were sent before, and receiving them does not
    // wait for the last stage.
    const uint64_t depth = static_cast<uint64_t>(token_communicator()->world_size()) + 1;
    const uint64_t settled = step.step_seq() > depth ? step.step_seq() - depth : 0;
    const uint64_t through = std::max(needed_tokens, settled);
    if (through > 0) TANDEM_RETURN_IF_ERROR(ReceiveTokensThrough(through));
  }

  auto upload = [&](std::unique_ptr<DeviceBuffer>& buffer, const auto& host) -> absl::Status {
    const size_t bytes = host.size() * sizeof(host[0]);
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(buffer, bytes, false));
    return bytes == 0 ? absl::OkStatus() : backend_->Upload(*buffer, 0, host.data(), bytes);
  };
  TANDEM_RETURN_IF_ERROR(upload(input_ids_, ids));
  TANDEM_RETURN_IF_ERROR(upload(positions_, positions));
  TANDEM_RETURN_IF_ERROR(upload(kv_slots_, kv_slots));
  TANDEM_RETURN_IF_ERROR(upload(query_start_, query_start));
  TANDEM_RETURN_IF_ERROR(upload(seq_lens_, seq_lens));
  TANDEM_RETURN_IF_ERROR(upload(block_table_start_, table_start));
  TANDEM_RETURN_IF_ERROR(upload(block_tables_, tables));
  TANDEM_RETURN_IF_ERROR(upload(logits_rows_, logits_rows));
  if (first_stage() && !targets.empty()) {
    TANDEM_RETURN_IF_ERROR(upload(sub_targets_, targets));
    TANDEM_RETURN_IF_ERROR(upload(sub_slots_, target_slots));
    TANDEM_RETURN_IF_ERROR(backend_->CopyTokens({input_ids_->as<TokenId>(), sub_targets_->as<int32_t>(),
                                                 last_sampled_->as<TokenId>(), sub_slots_->as<int32_t>(),
                                                 static_cast<int32_t>(targets.size())}));
  }
  const int32_t vocab = model_->config().vocab_size;
  const size_t hidden_bytes = ids.size() * model_->config().hidden_size * sizeof(float);
  if (last_stage()) TANDEM_RETURN_IF_ERROR(EnsureCapacity(logits_, logits_rows.size() * vocab * sizeof(float), false));
  if (!first_stage()) {
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(hidden_in_, hidden_bytes, false));
    TANDEM_RETURN_IF_ERROR(options_.communicator->Recv(options_.communicator->rank() - 1, hidden_in_->data(), hidden_bytes,
                                                       options_.peer_timeout));
  }
  if (!last_stage()) TANDEM_RETURN_IF_ERROR(EnsureCapacity(hidden_out_, hidden_bytes, false));

  ForwardInputs in;
  in.input_ids = input_ids_->as<TokenId>();
  in.positions = positions_->as<int32_t>();
  in.kv_slots = kv_slots_->as<int64_t>();
  in.num_tokens = static_cast<int32_t>(ids.size());
  in.query_start = query_start_->as<int32_t>();
  in.seq_lens = seq_lens_->as<int32_t>();
  in.block_table_start = block_table_start_->as<int32_t>();
  in.block_tables = block_tables_->as<BlockId>();
  in.num_seqs = static_cast<int32_t>(seq_lens.size());
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    in.max_seq_len = std::max(in.max_seq_len, seq_lens[s]);
    in.max_query_len = std::max(in.max_query_len, query_start[s + 1] - query_start[s]);
  }
  in.logits_rows = logits_rows_->as<int32_t>();
  in.num_logits_rows = static_cast<int32_t>(logits_rows.size());
  TANDEM_RETURN_IF_ERROR(model_->Forward(in, first_stage() ? nullptr : hidden_in_->as<float>(),
                                         last_stage() ? nullptr : hidden_out_->as<float>(),
                                         last_stage() ? logits_->as<float>() : nullptr));
  if (!last_stage()) {
    TANDEM_RETURN_IF_ERROR(options_.communicator->Send(options_.communicator->rank() + 1, hidden_out_->data(), hidden_bytes));
    if (first_stage() && !incoming.slots.empty()) incoming_.push_back(std::move(incoming));
    return absl::OkStatus();
  }
  if (!prompt_rows.empty()) {
    pending.prompt_logits.resize(prompt_rows.size() * vocab);
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Event> copy,
                            backend_->DownloadAsync(logits_->as<float>() + num_sampling_rows * vocab,
                                                    pending.prompt_logits.data(),
                                                    pending.prompt_logits.size() * sizeof(float)));
    pending.copies.push_back(std::move(copy));
  }
  pending_.push_back(std::move(pending));
  return absl::OkStatus();
}

absl::Status ModelRunner::ReceiveTokensThrough(uint64_t seq) {
  while (!incoming_.empty() && incoming_.front().seq <= seq) {
    IncomingTokens& next = incoming_.front();
    const int32_t rows = static_cast<int32_t>(next.slots.size());
    const size_t bytes = sizeof(uint64_t) + rows * sizeof(TokenId);
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(token_message_, bytes, false));
    TANDEM_RETURN_IF_ERROR(token_communicator()->Recv(token_communicator()->world_size() - 1, token_message_->data(),
                                                      bytes, options_.peer_timeout));
    uint64_t got = 0;
    TANDEM_ASSIGN_OR_RETURN(auto copied, backend_->DownloadAsync(token_message_->data(), &got, sizeof(got)));
    TANDEM_RETURN_IF_ERROR(copied->Wait());
    if (got != next.seq) {
      return absl::DataLossError(absl::StrCat("expected the sampled ids of step ", next.seq, ", got step ", got));
    }
    // Rows whose request finished meanwhile are skipped: their slot may be reused.
    std::vector<int32_t> dst, src;
    for (int32_t r = 0; r < rows; ++r) {
      if (slots_[next.slots[r].first].generation != next.slots[r].second) continue;
      dst.push_back(next.slots[r].first);
      src.push_back(r);
    }
    if (!dst.empty()) {
      TANDEM_RETURN_IF_ERROR(EnsureCapacity(token_slots_, dst.size() * sizeof(int32_t), false));
      TANDEM_RETURN_IF_ERROR(EnsureCapacity(token_rows_, src.size() * sizeof(int32_t), false));
      TANDEM_RETURN_IF_ERROR(backend_->Upload(*token_slots_, 0, dst.data(), dst.size() * sizeof(int32_t)));
      TANDEM_RETURN_IF_ERROR(backend_->Upload(*token_rows_, 0, src.data(), src.size() * sizeof(int32_t)));
      const auto* tokens = reinterpret_cast<const TokenId*>(token_message_->as<char>() + sizeof(uint64_t));
      TANDEM_RETURN_IF_ERROR(backend_->CopyTokens({last_sampled_->as<TokenId>(), token_slots_->as<int32_t>(), tokens,
                                                   token_rows_->as<int32_t>(), static_cast<int32_t>(dst.size())}));
    }
    incoming_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status ModelRunner::SendTokensToFirstStage(uint64_t seq, int32_t num_rows) {
  const size_t bytes = sizeof(uint64_t) + num_rows * sizeof(TokenId);
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(token_message_, bytes, false));
  TANDEM_RETURN_IF_ERROR(backend_->Upload(*token_message_, 0, &seq, sizeof(seq)));
  TANDEM_RETURN_IF_ERROR(backend_->CopyOnDevice(token_message_->as<char>() + sizeof(uint64_t), sampled_->data(),
                                                num_rows * sizeof(TokenId)));
  return token_communicator()->Send(0, token_message_->data(), bytes);
}

absl::Status ModelRunner::Absorb(PendingStep& step) {
  if (step.absorbed) return absl::OkStatus();
  if (step.taken != nullptr) {
    TANDEM_RETURN_IF_ERROR(step.taken->Wait());
  } else {
    for (auto& copy : step.copies) TANDEM_RETURN_IF_ERROR(copy->Wait());
  }
  const std::vector<TokenId>& tokens = step.taken != nullptr ? step.taken->tokens_ : step.tokens;
  for (const Row& row : step.rows) {
    if (!row.samples) continue;
    Slot& slot = slots_[row.slot];
    if (slot.generation != row.generation) continue;  // finished or preempted meanwhile
    slot.tokens.push_back(tokens[row.logits_row]);
  }
  step.absorbed = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> ModelRunner::TryAbsorb(PendingStep& step) {
  if (step.absorbed) return true;
  if (!step.sampled) return false;
  if (step.taken != nullptr ? !step.taken->Done()
                            : !std::all_of(step.copies.begin(), step.copies.end(), [](auto& c) { return c->Done(); })) {
    return false;
  }
  TANDEM_RETURN_IF_ERROR(Absorb(step));  // returns at once: the copies are done
  return true;
}

absl::Status ModelRunner::AbsorbFinished() {
  for (PendingStep& step : pending_) {
    TANDEM_ASSIGN_OR_RETURN(bool absorbed, TryAbsorb(step));
    if (!absorbed) break;  // histories grow in step order
  }
  while (!pending_.empty() && pending_.front().taken != nullptr && pending_.front().absorbed) pending_.pop_front();
  return absl::OkStatus();
}

absl::Status ModelRunner::Sample(const v1::SampleCommand& command) {
  if (!last_stage()) return absl::FailedPreconditionError("only the last pipeline stage samples");
  auto it = std::find_if(pending_.begin(), pending_.end(), [](const PendingStep& p) { return !p.sampled; });
  if (it == pending_.end() || it->seq != command.step_seq()) {
    return absl::FailedPreconditionError(absl::StrCat("step ", command.step_seq(), " is not awaiting sampling"));
  }
  PendingStep& step = *it;
  const int32_t vocab = model_->config().vocab_size;
  const v1::GrammarBitmask& grammar = command.grammar();
  if (grammar.request_ids_size() > 0 &&
      (grammar.words_per_row() * 32 < vocab ||
       grammar.bitmask_size() != grammar.request_ids_size() * grammar.words_per_row())) {
    return Mismatch("the grammar bitmask does not cover the vocabulary");
  }
  std::vector<SampleRow> rows;
  std::vector<int32_t> row_slots;
  bool needs_history = false;
  for (const Row& row : step.rows) {
    const Slot& slot = slots_[row.slot];
    needs_history |= row.samples && (NeedsHistory(slot.options) || BadWordsNeedOutput(slot.bad_words));
  }
  if (needs_history) {
    for (auto earlier = pending_.begin(); earlier != it; ++earlier) TANDEM_RETURN_IF_ERROR(Absorb(*earlier));
  }
  // What the device reads: the rows, the histories of rows with penalties
  // (prompt then output, flattened), the mask rows of rows with a grammar
  // and the biases of rows with logit_bias or bad_words.
  std::vector<TokenId> history, bias_ids;
  std::vector<float> bias_values;
  std::vector<uint32_t> masks;
  int32_t num_penalty_rows = 0, num_mask_rows = 0;
  for (const Row& row : step.rows) {
    if (!row.samples) continue;
    const Slot& slot = slots_[row.slot];
    TANDEM_CHECK(slot.generation == row.generation) << "a slot was freed between execute and sample";
    SampleRow s;
    s.options = slot.options;
    s.rng_key = slot.rng_key;
    s.position = row.position;
    if (NeedsHistory(slot.options)) {
      s.penalty_row = num_penalty_rows++;
      s.history_start = static_cast<int64_t>(history.size());
      s.prompt_len = slot.num_prompt_tokens;
      s.output_len = static_cast<int32_t>(slot.tokens.size()) - slot.num_prompt_tokens;
      history.insert(history.end(), slot.tokens.begin(), slot.tokens.end());
    }
    if (!slot.logit_bias.empty() || !slot.bad_words.empty()) {
      const int32_t output_len = static_cast<int32_t>(slot.tokens.size()) - slot.num_prompt_tokens;
      s.bias_start = static_cast<int64_t>(bias_ids.size());
      for (const auto& [token, bias] :
           StepBiases(slot.logit_bias, slot.bad_words, slot.tokens.data() + slot.num_prompt_tokens, output_len)) {
        bias_ids.push_back(token);
        bias_values.push_back(bias);
      }
      s.bias_len = static_cast<int32_t>(bias_ids.size() - s.bias_start);
    }
    for (int g = 0; g < grammar.request_ids_size(); ++g) {
      if (grammar.request_ids(g) != row.id) continue;
      const uint32_t* words = grammar.bitmask().data() + g * grammar.words_per_row();
      s.mask_row = num_mask_rows++;
      masks.insert(masks.end(), words, words + grammar.words_per_row());
      break;
    }
    rows.push_back(s);
    row_slots.push_back(row.slot);
    step.max_top = std::max(step.max_top, slot.options.logprobs);
    step.row_logprobs.push_back(slot.options.logprobs);
  }
  step.sampled = true;
  const int32_t num_rows = static_cast<int32_t>(rows.size());
  if (num_rows == 0) {
    step.absorbed = true;
    return absl::OkStatus();
  }
  const bool with_logprobs = step.max_top >= 0;
  const int32_t max_top = std::max(0, step.max_top);
  auto upload = [&](std::unique_ptr<DeviceBuffer>& buffer, const auto& host) -> absl::Status {
    const size_t bytes = host.size() * sizeof(host[0]);
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(buffer, bytes, false));
    return bytes == 0 ? absl::OkStatus() : backend_->Upload(*buffer, 0, host.data(), bytes);
  };
  TANDEM_RETURN_IF_ERROR(upload(sample_rows_, rows));
  if (num_penalty_rows > 0) {
    TANDEM_RETURN_IF_ERROR(upload(sample_history_, history));
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(penalty_counts_, size_t{1} * num_penalty_rows * vocab * sizeof(uint32_t), false));
  }
  if (num_mask_rows > 0) TANDEM_RETURN_IF_ERROR(upload(sample_masks_, masks));
  if (!bias_ids.empty()) {
    TANDEM_RETURN_IF_ERROR(upload(sample_bias_ids_, bias_ids));
    TANDEM_RETURN_IF_ERROR(upload(sample_bias_values_, bias_values));
  }
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(sampled_, num_rows * sizeof(TokenId), false));
  TANDEM_RETURN_IF_ERROR(EnsureCapacity(sampled_slots_, num_rows * sizeof(int32_t), false));
  if (with_logprobs) {
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(logprobs_, num_rows * (1 + max_top) * sizeof(float), false));
    TANDEM_RETURN_IF_ERROR(EnsureCapacity(top_ids_, std::max(1, num_rows * max_top) * sizeof(TokenId), false));
  }
  SampleParams params;
  params.logits = logits_->as<float>();
  params.num_rows = num_rows;
  params.vocab = vocab;
  params.rows = sample_rows_->as<SampleRow>();
  if (num_penalty_rows > 0) {
    params.history = sample_history_->as<TokenId>();
    params.history_len = static_cast<int64_t>(history.size());
    params.penalty_counts = penalty_counts_->as<uint32_t>();
    params.num_penalty_rows = num_penalty_rows;
  }
  if (num_mask_rows > 0) {
    params.allowed = sample_masks_->as<uint32_t>();
    params.num_mask_rows = num_mask_rows;
    params.words_per_row = grammar.words_per_row();
  }
  if (!bias_ids.empty()) {
    params.bias_ids = sample_bias_ids_->as<TokenId>();
    params.bias_values = sample_bias_values_->as<float>();
    params.num_bias = static_cast<int64_t>(bias_ids.size());
  }
  params.tokens = sampled_->as<TokenId>();
  params.logprobs = with_logprobs ? logprobs_->as<float>() : nullptr;
  params.top_ids = with_logprobs ? top_ids_->as<TokenId>() : nullptr;
  params.max_top = max_top;
  TANDEM_RETURN_IF_ERROR(backend_->Sample(params));
  if (first_stage()) {
    // The samples stay on the device for the next step's inputs.
    TANDEM_RETURN_IF_ERROR(backend_->Upload(*sampled_slots_, 0, row_slots.data(), num_rows * sizeof(int32_t)));
    TANDEM_RETURN_IF_ERROR(backend_->CopyTokens(
        {last_sampled_->as<TokenId>(), sampled_slots_->as<int32_t>(), sampled_->as<TokenId>(), nullptr, num_rows}));
  } else {
    TANDEM_RETURN_IF_ERROR(SendTokensToFirstStage(step.seq, num_rows));  // worker to worker
  }
  step.tokens.resize(num_rows);
  if (with_logprobs) {
    step.logprobs.resize(num_rows * (1 + max_top));
    step.top_ids.resize(num_rows * max_top);
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Event> logprobs,
                            backend_->DownloadAsync(logprobs_->data(), step.logprobs.data(),
                                                    step.logprobs.size() * sizeof(float)));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Event> top_ids,
                            backend_->DownloadAsync(top_ids_->data(), step.top_ids.data(),
                                                    step.top_ids.size() * sizeof(TokenId)));
    step.copies.push_back(std::move(logprobs));
    step.copies.push_back(std::move(top_ids));
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Event> tokens,
                          backend_->DownloadAsync(sampled_->data(), step.tokens.data(), num_rows * sizeof(TokenId)));
  step.copies.push_back(std::move(tokens));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<StepOutput>> ModelRunner::TakeOutput(uint64_t step_seq) {
  auto it = std::find_if(pending_.begin(), pending_.end(), [](const PendingStep& p) { return p.taken == nullptr; });
  if (it == pending_.end() || it->seq != step_seq || !it->sampled) {
    return absl::FailedPreconditionError(absl::StrCat("step ", step_seq, " has no output to collect"));
  }
  PendingStep& step = *it;
  auto out = std::make_shared<StepOutput>();
  out->seq_ = step.seq;
  for (const Row& row : step.rows) out->rows_.push_back({row.id, row.samples ? row.logits_row : -1});
  // Moving a vector keeps its heap buffer, where the copies land.
  out->tokens_ = std::move(step.tokens);
  out->logprobs_ = std::move(step.logprobs);
  out->top_ids_ = std::move(step.top_ids);
  out->max_top_ = step.max_top;
  out->row_logprobs_ = step.row_logprobs;
  out->prompt_scores_ = std::move(step.prompt_scores);
  out->prompt_logits_ = std::move(step.prompt_logits);
  out->vocab_ = model_->config().vocab_size;
  {
    absl::MutexLock lock(&out->mu_);
    out->copies_ = std::move(step.copies);
  }
  step.taken = out;
  TANDEM_RETURN_IF_ERROR(AbsorbFinished());
  return out;
}

absl::StatusOr<v1::ModelRunnerOutput> ModelRunner::CollectOutput(uint64_t step_seq) {
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<StepOutput> out, TakeOutput(step_seq));
  absl::StatusOr<v1::ModelRunnerOutput> message = out->Serialize();
  if (!message.ok()) return message.status();
  TANDEM_RETURN_IF_ERROR(AbsorbFinished());  // the copy is done: the history is current
  return message;
}

StepOutput::~StepOutput() { Wait().IgnoreError(); }

absl::Status StepOutput::Wait() {
  absl::MutexLock lock(&mu_);
  for (auto& copy : copies_) TANDEM_RETURN_IF_ERROR(copy->Wait());
  done_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

bool StepOutput::Done() {
  if (done_.load(std::memory_order_acquire)) return true;
  if (!mu_.TryLock()) return false;  // another thread waits on the events
  // Each copy is asked (a backend may land a copy when asked), not only the last.
  bool done = true;
  for (auto& copy : copies_) done = copy->Done() && done;
  mu_.Unlock();
  if (done) done_.store(true, std::memory_order_release);
  return done;
}

absl::StatusOr<v1::ModelRunnerOutput> StepOutput::Serialize() {
  TANDEM_RETURN_IF_ERROR(Wait());
  v1::ModelRunnerOutput out;
  out.set_step_seq(seq_);
  const bool with_logprobs = max_top_ >= 0;
  for (const RowInfo& row : rows_) {
    out.add_request_ids(row.id);
    out.add_num_sampled(row.logits_row >= 0 ? 1 : 0);
    v1::TokenLogprobs* lp = with_logprobs ? out.add_logprobs() : nullptr;
    if (row.logits_row < 0) continue;
    out.add_sampled_token_ids(tokens_[row.logits_row]);
    const int32_t wanted = row_logprobs_[row.logits_row];
    if (lp == nullptr || wanted < 0) continue;
    const int32_t stride = 1 + max_top_;
    lp->add_sampled_logprobs(logprobs_[row.logits_row * stride]);
    for (int32_t i = 0; i < wanted; ++i) {
      lp->add_top_token_ids(top_ids_[row.logits_row * max_top_ + i]);
      lp->add_top_logprobs(logprobs_[row.logits_row * stride + 1 + i]);
    }
  }
  for (const PromptScores& scores : prompt_scores_) {
    ScorePrompt(prompt_logits_.data(), vocab_, scores, out.add_prompt_logprobs());
  }
  return out;
}

std::vector<TokenId> ModelRunner::HostTokens(RequestId id) const {
  auto it = index_.find(id);
  return it == index_.end() ? std::vector<TokenId>{} : slots_[it->second].tokens;
}

}  // namespace tandem::worker

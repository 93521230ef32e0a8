#include "scheduler/wire/step_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::scheduler {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed step message: ", what));
}

template <typename T>
std::vector<T> ToVector(const google::protobuf::RepeatedField<T>& field) {
  return {field.begin(), field.end()};
}

}  // namespace

void EncodeSamplingParams(const SamplingParams& p, bool structured_output, v1::SamplingParams* out) {
  out->set_temperature(p.temperature);
  out->set_top_p(p.top_p);
  out->set_top_k(p.top_k);
  out->set_min_p(p.min_p);
  out->set_presence_penalty(p.presence_penalty);
  out->set_frequency_penalty(p.frequency_penalty);
  out->set_repetition_penalty(p.repetition_penalty);
  if (p.seed) out->set_seed(*p.seed);
  out->set_max_tokens(p.max_tokens);
  out->set_min_tokens(p.min_tokens);
  out->mutable_stop_token_ids()->Add(p.stop_token_ids.begin(), p.stop_token_ids.end());
  out->set_ignore_eos(p.ignore_eos);
  if (p.eos_token_id) out->set_eos_token_id(*p.eos_token_id);
  out->set_logprobs(p.logprobs);
  out->set_structured_output(structured_output);
  for (const auto& [token, bias] : p.logit_bias) {
    out->add_logit_bias_token_ids(token);
    out->add_logit_bias_values(bias);
  }
  for (const std::vector<TokenId>& word : p.bad_words_token_ids) {
    out->add_bad_words_token_ids()->mutable_token_ids()->Add(word.begin(), word.end());
  }
  if (p.prompt_logprobs >= 0) out->set_prompt_logprobs(p.prompt_logprobs);
}

SamplingParams DecodeSamplingParams(const v1::SamplingParams& in) {
  SamplingParams p;
  p.temperature = in.temperature();
  p.top_p = in.top_p();
  p.top_k = in.top_k();
  p.min_p = in.min_p();
  p.presence_penalty = in.presence_penalty();
  p.frequency_penalty = in.frequency_penalty();
  p.repetition_penalty = in.repetition_penalty();
  if (in.has_seed()) p.seed = in.seed();
  p.max_tokens = in.max_tokens();
  p.min_tokens = in.min_tokens();
  p.stop_token_ids = ToVector(in.stop_token_ids());
  p.ignore_eos = in.ignore_eos();
  if (in.has_eos_token_id()) p.eos_token_id = in.eos_token_id();
  p.logprobs = in.logprobs();
  const int num_bias = std::min(in.logit_bias_token_ids_size(), in.logit_bias_values_size());
  for (int i = 0; i < num_bias; ++i) p.logit_bias.emplace_back(in.logit_bias_token_ids(i), in.logit_bias_values(i));
  for (const v1::TokenList& word : in.bad_words_token_ids()) p.bad_words_token_ids.push_back(ToVector(word.token_ids()));
  p.prompt_logprobs = in.has_prompt_logprobs() ? in.prompt_logprobs() : -1;
  return p;
}

void EncodeStepWithoutRows(const SchedulerOutput& step, v1::SchedulerOutput* out) {
  out->set_step_seq(step.step_seq);
  for (const NewRequestData& data : step.new_requests) {
    v1::NewRequest* r = out->add_new_requests();
    r->set_request_id(data.id);
    r->mutable_prompt_token_ids()->Add(data.prompt_token_ids.begin(), data.prompt_token_ids.end());
    EncodeSamplingParams(data.sampling, data.structured_output, r->mutable_sampling());
    r->mutable_block_ids()->Add(data.block_ids.begin(), data.block_ids.end());
    r->set_num_computed_tokens(data.num_computed_tokens);
  }
  const CachedRequestData& cached = step.cached;
  v1::CachedRequests* c = out->mutable_cached_requests();
  c->mutable_new_block_ids()->Add(cached.new_block_ids.begin(), cached.new_block_ids.end());
  for (const CachedRequestData::Resumed& resumed : cached.resumed_requests) {
    c->add_resumed_token_ids()->mutable_token_ids()->Add(resumed.token_ids.begin(), resumed.token_ids.end());
    EncodeSamplingParams(resumed.sampling, resumed.structured_output, c->add_resumed_sampling());
    c->add_resumed_num_prompt_tokens(resumed.num_prompt_tokens);
  }
  out->mutable_finished_request_ids()->Add(step.finished_request_ids.begin(), step.finished_request_ids.end());
  out->mutable_preempted_request_ids()->Add(step.preempted_request_ids.begin(), step.preempted_request_ids.end());
  out->set_has_structured_output_requests(step.has_structured_output_requests);
  out->set_pending_structured_output_tokens(step.pending_structured_output_tokens);
}

void EncodeStepRows(const SchedulerOutput& step, v1::SchedulerOutput* out) {
  const CachedRequestData& cached = step.cached;
  v1::CachedRequests* c = out->mutable_cached_requests();
  c->mutable_request_ids()->Add(cached.request_ids.begin(), cached.request_ids.end());
  // Sized once: appending a decode batch's rows one by one regrew each field
  // several times a step.
  const int num_cached = static_cast<int>(cached.size());
  c->mutable_resumed()->Reserve(num_cached);
  for (uint8_t resumed : cached.resumed) c->add_resumed(resumed != 0);
  c->mutable_num_computed_tokens()->Add(cached.num_computed_tokens.begin(), cached.num_computed_tokens.end());
  c->mutable_num_new_block_ids()->Reserve(num_cached);
  for (size_t i = 0; i < cached.size(); ++i) c->add_num_new_block_ids(static_cast<int32_t>(cached.NewBlocks(i).size()));
  out->mutable_scheduled_request_ids()->Reserve(static_cast<int>(step.scheduled.size()));
  out->mutable_num_scheduled_tokens()->Reserve(static_cast<int>(step.scheduled.size()));
  for (const ScheduledRequest& row : step.scheduled) {
    out->add_scheduled_request_ids(row.id);
    out->add_num_scheduled_tokens(row.num_tokens);
  }
}

void EncodeSchedulerOutput(const SchedulerOutput& step, v1::SchedulerOutput* out) {
  EncodeStepWithoutRows(step, out);
  EncodeStepRows(step, out);
}

absl::StatusOr<SchedulerOutput> DecodeSchedulerOutput(const v1::SchedulerOutput& in) {
  SchedulerOutput step;
  step.step_seq = in.step_seq();
  for (const v1::NewRequest& r : in.new_requests()) {
    NewRequestData& data = step.new_requests.emplace_back();
    data.id = r.request_id();
    data.prompt_token_ids = ToVector(r.prompt_token_ids());
    data.sampling = DecodeSamplingParams(r.sampling());
    data.structured_output = r.sampling().structured_output();
    data.block_ids = ToVector(r.block_ids());
    data.num_computed_tokens = r.num_computed_tokens();
    if (data.prompt_token_ids.empty()) return Malformed("a new request without prompt tokens");
    if (data.num_computed_tokens < 0 ||
        data.num_computed_tokens >= static_cast<int32_t>(data.prompt_token_ids.size())) {
      return Malformed("a new request's num_computed_tokens is outside its prompt");
    }
  }
  const v1::CachedRequests& c = in.cached_requests();
  const int n = c.request_ids_size();
  if (c.resumed_size() != n || c.num_computed_tokens_size() != n || c.num_new_block_ids_size() != n) {
    return Malformed("cached_requests lists differ in length");
  }
  CachedRequestData& cached = step.cached;
  cached.request_ids = ToVector(c.request_ids());
  cached.num_computed_tokens = ToVector(c.num_computed_tokens());
  cached.new_block_ids = ToVector(c.new_block_ids());
  int num_resumed = 0;
  int64_t offset = 0;
  for (int i = 0; i < n; ++i) {
    if (c.num_computed_tokens(i) < 0) return Malformed("negative num_computed_tokens");
    cached.resumed.push_back(c.resumed(i) ? 1 : 0);
    num_resumed += c.resumed(i) ? 1 : 0;
    if (c.num_new_block_ids(i) < 0) return Malformed("negative block count");
    offset += c.num_new_block_ids(i);
    cached.new_block_offsets.push_back(static_cast<int32_t>(offset));
  }
  if (offset != c.new_block_ids_size()) return Malformed("block counts do not add up to new_block_ids");
  if (c.resumed_token_ids_size() != num_resumed || c.resumed_sampling_size() != num_resumed ||
      c.resumed_num_prompt_tokens_size() != num_resumed) {
    return Malformed("resumed lists do not match the resumed flags");
  }
  for (int i = 0; i < num_resumed; ++i) {
    CachedRequestData::Resumed& resumed = cached.resumed_requests.emplace_back();
    resumed.token_ids = ToVector(c.resumed_token_ids(i).token_ids());
    resumed.num_prompt_tokens = c.resumed_num_prompt_tokens(i);
    if (resumed.num_prompt_tokens < 1 || resumed.num_prompt_tokens > static_cast<int32_t>(resumed.token_ids.size())) {
      return Malformed("a resumed request's prompt length is outside its token list");
    }
    resumed.sampling = DecodeSamplingParams(c.resumed_sampling(i));
    resumed.structured_output = c.resumed_sampling(i).structured_output();
  }
  if (in.scheduled_request_ids_size() != in.num_scheduled_tokens_size()) {
    return Malformed("scheduled_request_ids and num_scheduled_tokens differ in length");
  }
  for (int i = 0; i < in.scheduled_request_ids_size(); ++i) {
    if (in.num_scheduled_tokens(i) <= 0) return Malformed("a scheduled request with no tokens");
    step.scheduled.push_back({in.scheduled_request_ids(i), in.num_scheduled_tokens(i), false});
    step.total_num_scheduled_tokens += in.num_scheduled_tokens(i);
  }
  step.finished_request_ids = ToVector(in.finished_request_ids());
  step.preempted_request_ids = ToVector(in.preempted_request_ids());
  step.has_structured_output_requests = in.has_structured_output_requests();
  step.pending_structured_output_tokens = in.pending_structured_output_tokens();
  return step;
}

void EncodeSampleCommand(StepSeq step_seq, const GrammarOutput* grammar, v1::SampleCommand* out) {
  out->set_step_seq(step_seq);
  if (grammar == nullptr) return;
  v1::GrammarBitmask* g = out->mutable_grammar();
  g->mutable_request_ids()->Add(grammar->request_ids.begin(), grammar->request_ids.end());
  g->set_words_per_row(grammar->words_per_row);
  g->mutable_bitmask()->Add(grammar->bitmask.begin(), grammar->bitmask.end());
}

absl::StatusOr<GrammarOutput> DecodeGrammar(const v1::GrammarBitmask& in) {
  GrammarOutput grammar;
  grammar.request_ids = ToVector(in.request_ids());
  grammar.words_per_row = in.words_per_row();
  grammar.bitmask = ToVector(in.bitmask());
  if (grammar.words_per_row < 0 ||
      grammar.bitmask.size() != grammar.request_ids.size() * static_cast<size_t>(grammar.words_per_row)) {
    return Malformed("grammar bitmask size does not match its rows");
  }
  return grammar;
}

namespace {

void EncodePromptLogprobs(const ModelRunnerOutput& output, v1::ModelRunnerOutput* out) {
  for (const PromptLogprobsChunk& chunk : output.prompt_logprobs) {
    v1::PromptLogprobs* p = out->add_prompt_logprobs();
    p->set_row(static_cast<int32_t>(chunk.row));
    p->set_first_position(chunk.first_position);
    p->set_num_top(chunk.tokens.empty() ? 0 : static_cast<int32_t>(chunk.tokens[0].top.size()));
    for (const PromptTokenLogprob& t : chunk.tokens) {
      p->add_token_ids(t.token);
      p->add_logprobs(t.logprob);
      p->add_ranks(t.rank);
      for (const auto& [id, logprob] : t.top) {
        p->add_top_token_ids(id);
        p->add_top_logprobs(logprob);
      }
    }
  }
}

// in.prompt_logprobs into `output`, whose rows are already decoded.
absl::Status DecodePromptLogprobs(const v1::ModelRunnerOutput& in, ModelRunnerOutput* output) {
  for (const v1::PromptLogprobs& p : in.prompt_logprobs()) {
    const int n = p.token_ids_size();
    if (p.row() < 0 || p.row() >= in.request_ids_size() || p.first_position() < 0 || p.num_top() < 0 ||
        p.logprobs_size() != n || p.ranks_size() != n || p.top_token_ids_size() != int64_t{n} * p.num_top() ||
        p.top_logprobs_size() != p.top_token_ids_size()) {
      return Malformed("prompt logprobs do not add up");
    }
    PromptLogprobsChunk& chunk = output->prompt_logprobs.emplace_back();
    chunk.row = static_cast<size_t>(p.row());
    chunk.first_position = p.first_position();
    chunk.tokens.resize(n);
    for (int i = 0; i < n; ++i) {
      PromptTokenLogprob& t = chunk.tokens[i];
      t.token = p.token_ids(i);
      t.logprob = p.logprobs(i);
      t.rank = p.ranks(i);
      for (int j = i * p.num_top(); j < (i + 1) * p.num_top(); ++j) t.top.emplace_back(p.top_token_ids(j), p.top_logprobs(j));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void EncodeRunnerOutput(const ModelRunnerOutput& output, v1::ModelRunnerOutput* out) {
  out->set_step_seq(output.step_seq);
  out->mutable_request_ids()->Add(output.request_ids.begin(), output.request_ids.end());
  for (size_t i = 0; i < output.request_ids.size(); ++i) {
    out->add_num_sampled(static_cast<int32_t>(output.Sampled(i).size()));
  }
  out->mutable_sampled_token_ids()->Add(output.sampled_token_ids.begin(), output.sampled_token_ids.end());
  EncodePromptLogprobs(output, out);
  if (!output.has_logprobs()) return;
  for (size_t i = 0; i < output.request_ids.size(); ++i) {
    v1::TokenLogprobs* lp = out->add_logprobs();
    for (int32_t k = output.logprob_offsets[i]; k < output.logprob_offsets[i + 1]; ++k) {
      lp->add_sampled_logprobs(output.sampled_logprobs[k]);
      auto ids = output.TopIds(k);
      auto logprobs = output.TopLogprobs(k);
      lp->mutable_top_token_ids()->Add(ids.begin(), ids.end());
      lp->mutable_top_logprobs()->Add(logprobs.begin(), logprobs.end());
    }
  }
}

namespace {

// Decodes in.logprobs into `output`, whose rows are already decoded. Either
// no row carries logprobs, or every row has an entry: empty, or one logprob
// per sampled token and the same number of top entries after each.
absl::Status DecodeRunnerLogprobs(const v1::ModelRunnerOutput& in, ModelRunnerOutput* output) {
  if (in.logprobs_size() == 0) return absl::OkStatus();
  if (in.logprobs_size() != in.request_ids_size()) return Malformed("logprobs do not match request_ids");
  output->logprob_offsets.reserve(in.request_ids_size() + 1);
  output->logprob_offsets.push_back(0);
  output->top_offsets.push_back(0);
  for (int i = 0; i < in.request_ids_size(); ++i) {
    const v1::TokenLogprobs& lp = in.logprobs(i);
    const int n = lp.sampled_logprobs_size();
    const int num_top = lp.top_token_ids_size();
    if (n != 0 && n != in.num_sampled(i)) return Malformed("a row's logprobs do not match its sampled tokens");
    if (lp.top_logprobs_size() != num_top) return Malformed("top_token_ids and top_logprobs differ in length");
    if (n == 0 ? num_top != 0 : num_top % n != 0) return Malformed("a row's top entries do not divide among its tokens");
    const int per_token = n == 0 ? 0 : num_top / n;
    output->sampled_logprobs.insert(output->sampled_logprobs.end(), lp.sampled_logprobs().begin(),
                                    lp.sampled_logprobs().end());
    for (int k = 0; k < n; ++k) output->top_offsets.push_back(output->top_offsets.back() + per_token);
    output->top_token_ids.insert(output->top_token_ids.end(), lp.top_token_ids().begin(), lp.top_token_ids().end());
    output->top_logprobs.insert(output->top_logprobs.end(), lp.top_logprobs().begin(), lp.top_logprobs().end());
    output->logprob_offsets.push_back(static_cast<int32_t>(output->sampled_logprobs.size()));
  }
  if (output->sampled_logprobs.empty()) {  // no row that sampled asked: keep the lean form
    output->logprob_offsets.clear();
    output->top_offsets.clear();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelRunnerOutput> DecodeRunnerOutput(const v1::ModelRunnerOutput& in) {
  if (in.num_sampled_size() != in.request_ids_size()) return Malformed("num_sampled does not match request_ids");
  ModelRunnerOutput output;
  output.step_seq = in.step_seq();
  output.request_ids = ToVector(in.request_ids());
  output.sampled_token_ids = ToVector(in.sampled_token_ids());
  int64_t offset = 0;
  output.sampled_offsets.reserve(in.num_sampled_size() + 1);
  for (int32_t count : in.num_sampled()) {
    if (count < 0) return Malformed("negative sampled count");
    offset += count;
    output.sampled_offsets.push_back(static_cast<int32_t>(offset));
  }
  if (offset != in.sampled_token_ids_size()) return Malformed("sampled counts do not add up to the token list");
  if (absl::Status s = DecodeRunnerLogprobs(in, &output); !s.ok()) return s;
  if (absl::Status s = DecodePromptLogprobs(in, &output); !s.ok()) return s;
  return output;
}

}  // namespace tandem::scheduler

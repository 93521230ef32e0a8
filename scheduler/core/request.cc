#include "scheduler/core/request.h"

#include <utility>

namespace tandem::scheduler {

FinishReason FinishReasonOf(RequestStatus status) {
  switch (status) {
    case RequestStatus::kFinishedStopped:
      return FinishReason::kStop;
    case RequestStatus::kFinishedLengthCapped:
      return FinishReason::kLength;
    case RequestStatus::kFinishedAborted:
      return FinishReason::kAbort;
    case RequestStatus::kFinishedError:
      return FinishReason::kError;
    default:
      return FinishReason::kNone;
  }
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

const char* RequestStatusName(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting:
      return "WAITING";
    case RequestStatus::kRunning:
      return "RUNNING";
    case RequestStatus::kPreempted:
      return "PREEMPTED";
    case RequestStatus::kFinishedStopped:
      return "FINISHED_STOPPED";
    case RequestStatus::kFinishedLengthCapped:
      return "FINISHED_LENGTH_CAPPED";
    case RequestStatus::kFinishedAborted:
      return "FINISHED_ABORTED";
    case RequestStatus::kFinishedError:
      return "FINISHED_ERROR";
  }
  return "?";
}

Request::Request(RequestSpec spec, uint64_t arrival_seq, int32_t block_size, uint64_t hash_seed)
    : id_(spec.id),
      num_prompt_tokens_(static_cast<int32_t>(spec.prompt_token_ids.size())),
      max_tokens_(spec.sampling.max_tokens),
      min_tokens_(spec.sampling.min_tokens),
      stopping_eos_(spec.sampling.ignore_eos || !spec.sampling.eos_token_id ? -1 : *spec.sampling.eos_token_id),
      has_stop_token_ids_(!spec.sampling.stop_token_ids.empty()),
      all_token_ids_(std::move(spec.prompt_token_ids)),
      grammar_(std::move(spec.grammar)),
      block_size_(block_size),
      hash_seed_(hash_seed),
      priority_(spec.priority),
      arrival_seq_(arrival_seq),
      sampling_(std::move(spec.sampling)),
      cache_salt_(std::move(spec.cache_salt)) {
  // Room for every output up front: appends on the hot path never reallocate.
  all_token_ids_.reserve(static_cast<size_t>(num_prompt_tokens_) + max_tokens_);
  HashNewFullBlocks();
}

void Request::HashNewFullBlocks() {
  if (block_size_ == 0) return;
  const size_t full_blocks = all_token_ids_.size() / block_size_;
  while (block_hashes_.size() < full_blocks) {
    const size_t i = block_hashes_.size();
    const BlockHash parent = i == 0 ? BlockHash{hash_seed_, 0} : block_hashes_[i - 1];
    auto tokens = absl::MakeConstSpan(all_token_ids_).subspan(i * block_size_, block_size_);
    block_hashes_.push_back(HashBlockTokens(parent, tokens, i == 0 ? cache_salt_ : ""));
  }
}

}  // namespace tandem::scheduler

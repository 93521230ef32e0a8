// Prefix-cache keys: a hash chain over full KV blocks (vLLM's
// hash_block_tokens, vllm/v1/core/kv_cache_utils.py).
//   hash[0] = H(seed,      tokens[0:B],   salt)
//   hash[i] = H(hash[i-1], tokens[iB:(i+1)B])
// Chaining makes a block's key identify its whole prefix, so a lookup can stop
// at the first miss. H is XXH3-128: fast, and 128 bits keep accidental
// collisions out of reach; the seed is per deployment (EngineConfig).
#ifndef TANDEM_SCHEDULER_CORE_BLOCK_HASH_H_
#define TANDEM_SCHEDULER_CORE_BLOCK_HASH_H_

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "common/types.h"

namespace tandem::scheduler {

struct BlockHash {
  uint64_t low = 0;
  uint64_t high = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.low == b.low && a.high == b.high;
  }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.low, b.high);
  }
};

// Hash of one full block given its parent's hash (or the chain seed for block
// 0, as BlockHash{seed, 0}). `salt` is mixed into the first block only.
BlockHash HashBlockTokens(const BlockHash& parent, absl::Span<const TokenId> tokens,
                          std::string_view salt);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_CORE_BLOCK_HASH_H_

#include "scheduler/core/block_hash.h"

// The streaming state lives on the stack: it needs the static-linking API.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace tandem::scheduler {

BlockHash HashBlockTokens(const BlockHash& parent, absl::Span<const TokenId> tokens,
                          std::string_view salt) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent, sizeof(parent));
  XXH3_128bits_update(&state, tokens.data(), tokens.size() * sizeof(TokenId));
  if (!salt.empty()) {
    // Length-prefixed so that salt bytes can never alias token bytes.
    const uint64_t length = salt.size();
    XXH3_128bits_update(&state, &length, sizeof(length));
    XXH3_128bits_update(&state, salt.data(), salt.size());
  }
  const XXH128_hash_t digest = XXH3_128bits_digest(&state);
  return BlockHash{digest.low64, digest.high64};
}

}  // namespace tandem::scheduler

// SplitMix64's mixing function: a fast bijective scrambler of 64-bit keys,
// for deterministic pseudo-random draws (the sampler's keyed draws, request
// seeds, the fake executor's "model") that must not depend on call order.
#ifndef TANDEM_COMMON_SPLITMIX_H_
#define TANDEM_COMMON_SPLITMIX_H_

#include <cstdint>

namespace tandem {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

constexpr uint64_t SplitMix64(uint64_t x) {
  x += kGoldenGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_SPLITMIX_H_

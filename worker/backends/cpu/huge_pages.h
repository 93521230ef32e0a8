// Host memory in 2 MiB pages for the CPU backend's weights and KV cache.
//
// A batch-1 decode step streams about 100 MB of weights and cache; with
// 4 KiB pages that is 25,000 TLB misses a step, and this project's VMs
// (Firecracker guests) pay dearly for each: a plain AVX2 read of 256 MiB
// gets 17.6-18.1 GB/s on two threads in 4 KiB pages and 24-26 in 2 MiB ones
// (`model_bench --benchmark_filter=BM_ReadBandwidth`). Memory here is mapped
// at 2 MiB boundaries and advised MADV_HUGEPAGE, which transparent huge
// pages honour in both their "always" and "madvise" modes; where they are
// off the advice is ignored and the memory is ordinary pages.
//
// Thread-compatible: one caller at a time per arena.
#ifndef TANDEM_WORKER_BACKENDS_CPU_HUGE_PAGES_H_
#define TANDEM_WORKER_BACKENDS_CPU_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "worker/backends/backend.h"

namespace tandem::worker::cpu {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// One mapping of whole 2 MiB pages, unmapped when the last holder lets go.
class HugePageRegion {
 public:
  // nullptr if the mapping fails.
  static std::shared_ptr<HugePageRegion> Map(size_t bytes);
  ~HugePageRegion();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  HugePageRegion(void* mapping, size_t mapped, uint8_t* data, size_t size)
      : mapping_(mapping), mapped_(mapped), data_(data), size_(size) {}
  void* mapping_;
  size_t mapped_;
  uint8_t* data_;  // the first 2 MiB boundary of the mapping
  size_t size_;
};

// Buffers that live as long as the backend's weights, packed one after the
// other (64-byte aligned) into shared regions, so that small matrices share
// huge pages instead of each rounding up to one. A buffer keeps its region
// mapped, so buffers may outlive the arena.
class HugePageArena {
 public:
  // nullptr if memory cannot be mapped.
  std::unique_ptr<DeviceBuffer> Allocate(size_t bytes);
  // A buffer with a region of its own (freed with it): for large buffers
  // that do not live as long as the weights.
  static std::unique_ptr<DeviceBuffer> AllocateAlone(size_t bytes);

 private:
  static constexpr size_t kRegionBytes = size_t{32} << 20;
  std::shared_ptr<HugePageRegion> region_;
  size_t used_ = 0;
};

}  // namespace tandem::worker::cpu

#endif  // TANDEM_WORKER_BACKENDS_CPU_HUGE_PAGES_H_

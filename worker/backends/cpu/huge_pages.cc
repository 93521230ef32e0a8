#include "worker/backends/cpu/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>

namespace tandem::worker::cpu {
namespace {

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// `size` bytes of a region, which it keeps mapped.
class RegionBuffer : public DeviceBuffer {
 public:
  RegionBuffer(std::shared_ptr<HugePageRegion> region, uint8_t* data, size_t size)
      : region_(std::move(region)), data_(data), size_(size) {}
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  std::shared_ptr<HugePageRegion> region_;
  uint8_t* data_;
  size_t size_;
};

}  // namespace

std::shared_ptr<HugePageRegion> HugePageRegion::Map(size_t bytes) {
  const size_t size = RoundUp(std::max<size_t>(bytes, 1), kHugePageBytes);
  // One page more than asked, so that the region can start at a boundary.
  const size_t mapped = size + kHugePageBytes;
  void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) return nullptr;
  auto* data = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(mapping), kHugePageBytes));
  madvise(data, size, MADV_HUGEPAGE);  // a failure leaves ordinary pages, which work the same
  return std::shared_ptr<HugePageRegion>(new HugePageRegion(mapping, mapped, data, size));
}

HugePageRegion::~HugePageRegion() { munmap(mapping_, mapped_); }

std::unique_ptr<DeviceBuffer> HugePageArena::Allocate(size_t bytes) {
  const size_t need = RoundUp(std::max<size_t>(bytes, 1), 64);
  // A buffer of half a region or more gets its own: the current region's
  // rest stays for the small ones that follow.
  if (need >= kRegionBytes / 2) return AllocateAlone(bytes);
  if (region_ == nullptr || used_ + need > region_->size()) {
    region_ = HugePageRegion::Map(kRegionBytes);
    used_ = 0;
    if (region_ == nullptr) return nullptr;
  }
  auto buffer = std::make_unique<RegionBuffer>(region_, region_->data() + used_, bytes);
  used_ += need;
  return buffer;
}

std::unique_ptr<DeviceBuffer> HugePageArena::AllocateAlone(size_t bytes) {
  std::shared_ptr<HugePageRegion> region = HugePageRegion::Map(bytes);
  if (region == nullptr) return nullptr;
  uint8_t* data = region->data();
  return std::make_unique<RegionBuffer>(std::move(region), data, bytes);
}

}  // namespace tandem::worker::cpu

// HugePageArena: buffers aligned, disjoint and usable, their memory mapped
// for as long as any of them lives.
#include "worker/backends/cpu/huge_pages.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::worker::cpu {
namespace {

TEST(HugePageArenaTest, BuffersAreAlignedDisjointAndOutliveTheArena) {
  // Small buffers share a region; 20 MiB (over half a region) gets its own.
  const std::vector<size_t> sizes = {1, 100, 5000, size_t{3} << 20, 64, size_t{20} << 20, 7};
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  {
    HugePageArena arena;
    for (size_t bytes : sizes) {
      buffers.push_back(arena.Allocate(bytes));
      ASSERT_NE(buffers.back(), nullptr);
      EXPECT_EQ(buffers.back()->size(), bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers.back()->data()) % 64, 0u) << bytes;
    }
    // The first buffer of a region starts at a huge page boundary.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers[0]->data()) % kHugePageBytes, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffers[5]->data()) % kHugePageBytes, 0u);
  }
  // The arena is gone; each buffer still holds what is written to it.
  for (size_t i = 0; i < buffers.size(); ++i) std::memset(buffers[i]->data(), static_cast<int>(i + 1), sizes[i]);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto* p = buffers[i]->as<uint8_t>();
    for (size_t b = 0; b < sizes[i]; b += 4093) ASSERT_EQ(p[b], i + 1) << "buffer " << i << " byte " << b;
    ASSERT_EQ(p[sizes[i] - 1], i + 1) << "buffer " << i;
  }
}

TEST(HugePageArenaTest, AloneBufferIsZeroedAtAPageBoundary) {
  std::unique_ptr<DeviceBuffer> buffer = HugePageArena::AllocateAlone(size_t{5} << 20);
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % kHugePageBytes, 0u);
  const auto* p = buffer->as<uint8_t>();
  for (size_t b = 0; b < buffer->size(); b += 4096) ASSERT_EQ(p[b], 0) << b;
}

}  // namespace
}  // namespace tandem::worker::cpu

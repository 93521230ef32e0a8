#include "common/tokenizer/incremental_decoder.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(TakeCompleteUtf8Test, HoldsAnIncompleteTail) {
  std::string bytes = "ok \xF0\x9F";  // half of an emoji
  EXPECT_EQ(TakeCompleteUtf8(&bytes), "ok ");
  EXPECT_EQ(bytes, "\xF0\x9F");
  bytes += "\x91\x8B!";  // the rest of U+1F44B
  EXPECT_EQ(TakeCompleteUtf8(&bytes), "\xF0\x9F\x91\x8B!");
  EXPECT_TRUE(bytes.empty());
}

TEST(TakeCompleteUtf8Test, ReplacesWhatCanNeverBeValid) {
  std::string bytes = "a\xFF" "b\xC0\x80" "c\xED\xA0\x80";  // invalid byte, overlong, surrogate
  const std::string out = TakeCompleteUtf8(&bytes);
  EXPECT_EQ(out.find('\xFF'), std::string::npos);
  EXPECT_EQ(out.substr(0, 1), "a");
  EXPECT_NE(out.find("\xEF\xBF\xBD"), std::string::npos);
  EXPECT_TRUE(bytes.empty());
}

}  // namespace
}  // namespace tandem

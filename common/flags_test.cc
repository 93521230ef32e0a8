#include "common/flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct Parsed {
  int64_t tokens = 3;
  bool async = true;
  std::string name = "x";
  double temperature = 1.0;
};

FlagParser MakeParser(Parsed* p) {
  FlagParser flags("prog", "test");
  flags.AddInt("max-tokens", &p->tokens, "tokens", 1, 100);
  flags.AddBool("async-scheduling", &p->async, "async");
  flags.AddString("name", &p->name, "name");
  flags.AddDouble("temperature", &p->temperature, "t");
  return flags;
}

TEST(FlagParserTest, ParsesBothSpellingsAndNegation) {
  Parsed p;
  FlagParser flags = MakeParser(&p);
  ASSERT_TRUE(flags.Parse({"--max-tokens=7", "--name", "abc", "--no-async-scheduling",
                           "--temperature", "0.5"})
                  .ok());
  EXPECT_EQ(p.tokens, 7);
  EXPECT_EQ(p.name, "abc");
  EXPECT_FALSE(p.async);
  EXPECT_DOUBLE_EQ(p.temperature, 0.5);
}

TEST(FlagParserTest, WasSetTellsGivenFromDefault) {
  Parsed p;
  FlagParser flags = MakeParser(&p);
  ASSERT_TRUE(flags.Parse({"--max-tokens=3", "--no-async-scheduling"}).ok());
  EXPECT_TRUE(flags.WasSet("max-tokens"));  // even when given its default value
  EXPECT_TRUE(flags.WasSet("async-scheduling"));
  EXPECT_FALSE(flags.WasSet("name"));
  EXPECT_FALSE(flags.WasSet("no-such-flag"));
}

TEST(FlagParserTest, ErrorsNameTheFlag) {
  Parsed p;
  FlagParser flags = MakeParser(&p);
  absl::Status s = flags.Parse({"--max-tokens", "abc"});
  EXPECT_THAT(s.message(), HasSubstr("--max-tokens expects an integer"));
  s = MakeParser(&p).Parse({"--max-tokens=0"});
  EXPECT_THAT(s.message(), HasSubstr("--max-tokens must be in [1, 100]"));
  s = MakeParser(&p).Parse({"--bogus=1"});
  EXPECT_THAT(s.message(), HasSubstr("unknown flag --bogus"));
  s = MakeParser(&p).Parse({"--name"});
  EXPECT_THAT(s.message(), HasSubstr("--name needs a value"));
  s = MakeParser(&p).Parse({"positional"});
  EXPECT_THAT(s.message(), HasSubstr("unexpected argument"));
  EXPECT_EQ(p.tokens, 3);
}

TEST(FlagParserTest, HelpIsReported) {
  Parsed p;
  FlagParser flags = MakeParser(&p);
  ASSERT_TRUE(flags.Parse({"--help"}).ok());
  EXPECT_TRUE(flags.help_requested());
  EXPECT_THAT(flags.Usage(), HasSubstr("--max-tokens VALUE"));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(ParseByteSizeTest, UnitsAndErrors) {
  EXPECT_EQ(*ParseByteSize("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("1.5GB"), 1500000000);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("-1GiB").ok());
}

TEST(FlagParserTest, ByteSizesFormatExactlyAndReadBack) {
  for (int64_t bytes : {int64_t{1} << 30, int64_t{96} << 20, int64_t{3} << 10, int64_t{1000}, int64_t{0}}) {
    auto back = ParseByteSize(FormatByteSize(bytes));
    ASSERT_TRUE(back.ok()) << FormatByteSize(bytes);
    EXPECT_EQ(*back, bytes) << FormatByteSize(bytes);
  }
  EXPECT_EQ(FormatByteSize(int64_t{1} << 30), "1GiB");
  EXPECT_EQ(FormatByteSize((int64_t{3} << 20) + 1), "3145729");
}

TEST(FlagParserTest, UsageShowsDefaultsOnce) {
  std::string empty;
  int64_t bytes = int64_t{64} << 20;
  std::string key;
  FlagParser flags("prog", "test");
  flags.AddString("path", &empty, "a file");
  flags.AddBytes("memory", &bytes, "memory");
  flags.AddString("key", &key, "a key (default: none)");
  const std::string usage = flags.Usage();
  EXPECT_THAT(usage, HasSubstr("a file (default: none)\n"));
  EXPECT_THAT(usage, HasSubstr("memory (default: 64MiB)\n"));
  EXPECT_THAT(usage, HasSubstr("a key (default: none)\n"));
}

}  // namespace
}  // namespace tandem

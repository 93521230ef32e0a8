#include "common/file_util.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "gtest/gtest.h"

namespace tandem {
namespace {

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FileUtilTest, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemporary) {
  auto dir = std::filesystem::temp_directory_path() / "tandem_file_util_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "f").string();
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(Contents(path), "second");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const absl::Status missing = WriteFileAtomically((dir / "no" / "such" / "f").string(), "x");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot create"), std::string::npos) << missing;
  std::filesystem::remove_all(dir);
}

TEST(FileUtilTest, TemporaryFileIsRemovedByItsLastOwner) {
  std::string path;
  {
    std::optional<TemporaryFile> kept;
    {
      auto file = TemporaryFile::Create("tandem_file_util", "bytes");
      ASSERT_TRUE(file.ok()) << file.status();
      path = file->path();
      EXPECT_EQ(Contents(path), "bytes");
      auto other = TemporaryFile::Create("tandem_file_util", "other");
      ASSERT_TRUE(other.ok());
      EXPECT_NE(other->path(), path) << "two files of one process get distinct names";
      kept.emplace(std::move(*file));
    }
    EXPECT_TRUE(std::filesystem::exists(path)) << "the moved-from object must not remove it";
    EXPECT_EQ(kept->path(), path);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace tandem

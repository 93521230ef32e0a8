#include "common/file_util.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <sys/resource.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  const std::string temp = path + ".tmp";
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
  }
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !wrote) {
    const int error = wrote ? errno : write_errno;
    std::remove(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", temp, ": ", std::strerror(error)));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::UnavailableError(absl::StrCat("cannot rename ", temp, " to ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TemporaryFile> TemporaryFile::Create(std::string_view stem, std::string_view bytes) {
  static std::atomic<int> counter{0};
  std::error_code error;
  const std::filesystem::path dir = std::filesystem::temp_directory_path(error);
  if (error) return absl::UnavailableError(absl::StrCat("no temporary directory: ", error.message()));
  const std::string path =
      (dir / absl::StrCat(std::string(stem), "_", ::getpid(), "_", counter.fetch_add(1))).string();
  if (absl::Status written = WriteFileAtomically(path, bytes); !written.ok()) return written;
  return TemporaryFile(path);
}

TemporaryFile::~TemporaryFile() {
  if (!path_.empty()) std::remove(path_.c_str());
}

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace tandem

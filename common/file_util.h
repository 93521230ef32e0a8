// Small file helpers shared by the tools.
#ifndef TANDEM_COMMON_FILE_UTIL_H_
#define TANDEM_COMMON_FILE_UTIL_H_

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Writes `bytes` beside `path` and renames it into place, so a reader never
// sees half a file. Errors name the file and the system's reason.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Lifts this process's soft limit on open files to the hard limit: a
// thousand client connections need a thousand sockets.
void RaiseOpenFileLimit();

// A file under the system's temporary directory, named from `stem`, this
// process's id and a counter, removed when the object is destroyed (tests keep
// one in a function-local static, so it lives until the process exits).
class TemporaryFile {
 public:
  // Writes `bytes` to a fresh file.
  static absl::StatusOr<TemporaryFile> Create(std::string_view stem, std::string_view bytes);

  TemporaryFile(TemporaryFile&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TemporaryFile& operator=(TemporaryFile&&) = delete;
  TemporaryFile(const TemporaryFile&) = delete;
  ~TemporaryFile();

  const std::string& path() const { return path_; }

 private:
  explicit TemporaryFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_FILE_UTIL_H_

#include "common/gguf/model_file.h"

#include "absl/strings/str_cat.h"

namespace tandem::gguf {

absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& path) {
  auto file = GgufFile::Open(path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(
        absl::StrCat(file.status().message(), " (tools/setup.sh fetches the default model)"));
  }
  return file;
}

}  // namespace tandem::gguf

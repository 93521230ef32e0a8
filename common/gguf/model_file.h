// OpenModelFile: opens the GGUF file that a command's --model (or
// --tokenizer) names. One message for every command: it names the file, and
// when the file is missing it says how to get the default model.
#ifndef TANDEM_COMMON_GGUF_MODEL_FILE_H_
#define TANDEM_COMMON_GGUF_MODEL_FILE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"

namespace tandem::gguf {

absl::StatusOr<std::unique_ptr<GgufFile>> OpenModelFile(const std::string& path);

}  // namespace tandem::gguf

#endif  // TANDEM_COMMON_GGUF_MODEL_FILE_H_

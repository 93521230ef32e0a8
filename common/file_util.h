// File: common/file_util.h
//
// Small file helpers shared by the tools.
#ifndef TANDEM_COMMON_FILE_UTIL_H_
#define TANDEM_COMMON_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// Writes `bytes` beside `path` and renames it into place, so a reader never
// sees half a file. Errors name the file and the system's reason.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace tandem

#endif  // TANDEM_COMMON_FILE_UTIL_H_

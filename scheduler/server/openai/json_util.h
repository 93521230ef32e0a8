// nlohmann/json, and the one way we serialize it: compact, with invalid
// UTF-8 (a token's partial bytes in a logprobs entry) replaced by U+FFFD
// instead of throwing.
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JSON_UTIL_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JSON_UTIL_H_

#include <string>

#include "nlohmann/json.hpp"

namespace tandem::openai {

inline std::string DumpJson(const nlohmann::json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tandem::openai

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JSON_UTIL_H_

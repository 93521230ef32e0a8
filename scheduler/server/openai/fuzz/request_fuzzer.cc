// libFuzzer target: OpenAI request bodies (ParseGenerationRequest) under
// ASan and UBSan. Built with -DTANDEM_FUZZ=ON; tools/fuzz.sh runs it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "scheduler/server/openai/fuzz/openai_fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem =
      tandem::openai::fuzz::CheckRequestBody(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!problem.empty()) {
    std::fprintf(stderr, "request_fuzzer: %s\n", problem.c_str());
    std::abort();  // libFuzzer saves the input as a crash
  }
  return 0;
}

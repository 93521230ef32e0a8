// Where the default model lives: models/SmolLM2-135M-Instruct.Q4_1.gguf,
// fetched by tools/setup.sh.
#ifndef TANDEM_COMMON_DEFAULT_MODEL_H_
#define TANDEM_COMMON_DEFAULT_MODEL_H_

#include <string>

namespace tandem {

// The default model in the source tree this binary was built from
// (build/bin/../../models), else under the working directory.
std::string DefaultModelPath();

}  // namespace tandem

#endif  // TANDEM_COMMON_DEFAULT_MODEL_H_

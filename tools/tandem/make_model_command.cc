// Placeholder until `tandem make-model` is written.
#include <cstdio>

#include "tools/tandem/commands.h"

namespace tandem::tools {

int RunMakeModel(const std::vector<std::string>& args) {
  std::fprintf(stderr, "tandem make-model: not built yet\n");
  return 1;
}

}  // namespace tandem::tools

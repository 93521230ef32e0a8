#include "common/default_model.h"

#include <filesystem>

namespace tandem {
namespace {
constexpr char kDefaultModel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}  // namespace

std::string DefaultModelPath() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path in_tree = exe.parent_path().parent_path().parent_path() / kDefaultModel;
    if (std::filesystem::exists(in_tree, error)) return in_tree.string();
  }
  return kDefaultModel;
}

}  // namespace tandem

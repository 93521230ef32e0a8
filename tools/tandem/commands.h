// Subcommands of the `tandem` CLI. Each takes the arguments after its name
// and returns the process exit code (0 ok, 1 runtime failure, 2 bad usage).
#ifndef TANDEM_TOOLS_TANDEM_COMMANDS_H_
#define TANDEM_TOOLS_TANDEM_COMMANDS_H_

#include <string>
#include <vector>

namespace tandem::tools {

int RunTrace(const std::vector<std::string>& args);
int RunMakeModel(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);
int RunPerplexity(const std::vector<std::string>& args);
int RunServe(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);

}  // namespace tandem::tools

#endif  // TANDEM_TOOLS_TANDEM_COMMANDS_H_

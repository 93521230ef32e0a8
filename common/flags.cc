#include "common/flags.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

FlagParser::FlagParser(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

void FlagParser::AddInt(const std::string& name, int64_t* target, const std::string& help,
                        int64_t min, int64_t max) {
  Flag flag{name, help, std::to_string(*target), false, nullptr};
  flag.set = [target, min, max](const std::string& value) -> std::string {
    int64_t parsed = 0;
    if (!absl::SimpleAtoi(value, &parsed)) return absl::StrCat("expects an integer, got '", value, "'");
    if (parsed < min || parsed > max) {
      std::string range = max == std::numeric_limits<int64_t>::max()
                              ? absl::StrCat(">= ", min)
                              : absl::StrCat("in [", min, ", ", max, "]");
      return absl::StrCat("must be ", range, ", got ", parsed);
    }
    *target = parsed;
    return "";
  };
  flags_.push_back(std::move(flag));
}

void FlagParser::AddDouble(const std::string& name, double* target, const std::string& help) {
  std::ostringstream text;
  text << *target;
  Flag flag{name, help, text.str(), false, nullptr};
  flag.set = [target](const std::string& value) -> std::string {
    double parsed = 0;
    if (!absl::SimpleAtod(value, &parsed)) return absl::StrCat("expects a number, got '", value, "'");
    *target = parsed;
    return "";
  };
  flags_.push_back(std::move(flag));
}

void FlagParser::AddBool(const std::string& name, bool* target, const std::string& help) {
  Flag flag{name, help, *target ? "true" : "false", true, nullptr};
  flag.set = [target](const std::string& value) -> std::string {
    if (value == "true" || value == "1") {
      *target = true;
    } else if (value == "false" || value == "0") {
      *target = false;
    } else {
      return absl::StrCat("expects true or false, got '", value, "'");
    }
    return "";
  };
  flags_.push_back(std::move(flag));
}

void FlagParser::AddString(const std::string& name, std::string* target, const std::string& help) {
  Flag flag{name, help, *target, false, nullptr};
  flag.set = [target](const std::string& value) -> std::string {
    *target = value;
    return "";
  };
  flags_.push_back(std::move(flag));
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  static const struct {
    const char* suffix;
    double scale;
  } kUnits[] = {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
                {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
                {"B", 1.0}};
  std::string number = text;
  double scale = 1.0;
  for (const auto& unit : kUnits) {
    const size_t n = std::strlen(unit.suffix);
    if (number.size() > n && number.compare(number.size() - n, n, unit.suffix) == 0) {
      number.resize(number.size() - n);
      scale = unit.scale;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || value < 0 || value * scale > 9.2e18) {
    return absl::InvalidArgumentError(absl::StrCat("expects a size like 512MiB or 2GiB, got '", text, "'"));
  }
  return static_cast<int64_t>(value * scale);
}

std::string FormatByteSize(int64_t bytes) {
  static const struct {
    const char* suffix;
    int64_t scale;
  } kUnits[] = {{"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20}, {"KiB", 1024}};
  for (const auto& unit : kUnits) {
    if (bytes >= unit.scale && bytes % unit.scale == 0) return absl::StrCat(bytes / unit.scale, unit.suffix);
  }
  return std::to_string(bytes);
}

void FlagParser::AddBytes(const std::string& name, int64_t* target, const std::string& help) {
  Flag flag{name, help, FormatByteSize(*target), false, nullptr};
  flag.set = [target](const std::string& value) -> std::string {
    absl::StatusOr<int64_t> bytes = ParseByteSize(value);
    if (!bytes.ok()) return std::string(bytes.status().message());
    *target = *bytes;
    return "";
  };
  flags_.push_back(std::move(flag));
}

FlagParser::Flag* FlagParser::Find(const std::string& name) {
  for (Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

absl::Status FlagParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(program_, ": unexpected argument '", arg, "' (flags start with --)"));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = Find(name);
    if (flag == nullptr && !has_value && name.compare(0, 3, "no-") == 0) {
      Flag* negated = Find(name.substr(3));
      if (negated != nullptr && negated->is_bool) {
        negated->set("false");
        negated->was_set = true;
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(program_, ": unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(program_, ": flag --", name, " needs a value"));
      }
    }
    if (std::string error = flag->set(value); !error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(program_, ": flag --", name, " ", error));
    }
    flag->was_set = true;
  }
  return absl::OkStatus();
}

bool FlagParser::WasSet(const std::string& name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return flag.was_set;
  }
  return false;
}

std::optional<int> FlagParser::ParseOrExitCode(const std::vector<std::string>& args) {
  if (absl::Status s = Parse(args); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (help_requested_) {
    std::fputs(Usage().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

std::string FlagParser::Usage() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]\n" << description_ << "\n\nflags:\n";
  for (const Flag& flag : flags_) {
    out << "  --" << flag.name;
    if (!flag.is_bool) out << " VALUE";
    out << "\n      " << flag.help;
    // A help text may say its default in words ("default: none").
    if (flag.help.find("default:") == std::string::npos) {
      out << " (default: " << (flag.default_text.empty() ? "none" : flag.default_text) << ")";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace tandem

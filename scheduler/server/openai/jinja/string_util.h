// Python's str operations on UTF-8 text. Case mapping is ASCII-only (chat
// templates change the case of role names and keywords, not of user text).
#ifndef TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_STRING_UTIL_H_
#define TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_STRING_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::jinja {

bool IsPythonSpace(char c);
// str.strip/lstrip/rstrip; `chars` null strips whitespace.
std::string Strip(const std::string& s, bool left, bool right, const std::string* chars);
std::string AsciiUpper(std::string s);
std::string AsciiLower(std::string s);
std::string Capitalize(const std::string& s);    // str.capitalize
std::string PythonTitle(const std::string& s);   // str.title
std::string JinjaTitle(const std::string& s);    // jinja2's title filter
// str.split / str.rsplit (sep null: runs of whitespace).
std::vector<std::string> PythonSplit(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right);
std::string Replace(const std::string& s, const std::string& old, const std::string& with, int64_t count);
// str.splitlines() (without keepends).
std::vector<std::string> SplitLines(const std::string& s);

}  // namespace tandem::jinja

#endif  // TANDEM_SCHEDULER_SERVER_OPENAI_JINJA_STRING_UTIL_H_

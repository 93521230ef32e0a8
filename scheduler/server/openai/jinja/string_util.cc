#include "scheduler/server/openai/jinja/string_util.h"

#include <algorithm>
#include <cctype>

#include "scheduler/server/openai/jinja/value.h"

namespace tandem::jinja {

bool IsPythonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1f');
}

std::string Strip(const std::string& s, bool left, bool right, const std::string* chars) {
  auto strip = [&](char c) { return chars == nullptr ? IsPythonSpace(c) : chars->find(c) != std::string::npos; };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && strip(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(s[end - 1])) --end;
  }
  return s.substr(begin, end - begin);
}

std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Capitalize(const std::string& s) {
  std::string out = AsciiLower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string PythonTitle(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(previous_cased ? std::tolower(u) : std::toupper(u));
      previous_cased = true;
    } else {
      previous_cased = u >= 0x80;  // inside a non-ASCII letter: not a word start
    }
  }
  return out;
}

std::string JinjaTitle(const std::string& s) {
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    const bool separator = c == '-' || IsPythonSpace(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (separator) {
      word_start = true;
      continue;
    }
    const auto u = static_cast<unsigned char>(c);
    c = static_cast<char>(word_start ? std::toupper(u) : std::tolower(u));
    word_start = false;
  }
  return out;
}

std::vector<std::string> PythonSplit(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr) {
    // Runs of whitespace; leading and trailing whitespace make no parts.
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      while (i < s.size() && IsPythonSpace(s[i])) ++i;
      if (i == s.size()) break;
      size_t j = i;
      while (j < s.size() && !IsPythonSpace(s[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (auto [b, e] : words) parts.push_back(s.substr(b, e - b));
      return parts;
    }
    if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
      parts.push_back(Strip(s.substr(words[maxsplit].first), false, true, nullptr));
    } else {
      const size_t keep = words.size() - maxsplit;
      parts.push_back(Strip(s.substr(0, words[keep - 1].second), true, false, nullptr));
      for (size_t k = keep; k < words.size(); ++k) parts.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    }
    return parts;
  }
  std::vector<size_t> hits;
  for (size_t at = s.find(*sep); at != std::string::npos; at = s.find(*sep, at + sep->size())) hits.push_back(at);
  if (maxsplit >= 0 && static_cast<size_t>(maxsplit) < hits.size()) {
    if (from_right) {
      hits.erase(hits.begin(), hits.end() - maxsplit);
    } else {
      hits.resize(maxsplit);
    }
  }
  size_t begin = 0;
  for (size_t at : hits) {
    parts.push_back(s.substr(begin, at - begin));
    begin = at + sep->size();
  }
  parts.push_back(s.substr(begin));
  return parts;
}

std::string Replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before every character and at the end.
    const std::vector<size_t> at = CodePointOffsets(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < at.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += s.substr(at[i], at[i + 1] - at[i]);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t begin = 0;
  int64_t done = 0;
  for (size_t at = s.find(old); at != std::string::npos && (count < 0 || done < count); at = s.find(old, begin)) {
    out += s.substr(begin, at - begin);
    out += with;
    begin = at + old.size();
    ++done;
  }
  return out + s.substr(begin);
}

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      lines.push_back(s.substr(begin, i - begin));
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      begin = i + 1;
    }
  }
  if (begin < s.size()) lines.push_back(s.substr(begin));
  return lines;
}

}  // namespace tandem::jinja

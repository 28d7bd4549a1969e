// The one error type the C++ API throws.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace simdattn {

namespace detail {

// `s` with every byte that is not printable text escaped as \xNN: control characters (newlines
// included) and bytes outside valid UTF-8 (messages quote malformed file contents; on a
// terminal or in a log they must stay one line of text).
inline std::string printable(const std::string& s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;  // length of a valid UTF-8 sequence starting here, 0 if none
    if (c >= 0x20 && c < 0x7f) len = 1;
    else if (c >= 0xc2 && c <= 0xf4) {
      const std::size_t n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      len = n;
      for (std::size_t j = 1; j < n; ++j)
        if (i + j >= s.size() || (static_cast<unsigned char>(s[i + j]) & 0xc0) != 0x80) len = 0;
      if (len != 0) {  // no overlong forms, surrogates or code points past U+10FFFF
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
            (c == 0xf4 && c1 >= 0x90))
          len = 0;
      }
    }
    if (len == 0) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace detail

// Thrown for every invalid argument or unreadable input. what() names the argument (or file)
// and what was expected, e.g. "k: expected shape [B=2, Hkv, Sk, D=64], got [2, 4, 10, 32]".
// argument() returns just the name ("k", "options.window", "Q.npy", ...). what() is printable
// text: bytes quoted from a malformed file that are not (control characters, invalid UTF-8)
// appear as \xNN. When an API call throws, nothing has been written to its outputs.
class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& message)
      : std::runtime_error(detail::printable(argument.empty() ? message : argument + ": " + message)),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace simdattn

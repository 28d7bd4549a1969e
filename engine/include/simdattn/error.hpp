// The one error type the C++ API throws.
#pragma once

#include "simdattn/export.hpp"

#include <stdexcept>
#include <string>

namespace simdattn {

namespace detail {

// `s` with every byte that is not printable text escaped as \xNN: control characters (newlines
// included) and bytes outside valid UTF-8 (messages quote malformed file contents; on a
// terminal or in a log they must stay one line of text).
SIMDATTN_API std::string printable(const std::string& s);

}  // namespace detail

// Thrown for every invalid argument or unreadable input. what() names the argument (or file)
// and what was expected, e.g. "k: expected shape [B=2, Hkv, Sk, D=64], got [2, 4, 10, 32]".
// argument() returns just the name ("k", "options.window", "Q.npy", ...). what() is printable
// text: bytes quoted from a malformed file that are not (control characters, invalid UTF-8)
// appear as \xNN. When an API call throws, nothing has been written to its outputs.
class SIMDATTN_API Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& message)
      : std::runtime_error(detail::printable(argument.empty() ? message : argument + ": " + message)),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace simdattn

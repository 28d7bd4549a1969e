// The one error type the C++ API throws.
#pragma once

#include <stdexcept>
#include <string>

namespace simdattn {

// Thrown for every invalid argument or unreadable input. what() names the argument (or file)
// and what was expected, e.g. "k: expected shape [B=2, Hkv, Sk, D=64], got [2, 4, 10, 32]".
// argument() returns just the name ("k", "options.window", "Q.npy", ...). When an API call
// throws, nothing has been written to its outputs.
class Error : public std::runtime_error {
 public:
  Error(std::string argument, const std::string& message)
      : std::runtime_error(argument.empty() ? message : argument + ": " + message),
        argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace simdattn

// Text the error messages share (error.cpp): numbers and shapes, formatted one way everywhere.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace simdattn::detail {

// A number in a message: "42".
inline std::string num(std::int64_t x) { return std::to_string(x); }

// "[2, 3, 4]"
std::string shape_str(std::span<const std::int64_t> dims);
inline std::string shape_str(std::initializer_list<std::int64_t> dims) {
  return shape_str(std::span<const std::int64_t>(dims.begin(), dims.size()));
}

}  // namespace simdattn::detail

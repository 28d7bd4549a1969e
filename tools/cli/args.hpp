// Strict parsing of CLI option values and loading of .npy inputs, with errors that name the flag.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "simdattn/simdattn.hpp"

namespace simdattn::cli {

// A bad command line or input file: printed as one line, exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double parse_double(const std::string& flag, const std::string& text);
std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t min,
                       std::int64_t max);
Causal parse_causal(const std::string& flag, const std::string& text);
Backend parse_backend(const std::string& flag, const std::string& text);
Window parse_window(const std::string& flag, const std::string& text);

// Reads a .npy file given to `flag`; errors become UsageError("--flag PATH: ...").
NpyArray load_npy(const std::string& flag, const std::string& path);

// A 4-D attention input: rank 4, dtype f32 or f64.
Shape4 shape4(const std::string& flag, const std::string& path, const NpyArray& a);

}  // namespace simdattn::cli

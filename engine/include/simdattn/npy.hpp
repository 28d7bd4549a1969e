// NumPy .npy files: read and write.
//
// Reads format versions 1.0, 2.0 (and 3.0, whose header is UTF-8), C order, little-endian,
// dtypes '<f2' '<f4' '<f8' '|b1' '|u1' '<i4' '<i8'. Everything else (Fortran order, big-endian,
// other dtypes, a malformed header, truncated data or trailing bytes) is rejected with an
// Error naming the file. Writes format 1.0, or 2.0 when the header would not fit; a bf16 array
// is refused (NumPy has no bfloat16).
#pragma once

#include "simdattn/export.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "simdattn/tensor.hpp"

namespace simdattn {

struct SIMDATTN_API NpyArray {
  DType dtype = DType::f32;
  bool is_bool = false;  // '|b1' (dtype u8 with values 0/1) rather than '|u1'
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;  // C-order elements, little-endian

  std::int64_t numel() const;
  std::string descr() const;  // the dtype as a .npy header spells it: '<f4', '|b1', ...
  template <class T> const T* as() const { return reinterpret_cast<const T*>(data.data()); }
  template <class T> T* as() { return reinterpret_cast<T*>(data.data()); }
};

// Reads a whole file. Throws Error(path, ...) on any problem.
SIMDATTN_API NpyArray read_npy(const std::string& path);

// Parses an in-memory .npy image; `name` is used in error messages.
SIMDATTN_API NpyArray parse_npy(const std::byte* bytes, std::size_t size, const std::string& name);

// Serialises to an in-memory .npy image.
SIMDATTN_API std::vector<std::byte> serialize_npy(const NpyArray& array);

// Writes atomically: to a temporary file beside `path`, then renamed over it, so a failure
// never leaves a partial file. Throws Error(path, ...) on failure.
SIMDATTN_API void write_npy(const std::string& path, const NpyArray& array);

}  // namespace simdattn

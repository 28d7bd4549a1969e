// safetensors files: a memory-mapped, fully validated reader and an atomic writer.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data section; offsets are relative to its start. The reader checks everything before
// handing out a tensor: the header length fits in the file, the JSON is well formed, every entry
// has a known dtype, a shape of non-negative integers, offsets with begin <= end inside the data
// section, end - begin == elements x dtype size, and no two tensors overlap. Each violation is
// an Error naming the file and the tensor.
#pragma once

#include "simdattn/export.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "simdattn/tensor.hpp"

namespace simdattn {

struct SafetensorsEntry {
  std::string dtype;                 // as in the file: F32, F64, F16, BF16, I64, ...
  std::vector<std::int64_t> shape;
  // Inside the file's read-only mapping; not aligned in general. A load through it raises SIGBUS
  // if another process has truncated the file since; SafetensorsFile::read reads with pread
  // instead and throws Error then.
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};

class SIMDATTN_API SafetensorsFile {
 public:
  // Opens, maps and validates `path` (the header is read with pread, so a file truncated while
  // this runs is an Error, not SIGBUS). Keeps the file open. Throws Error(path, ...).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  const std::map<std::string, SafetensorsEntry>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  // The tensor `name` as T (float, double, bfloat16 or float16) from F32, F64, BF16 or F16:
  // kept as it is when the dtypes match, else rounded once to nearest even; checked against
  // `shape`. Throws Error(path, ...) naming the tensor if it is missing, has another
  // shape or another dtype, or if the file no longer holds its bytes (truncated by another
  // process since it was opened: read with pread, never through the mapping).
  template <class T>
  std::vector<T> read(const std::string& name, const std::vector<std::int64_t>& shape) const;

 private:
  std::string path_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: f32, f64, bf16 or f16 elements (F32, F64, BF16, F16) in C order.
struct SafetensorsTensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
};

// Writes atomically (temporary file + rename). Throws Error(path, ...).
SIMDATTN_API void write_safetensors(const std::string& path, const std::map<std::string, SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace simdattn

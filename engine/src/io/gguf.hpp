// GGUF files (llama.cpp's format): a validating reader of the header, the metadata and the
// tensor table, and of the tensors' elements in F32, F16, BF16 and Q8_0.
//
// Layout (little-endian; versions 2 and 3): "GGUF", version u32, tensor_count u64, kv_count
// u64; kv_count metadata pairs (key: string, value type u32, value); tensor_count tensor infos
// (name: string, n_dims u32, n_dims dims u64 innermost first, ggml type u32, offset u64); then,
// at the next multiple of general.alignment (u32, default 32, a power of two), the data section,
// which each offset is relative to. A string is a u64 byte length and the bytes; an array is an
// element type u32, a count u64 and the elements. Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32,
// 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64.
//
// GgufFile reads everything but the tensors' data when it opens the file, each count and length
// checked against the bytes left before anything is allocated for it, and refuses (Error naming
// the file and the fault): a bad magic or version, a count or string past the end, an unknown
// value type, arrays of arrays, a duplicate key or tensor, a general.alignment that is not a u32
// power of two, a tensor of 0 or more than 4 dimensions, a row not a whole number of its type's
// blocks, an offset off the alignment, data past the end, overlapping tensors. A tensor of a
// ggml type this reader does not know is listed (its bytes unchecked) but cannot be read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace simdattn::detail {

enum class GgufValueType : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

// A metadata value: one scalar, or an array of them (`type` the element type then). Numbers are
// kept as integers or doubles; arrays of numbers longer than kGgufKeptArray and arrays of
// strings are checked and counted, not kept (llama.cpp's vocabularies: nothing here reads them).
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  bool is_array = false;
  bool kept = true;                 // false: an array whose elements were skipped
  std::uint64_t count = 1;          // elements (1 for a scalar)
  std::vector<std::int64_t> ints;   // integer and bool elements (u64 above 2^63 - 1: not kept)
  std::vector<double> floats;       // f32 and f64 elements
  std::string text;                 // a string scalar
};
inline constexpr std::uint64_t kGgufKeptArray = 1u << 16;

// ggml's tensor types: name, elements per block, bytes per block (0 for a type this reader does
// not know).
struct GgmlType {
  std::uint32_t id = 0;
  std::string name;
  std::uint64_t block = 0, block_bytes = 0;
};
GgmlType ggml_type(std::uint32_t id);
inline constexpr std::uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8, kGgmlBF16 = 30;

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> dims;  // ggml order: dims[0] innermost (a weight [out, in] is {in, out})
  GgmlType type;
  std::uint64_t offset = 0;        // from the file's start
  std::uint64_t bytes = 0;         // 0 for an unknown type
  std::uint64_t elements = 1;
};

class GgufFile {
 public:
  // Opens and validates `path`; keeps it open. Throws Error(path, ...).
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  std::uint32_t version() const noexcept { return version_; }
  std::uint64_t alignment() const noexcept { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const noexcept { return metadata_; }
  const std::map<std::string, GgufTensor>& tensors() const noexcept { return tensors_; }
  const GgufValue* find(const std::string& key) const;
  const GgufTensor* tensor(const std::string& name) const;

  // The tensor's elements in ggml order as T (float, double, bfloat16 or float16): F32, F16 and
  // BF16 kept when T is their type, else rounded once to nearest even; Q8_0 dequantized as ggml
  // does (d * q in f32, d the block's f16 scale), then rounded once to T. Error(path, ...)
  // naming the tensor for another type, or if the file no longer holds its bytes (read with
  // pread: a file truncated since it was opened is an Error).
  template <class T>
  std::vector<T> read(const GgufTensor& t) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensor> tensors_;
};

}  // namespace simdattn::detail

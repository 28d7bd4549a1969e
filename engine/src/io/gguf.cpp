// GgufFile (io/gguf.hpp): the header, the metadata and the tensor table, read with pread through
// a bounds-checked cursor; every count and length is checked against the bytes left before
// anything is allocated for it.
#include "io/gguf.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "core/text.hpp"
#include "io/file_io.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

// ggml's tensor types (ggml.h, ggml-common.h): elements per block, bytes per block.
struct TypeRow {
  std::uint32_t id;
  const char* name;
  std::uint64_t block, bytes;
};
constexpr TypeRow kTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},         {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

constexpr std::size_t kValueBytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};  // by GgufValueType
constexpr std::uint64_t kMaxKey = 65535;      // the spec's limit on a key's length
constexpr std::uint64_t kMaxTensorName = 63;  // ggml's GGML_MAX_NAME (64) with its terminator
constexpr std::uint32_t kMaxDims = 4;         // GGML_MAX_DIMS

// Reads the file front to back through pread, a buffer at a time; every read is checked against
// the file's size first, so a count or length past the end is an Error, never a large
// allocation or a read beyond the file.
class Cursor {
 public:
  Cursor(int fd, const std::string& path, std::uint64_t size) : fd_(fd), path_(path), size_(size) {}
  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return size_ - pos_; }

  void need(std::uint64_t n, const std::string& what) const {
    if (n > left())
      throw Error(path_, what + " runs past the end of the file (" + std::to_string(n) + " bytes at offset " +
                             std::to_string(pos_) + ", " + std::to_string(left()) + " left)");
  }
  void bytes(void* dst, std::size_t n, const std::string& what) {
    need(n, what);
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (buf_pos_ == buf_.size()) fill();
      const std::size_t k = std::min(n, buf_.size() - buf_pos_);
      std::memcpy(out, buf_.data() + buf_pos_, k);
      out += k, n -= k, buf_pos_ += k, pos_ += k;
    }
  }
  void skip(std::uint64_t n, const std::string& what) {
    need(n, what);
    const std::uint64_t in_buf = std::min<std::uint64_t>(n, buf_.size() - buf_pos_);
    buf_pos_ += in_buf;
    pos_ += n;
    if (n > in_buf) buf_.clear(), buf_pos_ = 0;  // past the buffer: refill at the new position
  }
  template <class U>
  U scalar(const std::string& what) {
    unsigned char b[sizeof(U)];
    bytes(b, sizeof(U), what);
    std::uint64_t u = 0;
    for (std::size_t i = sizeof(U); i-- > 0;) u = (u << 8) | b[i];
    U out;
    if constexpr (sizeof(U) == 8) {
      std::memcpy(&out, &u, 8);
    } else {
      const auto narrow = static_cast<std::uint32_t>(u);
      if constexpr (sizeof(U) == 4) std::memcpy(&out, &narrow, 4);
      else {
        const auto small = static_cast<std::uint16_t>(u);
        if constexpr (sizeof(U) == 2) std::memcpy(&out, &small, 2);
        else out = static_cast<U>(u);
      }
    }
    return out;
  }
  // A string: u64 length, then the bytes; longer than `limit` is refused.
  std::string string(const std::string& what, std::uint64_t limit) {
    const std::uint64_t n = scalar<std::uint64_t>(what + "'s length");
    if (n > limit) throw Error(path_, what + " is " + std::to_string(n) + " bytes long, more than " + std::to_string(limit));
    need(n, what + " (" + std::to_string(n) + " bytes)");
    std::string s(static_cast<std::size_t>(n), '\0');
    bytes(s.data(), s.size(), what);
    return s;
  }
  void skip_string(const std::string& what) {
    const std::uint64_t n = scalar<std::uint64_t>(what + "'s length");
    skip(n, what + " (" + std::to_string(n) + " bytes)");
  }

 private:
  void fill() {
    constexpr std::size_t kBuffer = 1 << 16;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kBuffer, size_ - pos_));
    buf_.resize(n);
    buf_pos_ = 0;
    read_exact(fd_, path_, pos_, n, buf_.data(), "the header");
  }
  int fd_;
  const std::string& path_;
  std::uint64_t size_, pos_ = 0;
  std::vector<char> buf_;
  std::size_t buf_pos_ = 0;
};

// One scalar of type t appended to v (ints or floats).
void read_scalar(Cursor& c, GgufValueType t, GgufValue& v, const std::string& what) {
  switch (t) {
    case GgufValueType::u8: v.ints.push_back(c.scalar<std::uint8_t>(what)); break;
    case GgufValueType::i8: v.ints.push_back(static_cast<std::int8_t>(c.scalar<std::uint8_t>(what))); break;
    case GgufValueType::u16: v.ints.push_back(c.scalar<std::uint16_t>(what)); break;
    case GgufValueType::i16: v.ints.push_back(static_cast<std::int16_t>(c.scalar<std::uint16_t>(what))); break;
    case GgufValueType::u32: v.ints.push_back(c.scalar<std::uint32_t>(what)); break;
    case GgufValueType::i32: v.ints.push_back(c.scalar<std::int32_t>(what)); break;
    case GgufValueType::boolean: v.ints.push_back(c.scalar<std::uint8_t>(what) != 0); break;
    case GgufValueType::i64: v.ints.push_back(c.scalar<std::int64_t>(what)); break;
    case GgufValueType::u64: {
      const std::uint64_t u = c.scalar<std::uint64_t>(what);
      // above INT64_MAX: not representable here; recorded as -1 (no key this reader uses is one)
      v.ints.push_back(u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ? -1 : static_cast<std::int64_t>(u));
      break;
    }
    case GgufValueType::f32: v.floats.push_back(c.scalar<float>(what)); break;
    case GgufValueType::f64: v.floats.push_back(c.scalar<double>(what)); break;
    default: break;
  }
}

GgufValueType value_type(const std::string& path, std::uint32_t t, const std::string& what) {
  if (t > static_cast<std::uint32_t>(GgufValueType::f64))
    throw Error(path, what + " has unknown value type " + std::to_string(t) + " (GGUF's are 0 to 12)");
  return static_cast<GgufValueType>(t);
}

GgufValue read_value(Cursor& c, const std::string& path, GgufValueType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t == GgufValueType::string) {
    v.text = c.string(what, c.left());
    return v;
  }
  if (t != GgufValueType::array) {
    read_scalar(c, t, v, what);
    return v;
  }
  v.is_array = true;
  v.type = value_type(path, c.scalar<std::uint32_t>(what + "'s element type"), what + "'s elements");
  if (v.type == GgufValueType::array) throw Error(path, what + " is an array of arrays (not supported)");
  v.count = c.scalar<std::uint64_t>(what + "'s count");
  // the smallest each element can be: a string's length alone, else the scalar's size
  const std::uint64_t least = v.type == GgufValueType::string ? 8 : kValueBytes[static_cast<std::size_t>(v.type)];
  if (v.count > c.left() / least)
    throw Error(path, what + " holds " + std::to_string(v.count) + " elements of " + gguf_value_type_name(v.type) +
                          ", more than the " + std::to_string(c.left()) + " bytes left in the file");
  if (v.type == GgufValueType::string || v.count > kGgufKeptArray) {
    v.kept = false;
    if (v.type != GgufValueType::string) c.skip(v.count * least, what);  // (count <= left / least)
    else
      for (std::uint64_t i = 0; i < v.count; ++i) c.skip_string(what + "[" + std::to_string(i) + "]");
    return v;
  }
  for (std::uint64_t i = 0; i < v.count; ++i) read_scalar(c, v.type, v, what);
  return v;
}

// The tensor info at the cursor (its offset still relative to the data section).
GgufTensor read_tensor_info(Cursor& c, const std::string& path, std::uint64_t index) {
  GgufTensor t;
  const std::string what = "tensor " + std::to_string(index);
  t.name = c.string(what + "'s name", kMaxTensorName);
  const std::string where = "tensor '" + t.name + "'";
  const std::uint32_t n_dims = c.scalar<std::uint32_t>(where + "'s n_dims");
  if (n_dims < 1 || n_dims > kMaxDims)
    throw Error(path, where + " has " + std::to_string(n_dims) + " dimensions (expected 1 to 4)");
  for (std::uint32_t i = 0; i < n_dims; ++i) {
    const std::uint64_t d = c.scalar<std::uint64_t>(where + "'s dimensions");
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        __builtin_mul_overflow(t.elements, d, &t.elements))
      throw Error(path, where + "'s dimensions overflow (dimension " + std::to_string(i) + " is " + std::to_string(d) + ")");
    t.dims.push_back(static_cast<std::int64_t>(d));
  }
  t.type = ggml_type(c.scalar<std::uint32_t>(where + "'s type"));
  t.offset = c.scalar<std::uint64_t>(where + "'s offset");
  if (t.type.block != 0) {
    if (static_cast<std::uint64_t>(t.dims[0]) % t.type.block != 0)
      throw Error(path, where + " of type " + t.type.name + " has rows of " + std::to_string(t.dims[0]) +
                            " elements, not a multiple of its block (" + std::to_string(t.type.block) + ")");
    if (__builtin_mul_overflow(t.elements / t.type.block, t.type.block_bytes, &t.bytes))
      throw Error(path, where + " of shape " + shape_str(t.dims) + " needs more than 2^64 bytes");
  }
  return t;
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  static const char* const kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<std::size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

GgmlType ggml_type(std::uint32_t id) {
  for (const TypeRow& r : kTypes)
    if (r.id == id) return GgmlType{id, r.name, r.block, r.bytes};
  return GgmlType{id, "ggml type " + std::to_string(id), 0, 0};
}

GgufFile::GgufFile(const std::string& path) : path_(path) {
  std::size_t size = 0;
  fd_ = open_regular_file(path, size);
  size_ = size;
  try {
    Cursor c(fd_, path_, size_);
    char magic[4];
    c.bytes(magic, 4, "the magic (GGUF)");
    if (std::memcmp(magic, "GGUF", 4) != 0)
      throw Error(path, "does not start with the magic \"GGUF\" (got \"" + std::string(magic, 4) + "\")");
    version_ = c.scalar<std::uint32_t>("the version");
    if (version_ != 2 && version_ != 3)
      throw Error(path, "has GGUF version " + std::to_string(version_) +
                            (version_ > 0xffff ? " (a big-endian file?)" : "") + "; this reader reads versions 2 and 3");
    const std::uint64_t n_tensors = c.scalar<std::uint64_t>("the tensor count");
    const std::uint64_t n_kv = c.scalar<std::uint64_t>("the metadata count");
    // each pair takes a key length, a value type and a value byte at least; a tensor info a name
    // length, n_dims, a dimension, a type and an offset
    if (n_kv > c.left() / 13)
      throw Error(path, "metadata count " + std::to_string(n_kv) + " exceeds what the " + std::to_string(c.left()) +
                            " bytes after the header can hold");
    if (n_tensors > c.left() / 32)
      throw Error(path, "tensor count " + std::to_string(n_tensors) + " exceeds what the " + std::to_string(c.left()) +
                            " bytes after the header can hold");
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = c.string("metadata key " + std::to_string(i), kMaxKey);
      const std::string what = "metadata '" + key + "'";
      const GgufValueType t = value_type(path, c.scalar<std::uint32_t>(what + "'s type"), what);
      GgufValue v = read_value(c, path, t, what);
      if (!metadata_.emplace(key, std::move(v)).second) throw Error(path, "duplicate metadata key '" + key + "'");
    }
    if (const GgufValue* a = find("general.alignment")) {
      if (a->type != GgufValueType::u32 || a->is_array)
        throw Error(path, std::string("general.alignment must be a u32, got ") + (a->is_array ? "an array of " : "") +
                              gguf_value_type_name(a->type));
      const auto align = static_cast<std::uint64_t>(a->ints[0]);
      if (align == 0 || (align & (align - 1)) != 0)
        throw Error(path, "general.alignment " + std::to_string(align) + " is not a power of two");
      alignment_ = align;
    }
    std::vector<GgufTensor> infos;
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensor t = read_tensor_info(c, path, i);
      if (t.offset % alignment_ != 0)
        throw Error(path, "tensor '" + t.name + "' has offset " + std::to_string(t.offset) +
                              ", not a multiple of the alignment " + std::to_string(alignment_));
      if (tensors_.count(t.name) != 0) throw Error(path, "duplicate tensor '" + t.name + "'");
      tensors_.emplace(t.name, t);
      infos.push_back(std::move(t));
    }
    // the data section: at the next multiple of the alignment (alignment <= 2^31, pos < 2^63)
    const std::uint64_t data = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    const std::uint64_t data_size = data <= size_ ? size_ - data : 0;
    std::vector<std::pair<std::uint64_t, std::string>> spans;  // (begin, name) of tensors with bytes
    for (GgufTensor& t : infos) {
      if (t.offset > data_size || t.bytes > data_size - t.offset)
        throw Error(path, "tensor '" + t.name + "' (" + std::to_string(t.bytes) + " bytes at data offset " +
                              std::to_string(t.offset) + ") runs past the end of the file (data section of " +
                              std::to_string(data_size) + " bytes)");
      t.offset += data;
      tensors_.at(t.name).offset = t.offset;
      if (t.bytes > 0) spans.emplace_back(t.offset, t.name);
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
      const GgufTensor& prev = tensors_.at(spans[i - 1].second);
      if (spans[i].first < prev.offset + prev.bytes)
        throw Error(path, "tensors '" + prev.name + "' and '" + spans[i].second + "' overlap");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

GgufFile::~GgufFile() { ::close(fd_); }

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace simdattn::detail

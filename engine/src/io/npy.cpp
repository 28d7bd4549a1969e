// NumPy .npy reader and writer (format spec: numpy/lib/format.py's documentation, versions 1-3).
//
//   magic "\x93NUMPY", major, minor, header length (uint16 LE for 1.x, uint32 LE for 2.x/3.x),
//   header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
//   padded with spaces and ended by '\n', then the raw C-order data.
#include "simdattn/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "io/file_io.hpp"
#include "simdattn/error.hpp"

namespace simdattn {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kMaxHeaderLen = 1 << 20;  // far beyond any real header; bounds the parse

struct Header {
  DType dtype = DType::f32;
  bool is_bool = false;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;
  std::int64_t data_bytes = 0;
};

// A parser for the restricted Python literal numpy writes as the header.
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  Header parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<std::vector<std::int64_t>> shape;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') { ++pos_; break; }
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (descr) fail("duplicate key 'descr'");
        descr = parse_string();
      } else if (key == "fortran_order") {
        if (fortran) fail("duplicate key 'fortran_order'");
        fortran = parse_bool();
      } else if (key == "shape") {
        if (shape) fail("duplicate key 'shape'");
        shape = parse_tuple();
      } else {
        fail("unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') { ++pos_; continue; }
      skip_ws();
      if (peek() == '}') { ++pos_; break; }
      fail("expected ',' or '}' at header offset " + std::to_string(pos_));
    }
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the header dict");
    if (!descr) fail("header has no 'descr'");
    if (!fortran) fail("header has no 'fortran_order'");
    if (!shape) fail("header has no 'shape'");
    if (*fortran) fail("Fortran-order arrays are not supported (save with C order)");

    Header h;
    h.shape = *shape;
    const std::string& d = *descr;
    if (d == "<f4") h.dtype = DType::f32;
    else if (d == "<f2") h.dtype = DType::f16;
    else if (d == "<f8") h.dtype = DType::f64;
    else if (d == "|b1") { h.dtype = DType::u8; h.is_bool = true; }
    else if (d == "|u1") h.dtype = DType::u8;
    else if (d == "<i4") h.dtype = DType::i32;
    else if (d == "<i8") h.dtype = DType::i64;
    else if (!d.empty() && d[0] == '>')
      fail("big-endian dtype '" + d + "' is not supported (expected little-endian)");
    else
      fail("unsupported dtype '" + d + "' (expected <f2, <f4, <f8, |b1, |u1, <i4 or <i8)");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(name_, "malformed .npy header: " + what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "' at header offset " + std::to_string(pos_));
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string at header offset " + std::to_string(pos_));
    ++pos_;
    const std::size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") { pos_ += 4; return true; }
    if (s_.substr(pos_, 5) == "False") { pos_ += 5; return false; }
    fail("expected True or False for 'fortran_order'");
  }
  std::vector<std::int64_t> parse_tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    while (true) {
      skip_ws();
      if (peek() == ')') { ++pos_; break; }
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer in 'shape'");
      std::int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
          fail("dimension in 'shape' overflows 64 bits");
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(v);
      if (dims.size() > 32) fail("'shape' has more than 32 dimensions");
      skip_ws();
      if (peek() == ',') { ++pos_; continue; }
      skip_ws();
      if (peek() == ')') { ++pos_; break; }
      fail("expected ',' or ')' in 'shape'");
    }
    return dims;
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(const std::byte* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint32_t>(p[i]);
  return v;
}

// Parses the preamble and header from the first bytes of a file. `available` is how many bytes
// `p` holds; returns nullopt if more are needed (with `need` set).
std::optional<Header> parse_header(const std::byte* p, std::size_t available, const std::string& name,
                                   std::size_t* need) {
  if (available < kMagicLen + 2) { *need = kMagicLen + 2; return std::nullopt; }
  if (std::memcmp(p, kMagic, kMagicLen) != 0)
    throw Error(name, "not a .npy file (missing \\x93NUMPY magic)");
  const int major = std::to_integer<int>(p[6]);
  const int minor = std::to_integer<int>(p[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw Error(name, "unsupported .npy format version " + std::to_string(major) + "." +
                          std::to_string(minor) + " (expected 1.0, 2.0 or 3.0)");
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = kMagicLen + 2 + len_bytes;
  if (available < prefix) { *need = prefix; return std::nullopt; }
  const std::size_t header_len = read_le(p + 8, static_cast<int>(len_bytes));
  if (header_len > kMaxHeaderLen)
    throw Error(name, "malformed .npy header: header length " + std::to_string(header_len) +
                          " exceeds " + std::to_string(kMaxHeaderLen) + " bytes");
  if (available < prefix + header_len) { *need = prefix + header_len; return std::nullopt; }
  std::string_view text(reinterpret_cast<const char*>(p + prefix), header_len);
  if (text.empty() || text.back() != '\n')
    throw Error(name, "malformed .npy header: not terminated by a newline");
  Header h = DictParser(text, name).parse();
  h.data_offset = prefix + header_len;
  std::int64_t n = 1;
  for (std::int64_t d : h.shape)
    if (__builtin_mul_overflow(n, d, &n)) throw Error(name, "shape is too large (element count overflows)");
  if (__builtin_mul_overflow(n, static_cast<std::int64_t>(dtype_size(h.dtype)), &h.data_bytes))
    throw Error(name, "shape is too large (byte count overflows)");
  return h;
}

void check_data_size(const Header& h, std::uint64_t data_available, const std::string& name) {
  const auto want = static_cast<std::uint64_t>(h.data_bytes);
  if (data_available < want)
    throw Error(name, "truncated .npy data: shape needs " + std::to_string(want) + " bytes, file has " +
                          std::to_string(data_available));
  if (data_available > want)
    throw Error(name, "malformed .npy file: " + std::to_string(data_available - want) +
                          " unexpected bytes after the data");
}

NpyArray make_array(const Header& h) {
  NpyArray a;
  a.dtype = h.dtype;
  a.is_bool = h.is_bool;
  a.shape = h.shape;
  return a;
}

}  // namespace

std::string NpyArray::descr() const {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::u8: return is_bool ? "|b1" : "|u1";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::f16: return "<f2";
    case DType::int8: return "|i1";
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return "|u1";  // fp8 codes as NumPy holds them: uint8
    case DType::bf16: break;  // NumPy has no bfloat16
  }
  return "?";
}

std::int64_t NpyArray::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

NpyArray parse_npy(const std::byte* bytes, std::size_t size, const std::string& name) {
  std::size_t need = 0;
  const std::optional<Header> h = parse_header(bytes, size, name, &need);
  if (!h) throw Error(name, "truncated .npy file: " + std::to_string(size) + " bytes, header needs " +
                                std::to_string(need));
  check_data_size(*h, size - h->data_offset, name);
  NpyArray a = make_array(*h);
  a.data.assign(bytes + h->data_offset, bytes + size);
  return a;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path, "is a directory, expected a .npy file");
  // (a FIFO or device would block the open below, or never end)
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw Error(path, "is not a regular file, expected a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, std::string("cannot open for reading: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff file_size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (file_size < 0) throw Error(path, "cannot determine file size (not a regular file?)");

  // Read the header in growing steps: the first bytes say how long it is.
  std::vector<std::byte> head;
  std::size_t need = 64;
  std::optional<Header> h;
  while (true) {
    const std::size_t want = std::min<std::size_t>(need, static_cast<std::size_t>(file_size));
    const std::size_t have = head.size();
    if (want > have) {
      head.resize(want);
      in.read(reinterpret_cast<char*>(head.data() + have), static_cast<std::streamsize>(want - have));
      if (!in) throw Error(path, "read error");
    }
    h = parse_header(head.data(), head.size(), path, &need);
    if (h) break;
    if (need <= head.size() || static_cast<std::uint64_t>(file_size) < need)
      throw Error(path, "truncated .npy file: " + std::to_string(file_size) + " bytes, header needs " +
                            std::to_string(need));
  }
  check_data_size(*h, static_cast<std::uint64_t>(file_size) - h->data_offset, path);

  NpyArray a = make_array(*h);
  a.data.resize(static_cast<std::size_t>(h->data_bytes));
  const std::size_t from_head = std::min(head.size() - h->data_offset, a.data.size());
  if (from_head > 0) std::memcpy(a.data.data(), head.data() + h->data_offset, from_head);
  in.read(reinterpret_cast<char*>(a.data.data() + from_head),
          static_cast<std::streamsize>(a.data.size() - from_head));
  if (a.data.size() > from_head && !in) throw Error(path, "read error in the data section");
  return a;
}

std::vector<std::byte> serialize_npy(const NpyArray& a) {
  std::int64_t n = 1;
  for (std::int64_t d : a.shape) {
    if (d < 0) throw Error("npy", "negative dimension in shape");
    if (__builtin_mul_overflow(n, d, &n)) throw Error("npy", "shape is too large");
  }
  if (static_cast<std::uint64_t>(n) * dtype_size(a.dtype) != a.data.size())
    throw Error("npy", "data size " + std::to_string(a.data.size()) + " does not match shape x dtype size");
  if (a.dtype == DType::bf16)
    throw Error("npy", "NumPy has no bfloat16 dtype: convert the array to f32 (or f16) before writing it");

  std::string dict = "{'descr': '" + a.descr() + "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < a.shape.size(); ++i) {
    dict += std::to_string(a.shape[i]);
    if (i + 1 < a.shape.size() || a.shape.size() == 1) dict += ",";
    if (i + 1 < a.shape.size()) dict += " ";
  }
  dict += "), }";
  // Pad with spaces so the data starts on a 64-byte boundary; the header ends with '\n'.
  std::size_t len_bytes = 2;
  std::size_t total = kMagicLen + 2 + len_bytes + dict.size() + 1;
  if (total + 63 > 65535 + kMagicLen + 2 + len_bytes) len_bytes = 4;
  total = kMagicLen + 2 + len_bytes + dict.size() + 1;
  const std::size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';

  std::vector<std::byte> out;
  out.reserve(padded + a.data.size());
  for (std::size_t i = 0; i < kMagicLen; ++i) out.push_back(static_cast<std::byte>(kMagic[i]));
  out.push_back(std::byte{static_cast<unsigned char>(len_bytes == 2 ? 1 : 2)});
  out.push_back(std::byte{0});
  const auto hl = static_cast<std::uint32_t>(dict.size());
  for (std::size_t i = 0; i < len_bytes; ++i) out.push_back(static_cast<std::byte>((hl >> (8 * i)) & 0xff));
  for (char c : dict) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), a.data.begin(), a.data.end());
  return out;
}

void write_npy(const std::string& path, const NpyArray& array) {
  const std::vector<std::byte> image = serialize_npy(array);
  detail::write_file_atomic(path, image.data(), image.size());
}

}  // namespace simdattn

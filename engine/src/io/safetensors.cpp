#include "simdattn/safetensors.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "core/element.hpp"
#include "core/text.hpp"
#include "io/file_io.hpp"
#include "io/json.hpp"
#include "simdattn/error.hpp"

namespace simdattn {
namespace {

using detail::shape_str;

// The spec's dtypes and their element sizes.
std::size_t dtype_bytes(const std::string& dtype) {
  static const std::pair<const char*, std::size_t> kDtypes[] = {
      {"BOOL", 1}, {"U8", 1},   {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2},  {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8},  {"U64", 8}};
  for (const auto& [name, size] : kDtypes)
    if (dtype == name) return size;
  return 0;
}

// Headers larger than this are refused before allocating for them (the format's own limit).
constexpr std::uint64_t kMaxHeader = 100u << 20;

// The header's JSON: an 8-byte little-endian length N, then N bytes of JSON. Sets header_len.
detail::JsonValue parse_header(const std::string& path, const std::byte* bytes, std::size_t size,
                            std::uint64_t& header_len) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(bytes[i]);
  if (n > size - 8)
    throw Error(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size - 8) +
                          " bytes after the length)");
  if (n > kMaxHeader)
    throw Error(path, "header length " + std::to_string(n) + " exceeds the format's 100 MiB limit");
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  detail::JsonValue header;
  try {
    header = detail::parse_json(std::string_view(text, n));
  } catch (const detail::JsonError& e) {
    throw Error(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw Error(path, "header is not a JSON object");
  header_len = n;
  return header;
}

// The shape of one tensor entry: integers >= 0 whose product fits. Sets numel.
std::vector<std::int64_t> parse_shape(const std::string& path, const std::string& where,
                                      const detail::JsonValue& shape, std::uint64_t& numel) {
  std::vector<std::int64_t> dims;
  numel = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::optional<std::uint64_t> d = shape[i].as_uint64();
    if (!d) throw Error(path, where + ": shape " + shape.brief() + " must hold integers >= 0");
    const std::uint64_t dim = *d;
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        __builtin_mul_overflow(numel, dim, &numel))
      throw Error(path, where + ": shape " + shape.brief() + " overflows");
    dims.push_back(static_cast<std::int64_t>(dim));
  }
  return dims;
}

// One tensor entry, checked against the data section [data, data + data_size). Sets its
// [begin, end) offsets.
SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const detail::JsonValue& entry,
                             const std::byte* data, std::uint64_t data_size, std::uint64_t& begin, std::uint64_t& end) {
  const std::string where = "tensor '" + name + "'";
  if (!entry.is_object()) throw Error(path, where + ": entry is not a JSON object");
  const detail::JsonValue* dtype = entry.find("dtype");
  const detail::JsonValue* shape = entry.find("shape");
  const detail::JsonValue* off = entry.find("data_offsets");
  if (dtype == nullptr || !dtype->is_string()) throw Error(path, where + ": missing or non-string \"dtype\"");
  if (shape == nullptr || !shape->is_array()) throw Error(path, where + ": missing or non-array \"shape\"");
  if (off == nullptr || !off->is_array() || off->size() != 2)
    throw Error(path, where + ": \"data_offsets\" must be an array [begin, end]");
  SafetensorsEntry t;
  t.dtype = dtype->string();
  const std::size_t esize = dtype_bytes(t.dtype);
  if (esize == 0) throw Error(path, where + ": unknown dtype '" + t.dtype + "'");
  std::uint64_t numel = 0;
  t.shape = parse_shape(path, where, *shape, numel);
  const std::optional<std::uint64_t> b = (*off)[0].as_uint64(), e = (*off)[1].as_uint64();
  if (!b || !e) throw Error(path, where + ": data_offsets " + off->brief() + " must be integers >= 0");
  begin = *b, end = *e;
  if (begin > end) throw Error(path, where + ": data_offsets " + off->brief() + " has begin > end");
  if (end > data_size)
    throw Error(path, where + ": data_offsets " + off->brief() + " run past the data section (" +
                          std::to_string(data_size) + " bytes)");
  std::uint64_t want = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(esize), &want))
    throw Error(path, where + ": shape " + shape_str(t.shape) + " of " + t.dtype + " needs more than 2^64 bytes");
  if (want != end - begin)
    throw Error(path, where + ": shape " + shape_str(t.shape) + " of " + t.dtype + " needs " + std::to_string(want) +
                          " bytes, data_offsets " + off->brief() + " span " + std::to_string(end - begin));
  t.data = data + begin;
  t.bytes = static_cast<std::size_t>(end - begin);
  return t;
}

// No overlaps: sorted by begin, each tensor ends before the next begins (empty ones excepted).
void check_no_overlap(const std::string& path, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& spans,
                      const std::vector<std::string>& names) {
  std::vector<std::size_t> order(spans.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return spans[a] < spans[b]; });
  std::uint64_t reach = 0;
  std::size_t reach_of = 0;
  for (std::size_t idx : order) {
    const auto [begin, end] = spans[idx];
    if (begin == end) continue;
    if (begin < reach) throw Error(path, "tensors '" + names[reach_of] + "' and '" + names[idx] + "' overlap");
    reach = end;
    reach_of = idx;
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = detail::open_regular_file(path, size_);
  try {
    if (size_ < 8)
      throw Error(path, "file of " + std::to_string(size_) +
                            " bytes is too short for a safetensors header (8-byte length + JSON)");
    // The header through pread (checked against the file's size first, then read whole); the
    // mapping only gives SafetensorsEntry::data its address.
    std::byte len[8];
    detail::read_exact(fd_, path, 0, 8, len, "the header length");
    std::uint64_t claimed = 0;
    for (int i = 7; i >= 0; --i) claimed = (claimed << 8) | static_cast<std::uint64_t>(len[i]);
    std::vector<std::byte> head(8 + static_cast<std::size_t>(std::min<std::uint64_t>(claimed, std::min<std::uint64_t>(size_ - 8, kMaxHeader))));
    std::memcpy(head.data(), len, 8);
    detail::read_exact(fd_, path, 8, head.size() - 8, head.data() + 8, "the header");
    std::uint64_t n = 0;
    // (parse_header refuses a length past the file or the 100 MiB limit before reading the text)
    const detail::JsonValue header = parse_header(path, head.data(), size_, n);
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      throw Error(path, std::string("cannot map: ") + std::strerror(errno));
    }
    const auto* bytes = static_cast<const std::byte*>(map_);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;  // [begin, end) per tensor
    std::vector<std::string> span_names;
    for (std::size_t i = 0; i < header.size(); ++i) {
      const std::string& name = header.key(i);
      const detail::JsonValue& entry = header[i];
      if (name == "__metadata__") {
        if (!entry.is_object()) throw Error(path, "__metadata__ is not a JSON object");
        for (std::size_t m = 0; m < entry.size(); ++m) {
          if (!entry[m].is_string()) throw Error(path, "__metadata__ value of '" + entry.key(m) + "' is not a string");
          metadata_[entry.key(m)] = entry[m].string();
        }
        continue;
      }
      std::uint64_t begin = 0, end = 0;
      tensors_.emplace(name, parse_entry(path, name, entry, bytes + 8 + n, size_ - 8 - n, begin, end));
      spans.emplace_back(begin, end);
      span_names.push_back(name);
    }
    check_no_overlap(path, spans, span_names);
  } catch (...) {
    if (map_ != nullptr) ::munmap(map_, size_);
    map_ = nullptr;
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
  ::close(fd_);
}

template <class T>
std::vector<T> SafetensorsFile::read(const std::string& name, const std::vector<std::int64_t>& shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(path_, "no tensor named '" + name + "'");
  const SafetensorsEntry& t = it->second;
  if (t.shape != shape)
    throw Error(path_, "tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(shape));
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  std::vector<T> out(n);
  // The tensor's bytes through pread, in chunks (a file truncated since it was opened is an
  // Error, not SIGBUS), each element of the file's dtype S as T: kept when S is T, else rounded
  // once to nearest even.
  const std::uint64_t offset = static_cast<std::uint64_t>(t.data - static_cast<const std::byte*>(map_));
  auto convert = [&]<class S>(S) {
    constexpr std::size_t kChunk = 1 << 16;  // elements per read
    std::vector<S> buf(std::min(n, kChunk));
    for (std::size_t i0 = 0; i0 < n; i0 += kChunk) {
      const std::size_t m = std::min(kChunk, n - i0);
      detail::read_exact(fd_, path_, offset + i0 * sizeof(S), m * sizeof(S), buf.data(), "tensor '" + name + "'");
      for (std::size_t i = 0; i < m; ++i) out[i0 + i] = detail::narrow<T>(detail::widen(buf[i]));
    }
  };
  if (t.dtype == "F32") convert(float{});
  else if (t.dtype == "F64") convert(double{});
  else if (t.dtype == "BF16") convert(bfloat16{});
  else if (t.dtype == "F16") convert(float16{});
  else throw Error(path_, "tensor '" + name + "' has dtype " + t.dtype + ", expected F32, F64, BF16 or F16");
  return out;
}

template std::vector<float> SafetensorsFile::read<float>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<double> SafetensorsFile::read<double>(const std::string&, const std::vector<std::int64_t>&) const;
template std::vector<bfloat16> SafetensorsFile::read<bfloat16>(const std::string&,
                                                              const std::vector<std::int64_t>&) const;
template std::vector<float16> SafetensorsFile::read<float16>(const std::string&, const std::vector<std::int64_t>&) const;

void write_safetensors(const std::string& path, const std::map<std::string, SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // The header's text, written directly: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],
  // "data_offsets":[begin,end]},...}, tensors in name order, packed in that order.
  auto quote = [&](const std::string& s, const std::string& what) {
    try {
      return detail::json_quote(s);
    } catch (const detail::JsonError& e) {
      throw Error(path, "cannot write the header: " + what + " is not UTF-8 (" + e.what() + ")");
    }
  };
  std::string text = "{";
  if (!metadata.empty()) {
    text += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (text.back() != '{') text += ',';
      text += quote(key, "a __metadata__ key");
      text += ':';
      text += quote(value, "__metadata__ value of '" + key + "'");
    }
    text += "}";
  }
  std::uint64_t offset = 0;
  std::vector<std::uint64_t> sizes;  // each tensor's bytes, in the header's (name) order
  sizes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw Error(path, "'__metadata__' is reserved and cannot name a tensor");
    const char* dtype = t.dtype == DType::f32    ? "F32"
                        : t.dtype == DType::f64  ? "F64"
                        : t.dtype == DType::bf16 ? "BF16"
                        : t.dtype == DType::f16  ? "F16"
                                                 : nullptr;
    if (dtype == nullptr)
      throw Error(path, "tensor '" + name + "': only f32, f64, bf16 and f16 can be written, got " +
                            std::string(dtype_name(t.dtype)));
    std::uint64_t bytes = dtype_size(t.dtype);
    for (std::int64_t d : t.shape) {
      if (d < 0) throw Error(path, "tensor '" + name + "': negative dimension in " + shape_str(t.shape));
      if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes))
        throw Error(path, "tensor '" + name + "': shape " + shape_str(t.shape) + " overflows");
    }
    if (bytes > 0 && t.data == nullptr) throw Error(path, "tensor '" + name + "': null data");
    std::uint64_t end = 0;
    if (__builtin_add_overflow(offset, bytes, &end)) throw Error(path, "tensors too large for one file");
    if (text.back() != '{') text += ',';
    text += quote(name, "tensor name '" + name + "'");
    text += ":{\"dtype\":\"";
    text += dtype;
    text += "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i > 0) text += ',';
      text += std::to_string(t.shape[i]);
    }
    text += "],\"data_offsets\":[";
    text += std::to_string(offset);
    text += ',';
    text += std::to_string(end);
    text += "]}";
    sizes.push_back(bytes);
    offset = end;
  }
  text += "}";
  while ((text.size() + 8) % 8 != 0) text += ' ';  // align the data section to 8 bytes
  std::vector<std::byte> image(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(image.data() + 8, text.data(), text.size());
  std::byte* data = image.data() + 8 + text.size();
  auto size = sizes.begin();
  for (const auto& [name, t] : tensors) {  // packed in the same order as the header's offsets
    if (*size > 0) std::memcpy(data, t.data, *size);
    data += *size++;
  }
  detail::write_file_atomic(path, image.data(), image.size());
}

}  // namespace simdattn

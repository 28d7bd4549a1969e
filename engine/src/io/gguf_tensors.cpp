// GgufFile::read (io/gguf.hpp): a tensor's elements from F32, F16, BF16 or Q8_0, read with
// pread in chunks and converted once to the caller's element type.
#include <algorithm>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "io/file_io.hpp"
#include "io/gguf.hpp"
#include "simdattn/error.hpp"
#include "simdattn/half.hpp"

namespace simdattn::detail {
namespace {

std::uint16_t u16_at(const unsigned char* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

// One element of a plain type, little-endian at p, as double.
double element_at(std::uint32_t type, const unsigned char* p) {
  switch (type) {
    case kGgmlF16: return widen(float16{u16_at(p)});
    case kGgmlBF16: return widen(bfloat16{u16_at(p)});
    default: {  // F32
      const std::uint32_t u = p[0] | (p[1] << 8) | (p[2] << 16) | (std::uint32_t{p[3]} << 24);
      return detail::bits_float(u);
    }
  }
}

}  // namespace

template <class T>
std::vector<T> GgufFile::read(const GgufTensor& t) const {
  const std::uint32_t id = t.type.id;
  if (id != kGgmlF32 && id != kGgmlF16 && id != kGgmlBF16 && id != kGgmlQ8_0)
    throw Error(path_, "tensor '" + t.name + "' has type " + t.type.name + "; F32, F16, BF16 and Q8_0 can be read");
  std::vector<T> out(static_cast<std::size_t>(t.elements));
  const std::string what = "tensor '" + t.name + "'";
  // a chunk of whole blocks at a time (a block: one element, or Q8_0's 32)
  const std::uint64_t block = t.type.block, block_bytes = t.type.block_bytes;
  constexpr std::uint64_t kChunkBytes = 1 << 18;
  const std::uint64_t blocks_per_chunk = std::max<std::uint64_t>(1, kChunkBytes / block_bytes);
  const std::uint64_t blocks = t.elements / block;
  std::vector<unsigned char> buf(static_cast<std::size_t>(std::min(blocks, blocks_per_chunk) * block_bytes));
  for (std::uint64_t b0 = 0; b0 < blocks; b0 += blocks_per_chunk) {
    const std::uint64_t nb = std::min(blocks_per_chunk, blocks - b0);
    read_exact(fd_, path_, t.offset + b0 * block_bytes, static_cast<std::size_t>(nb * block_bytes), buf.data(), what);
    T* dst = out.data() + b0 * block;
    if (id == kGgmlQ8_0) {
      // block_q8_0: an f16 scale d, then 32 int8 q; each value d * q in f32 (ggml's dequantization)
      for (std::uint64_t b = 0; b < nb; ++b) {
        const unsigned char* p = buf.data() + b * block_bytes;
        const float d = to_float(float16{u16_at(p)});
        for (std::uint64_t j = 0; j < 32; ++j)
          dst[b * 32 + j] = narrow<T>(d * static_cast<float>(static_cast<std::int8_t>(p[2 + j])));
      }
    } else {
      for (std::uint64_t i = 0; i < nb; ++i) dst[i] = narrow<T>(element_at(id, buf.data() + i * block_bytes));
    }
  }
  return out;
}

template std::vector<float> GgufFile::read<float>(const GgufTensor&) const;
template std::vector<double> GgufFile::read<double>(const GgufTensor&) const;
template std::vector<bfloat16> GgufFile::read<bfloat16>(const GgufTensor&) const;
template std::vector<float16> GgufFile::read<float16>(const GgufTensor&) const;

}  // namespace simdattn::detail

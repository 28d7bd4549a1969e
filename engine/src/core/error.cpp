// Error messages as printable text (simdattn/error.hpp).
#include "simdattn/error.hpp"

#include <cstddef>

#include "core/text.hpp"

namespace simdattn::detail {

std::string shape_str(std::span<const std::int64_t> dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

std::string printable(const std::string& s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = 0;  // length of a valid UTF-8 sequence starting here, 0 if none
    if (c >= 0x20 && c < 0x7f) len = 1;
    else if (c >= 0xc2 && c <= 0xf4) {
      const std::size_t n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      len = n;
      for (std::size_t j = 1; j < n; ++j)
        if (i + j >= s.size() || (static_cast<unsigned char>(s[i + j]) & 0xc0) != 0x80) len = 0;
      if (len != 0) {  // no overlong forms, surrogates or code points past U+10FFFF
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
            (c == 0xf4 && c1 >= 0x90))
          len = 0;
      }
    }
    if (len == 0) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
      ++i;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace simdattn::detail

// A fuzzer's input read as a stream of small numbers (fuzz_attention, fuzz_paged, fuzz_pool,
// fuzz_linear), tensor views over a fuzzer's fixed buffers with shapes and strides the input
// chooses, and the buffers compared byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simdattn/tensor.hpp"

struct Bytes {
  const std::uint8_t* p;
  std::size_t n;
  // The next byte modulo `mod`; 0 once the input is used up.
  unsigned next(unsigned mod) {
    if (n == 0) return 0;
    --n;
    return *p++ % mod;
  }
  // A number in [lo, hi] (hi - lo < 256).
  std::int64_t in(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next(static_cast<unsigned>(hi - lo + 1)));
  }
};

// A view of `buf + offset` (a buffer of `elems` elements of 8 bytes) with the given shape and,
// sometimes, strides of the input's choosing (0 = broadcast); an empty view if it would reach past
// the buffer (the library cannot know a caller's buffer sizes) or a dimension is negative.
template <class View, class T>
View fuzz_view(Bytes& in, T* buf, std::size_t elems, simdattn::DType t, const simdattn::Shape4& shape,
               std::size_t offset = 0, unsigned odds = 4) {
  static_assert(sizeof(T) == 8);
  simdattn::Shape4 strides = simdattn::contiguous_strides(shape);
  if (in.next(odds) == 0)
    for (auto& s : strides) s = in.next(40);
  std::size_t reach = 1;
  for (int i = 0; i < 4; ++i) {
    if (shape[i] < 0) return View{};
    if (shape[i] > 0) reach += static_cast<std::size_t>((shape[i] - 1) * strides[i]);
  }
  if (offset > elems || reach * simdattn::dtype_size(t) > (elems - offset) * 8) return View{};
  return View(buf + offset, t, shape, strides);
}

// Whether two of a fuzzer's buffers hold the same bytes (its doubles may hold any bits: NaN ones
// would compare unequal to themselves).
inline bool same_bytes(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Shared by every kernel header in impl/: the batch type, what the ISA has (AVX-512, a hardware
// FMA), partial-vector loads and stores, the horizontal max and the element-wise map loop.
//
// The headers in impl/ are included only by kernels_<isa>.cpp, through tables.hpp: everything
// in them is compiled with the including file's ISA flags. Every function is a template on
// Arch, so no two ISAs' builds share a symbol and the linker cannot fold an AVX-512 body into
// the baseline path (the one exception, pack.hpp's transpose16x16, exists only in the AVX-512
// build).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

namespace simdattn::simd::impl {

template <class T, class Arch> using batch = xsimd::batch<T, Arch>;

template <class Arch> constexpr bool kHasAvx512 = std::is_base_of_v<xsimd::avx512f, Arch>;
// A fused multiply-add in hardware (SSE2's xsimd::fma rounds the product first).
template <class Arch>
constexpr bool kHasFma = kHasAvx512<Arch> || std::is_base_of_v<xsimd::fma3<xsimd::avx2>, Arch>;

// The first n < W elements of p into a batch, `fill` in the other lanes; and the reverse. On
// AVX-512 these are single masked loads/stores, elsewhere a trip through a stack buffer.
template <class Arch, class T>
inline batch<T, Arch> load_tail(const T* p, std::int64_t n, T fill) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_loadu_ps(B(fill), static_cast<unsigned short>((1u << n) - 1), p);
    else return _mm512_mask_loadu_pd(B(fill), static_cast<unsigned char>((1u << n) - 1), p);
  } else {
    alignas(64) T buf[B::size];
    for (std::size_t i = 0; i < B::size; ++i) buf[i] = static_cast<std::int64_t>(i) < n ? p[i] : fill;
    return B::load_aligned(buf);
  }
}
// Lanes n and above of v replaced by `value`.
template <class Arch, class T>
inline batch<T, Arch> blend_tail(const batch<T, Arch>& v, std::int64_t n, T value) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_blend_ps(static_cast<unsigned short>((1u << n) - 1), B(value), v);
    else return _mm512_mask_blend_pd(static_cast<unsigned char>((1u << n) - 1), B(value), v);
  } else {
    alignas(64) T buf[B::size];
    v.store_aligned(buf);
    for (std::size_t i = static_cast<std::size_t>(n); i < B::size; ++i) buf[i] = value;
    return B::load_aligned(buf);
  }
}

template <class Arch, class T>
inline void store_tail(T* p, std::int64_t n, const batch<T, Arch>& v) {
  using B = batch<T, Arch>;
  if constexpr (kHasAvx512<Arch>) {
    if constexpr (sizeof(T) == 4) _mm512_mask_storeu_ps(p, static_cast<unsigned short>((1u << n) - 1), v);
    else _mm512_mask_storeu_pd(p, static_cast<unsigned char>((1u << n) - 1), v);
  } else {
    alignas(64) T buf[B::size];
    v.store_aligned(buf);
    for (std::int64_t i = 0; i < n; ++i) p[i] = buf[i];
  }
}

template <class Arch, class T>
inline T hmax(const batch<T, Arch>& v) {
  alignas(64) T buf[batch<T, Arch>::size];
  v.store_aligned(buf);
  T m = buf[0];
  for (std::size_t i = 1; i < batch<T, Arch>::size; ++i) m = buf[i] > m ? buf[i] : m;
  return m;
}

// y[i] = f(x[i]) for a batch function f; y may equal x.
template <class Arch, class T, class F>
inline void map_array(const T* x, T* y, std::int64_t n, F f) {
  using B = batch<T, Arch>;
  constexpr std::int64_t W = B::size;
  std::int64_t i = 0;
  for (; i + W <= n; i += W) f(B::load_unaligned(x + i)).store_unaligned(y + i);
  if (i < n)  // the same arithmetic as the main loop, on a partial vector
    store_tail<Arch, T>(y + i, n - i, f(load_tail<Arch, T>(x + i, n - i, T(0))));
}

}  // namespace simdattn::simd::impl

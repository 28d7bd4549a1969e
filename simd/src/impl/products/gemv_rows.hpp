// Products of a few rows with a streamed B (RowsKernels, kernels.hpp): a decode step's grouped
// query heads as one matrix X of m <= kMaxProductRows rows, so that each row of K and V is read
// once for all of them (vLLM and SGLang fold a group's heads into one product the same way).
//   dot:       S[r, j] = alpha * scale_j * X[r, :] . B[j, :]      (scores: K's rows)
//   weighted:  Y[r, :] = alpha * sum_p X[r, p] * scale_p * B[p, :] + beta * Y[r, :]   (P V)
// B is f32, f64, bf16 / f16 (widened as loaded) or 8-bit codes (widened in registers, E4M3's
// factor 256 folded into alpha), read by the loaders below. Accumulators tile keys x rows (dot)
// or rows x column vectors (weighted) so that the loaded B vectors are used m times each from
// registers: at most 16 (8 without AVX-512's 32 registers). Short B rows are fetched ahead as
// gemv.hpp's kernels fetch them, B's own rows and then the first rows of the B the caller reads
// next (`next`: a paged cache's next block), never the rows that follow B in memory: past a
// paged cache's block they are another head's or another sequence's (fetching them cost a
// quarter more traffic over blocks of 64 rows).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "impl/batch.hpp"
#include "impl/convert/quant8.hpp"
#include "impl/products/gemv.hpp"
#include "impl/convert/widen16.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::simd::impl {

// How the rows kernels read B: E its element, C the type computed in, W elements as a batch of C
// (load), 2W as two where a pair widens in fewer steps (load2, called only where pairs is set),
// one element (one), and the factor the loads fall short by (fold: E4M3's 256; an integer because
// clang 14 takes no floating-point template arguments).
template <class Arch, class E_, class C_, batch<C_, Arch> (*Load)(const E_*), C_ (*One)(E_), int Fold,
          void (*Load2)(const E_*, batch<C_, Arch>&, batch<C_, Arch>&) = nullptr>
struct RowsOf {
  using E = E_;
  using C = C_;
  static batch<C, Arch> load(const E* p) { return Load(p); }
  static constexpr bool pairs = Load2 != nullptr;
  static void load2(const E* p, batch<C, Arch>& lo, batch<C, Arch>& hi) { Load2(p, lo, hi); }
  static C one(E e) { return One(e); }
  static constexpr C fold = C(Fold);
};
template <class Arch, class T>
batch<T, Arch> load_plain(const T* p) {
  return batch<T, Arch>::load_unaligned(p);
}
template <class Arch, class T>
T as_is(T x) {
  return x;
}
template <class Arch, class T>
using PlainRows = RowsOf<Arch, T, T, &load_plain<Arch, T>, &as_is<Arch, T>, 1>;
template <class Arch, bool kBf16>
using HalfRows = RowsOf<Arch, std::uint16_t, float, &load16<Arch, kBf16>, &widen16<Arch, kBf16>, 1>;
template <class Arch, Code8 F>
using CodeRows = RowsOf<Arch, std::uint8_t, float, &load8<Arch, F>, &widen8<Arch, F>, int(kFold<F>), &load8x2<Arch, F>>;

#if defined(__AVX512F__)
// Lane i = the sum of v[i]'s lanes, for 16 batches (4 levels of shuffles and adds, 46
// instructions for 16 sums, where 16 horizontal adds take about 3 times as many). xsimd 8.1's
// haddp returns these sums in another order on AVX-512.
template <class Arch>
inline __m512 sum_lanes16(const __m512* v) {
  __m512 c[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)  // c[i]: lanes 0-7 the halves of v[2i] added, 8-15 of v[2i + 1]
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // x[i]: 128-bit lane q four partial sums of v[4i + q]
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // y[i]: lane q two partial sums of v[8i + q], then two of v[8i + 4 + q]
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // z: lane q holds the sums of v[q], v[4 + q], v[8 + q], v[12 + q]
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

// The sum of v's lanes in sum_lanes16's order (halves, quarters, pairs, then the last two), so
// that a score is the same whichever block of keys it is computed in.
template <class Arch>
inline float sum_lanes1(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
#endif

// A batch's lane sum, the same for every block of keys (sum_lanes16's order on AVX-512 f32).
template <class Arch, class C>
inline C sum_lanes(const batch<C, Arch>& v) {
#if defined(__AVX512F__)
  if constexpr (kHasAvx512<Arch> && sizeof(C) == 4) return sum_lanes1<Arch>(v);
#endif
  return xsimd::hadd(v);
}

// Fetches row r of B (n rows, ldb apart) into L1, or past B's end row r - n of the B that
// follows it (next; null: nothing).
template <class E>
__attribute__((always_inline)) inline void prefetch_row_of(const E* Bm, std::int64_t r, std::int64_t n, const E* next,
                                                          std::int64_t ldb, std::int64_t bytes) {
  if (r < n) prefetch_row(Bm, r, ldb, bytes);
  else if (next != nullptr) prefetch_row(next, r - n, ldb, bytes);
}

// x, held in a register: left free, GCC 12 folds the load of a value used NK times into each of
// its NK products (18 loads for the 16 products of a step of 8 rows x 2 keys; with x held, 10:
// the f32 8-row dot 0.93x the time).
template <class Arch, class C>
__attribute__((always_inline)) inline batch<C, Arch> in_register(batch<C, Arch> x) {
  asm("" : "+v"(x.data));
  return x;
}

// Accumulators a kernel keeps in registers.
template <class Arch>
constexpr int kRowsAccumulators = kHasAvx512<Arch> ? 16 : 8;

// Keys [j, j + NK) of the dot product for M rows: NK x M accumulators over k, then each sum
// (sixteen f32 ones reduced together on AVX-512, in row-major order so that a row's NK scores
// go out as one masked store).
template <class Arch, class L, int M, int NK, bool kScaled>
__attribute__((always_inline)) inline void rows_dot_keys(std::int64_t j, std::int64_t n, std::int64_t k, typename L::C alpha,
                                                        const typename L::C* X, std::int64_t ldx, const typename L::E* Bm,
                                                        std::int64_t ldb, const float* scale, std::int64_t ss,
                                                        typename L::C* S, std::int64_t lds, const typename L::E* next) {
  using C = typename L::C;
  using V = batch<C, Arch>;
  constexpr std::int64_t W = V::size;
  const std::int64_t kv = k / W * W;
  const typename L::E* b = Bm + j * ldb;
  const std::int64_t row_bytes = k * static_cast<std::int64_t>(sizeof(typename L::E));
  if (row_bytes <= kGemvPrefetchMaxRowBytes)
    for (int q = 0; q < NK; ++q) prefetch_row_of(Bm, j + kGemvPrefetchRows + q, n, next, ldb, row_bytes);
  V acc[M][NK];
  for (int r = 0; r < M; ++r)
    for (int q = 0; q < NK; ++q) acc[r][q] = V(C(0));
  std::int64_t p = 0;
  if constexpr (L::pairs)  // 2W codes a row widened together; each accumulator's order as below
    for (; p + 2 * W <= kv; p += 2 * W)
      for (int q = 0; q < NK; ++q) {
        V lo, hi;
        L::load2(b + q * ldb + p, lo, hi);
        for (int r = 0; r < M; ++r) {
          acc[r][q] = xsimd::fma(V::load_unaligned(X + r * ldx + p), lo, acc[r][q]);
          acc[r][q] = xsimd::fma(V::load_unaligned(X + r * ldx + p + W), hi, acc[r][q]);
        }
      }
  for (; p < kv; p += W) {
    V bv[NK];
    for (int q = 0; q < NK; ++q) bv[q] = L::load(b + q * ldb + p);
    for (int r = 0; r < M; ++r) {
      const V x = in_register(V::load_unaligned(X + r * ldx + p));
      for (int q = 0; q < NK; ++q) acc[r][q] = xsimd::fma(x, bv[q], acc[r][q]);
    }
  }
  auto tail = [&](int r, int q) {
    C t = C(0);
    for (std::int64_t e = kv; e < k; ++e) t = std::fma(X[r * ldx + e], L::one(b[q * ldb + e]), t);
    return t;
  };
  auto factor = [&](int q) { return kScaled ? alpha * C(scale[(j + q) * ss]) : alpha; };
#if defined(__AVX512F__)
  if constexpr (kHasAvx512<Arch> && sizeof(C) == 4 && M * NK == 16) {
    __m512 all[16];
    for (int r = 0; r < M; ++r)
      for (int q = 0; q < NK; ++q) all[r * NK + q] = acc[r][q];
    __m512 sums = sum_lanes16<Arch>(all);  // lane r * NK + q: row r, key j + q
    if (kv < k) {
      alignas(64) float t[16];
      for (int r = 0; r < M; ++r)
        for (int q = 0; q < NK; ++q) t[r * NK + q] = tail(r, q);
      sums = _mm512_add_ps(sums, _mm512_load_ps(t));
    }
    alignas(64) float f[16];
    for (int q = 0; q < NK; ++q) f[q] = factor(q);
    for (int r = 1; r < M; ++r)
      for (int q = 0; q < NK; ++q) f[r * NK + q] = f[q];
    sums = _mm512_mul_ps(sums, _mm512_load_ps(f));
    const auto row_mask = static_cast<__mmask16>((1u << NK) - 1u);
    for (int r = 0; r < M; ++r)  // lanes r * NK .. + NK - 1 moved down to lane 0 and stored
      _mm512_mask_storeu_ps(S + r * lds + j, row_mask,
                            r == 0 ? sums : _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(r * NK),
                                                                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8,
                                                                                                     9, 10, 11, 12, 13, 14, 15)),
                                                                  sums));
    return;
  }
#endif
  for (int r = 0; r < M; ++r)
    for (int q = 0; q < NK; ++q) S[r * lds + j + q] = factor(q) * (sum_lanes<Arch, C>(acc[r][q]) + tail(r, q));
}

// Keys per block of the dot product for M rows: M x NK accumulators, sixteen where M divides 16.
template <class Arch, int M>
constexpr int rows_dot_keys_per_block() {
  return std::max(1, std::min(16, kRowsAccumulators<Arch> / M));
}

template <class Arch, class L, int M>
void rows_dot(std::int64_t n, std::int64_t k, typename L::C alpha, const typename L::C* X, std::int64_t ldx,
              const void* B, std::int64_t ldb, const float* scale, std::int64_t ss, typename L::C* S, std::int64_t lds,
              const void* next_b) {
  constexpr int NK = rows_dot_keys_per_block<Arch, M>();
  const auto* Bm = static_cast<const typename L::E*>(B);
  const auto* next = static_cast<const typename L::E*>(next_b);
  alpha *= L::fold;
  std::int64_t j = 0;
  if (scale != nullptr) {
    for (; j + NK <= n; j += NK) rows_dot_keys<Arch, L, M, NK, true>(j, n, k, alpha, X, ldx, Bm, ldb, scale, ss, S, lds, next);
    for (; j < n; ++j) rows_dot_keys<Arch, L, M, 1, true>(j, n, k, alpha, X, ldx, Bm, ldb, scale, ss, S, lds, next);
  } else {
    for (; j + NK <= n; j += NK) rows_dot_keys<Arch, L, M, NK, false>(j, n, k, alpha, X, ldx, Bm, ldb, scale, ss, S, lds, next);
    for (; j < n; ++j) rows_dot_keys<Arch, L, M, 1, false>(j, n, k, alpha, X, ldx, Bm, ldb, scale, ss, S, lds, next);
  }
}

// Columns [c, c + NV * W) of the weighted sum for M rows: M x NV accumulators over the k rows of
// B. The first columns' pass (first) fetches each whole row ahead for the passes after it: of
// the `left` rows B has from here, then of next's.
template <class Arch, class L, int M, int NV, bool kScaled, bool kT>
__attribute__((always_inline)) inline void rows_weighted_cols(std::int64_t c, bool first, std::int64_t left, std::int64_t n, std::int64_t k,
                                                             typename L::C alpha, const typename L::C* X, std::int64_t ldx,
                                                             const typename L::E* Bm, std::int64_t ldb,
                                                             const float* scale, std::int64_t ss, typename L::C beta,
                                                             typename L::C* Y, std::int64_t ldy, const typename L::E* next) {
  using C = typename L::C;
  using V = batch<C, Arch>;
  constexpr std::int64_t W = V::size;
  // alpha 1 (the decode paths' sums): Y starts the chain, so that a sum over keys split into
  // calls (a paged cache's blocks) is the one sum over them all, to the bit
  const bool carry = alpha == C(1) && beta != C(0);
  V acc[M][NV];
  for (int r = 0; r < M; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = carry ? V::load_unaligned(Y + r * ldy + c + v * W) * V(beta) : V(C(0));
  const typename L::E* row = Bm + c;
  const std::int64_t ahead = first ? n * static_cast<std::int64_t>(sizeof(typename L::E)) : 0;
  for (std::int64_t p = 0; p < k; ++p, row += ldb) {
    if (ahead > 0) prefetch_row_of(Bm, p + kGemvPrefetchRows, left, next, ldb, ahead);
    V bv[NV];
    int v0 = 0;
    if constexpr (L::pairs)
      for (; v0 + 2 <= NV; v0 += 2) L::load2(row + v0 * W, bv[v0], bv[v0 + 1]);
    for (int v = v0; v < NV; ++v) bv[v] = L::load(row + v * W);
    if constexpr (kScaled) {
      const C s = C(scale[p * ss]);
      for (int v = 0; v < NV; ++v) bv[v] *= V(s);
    }
    for (int r = 0; r < M; ++r) {
      const V x(kT ? X[p * M + r] : X[r * ldx + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = xsimd::fma(x, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < M; ++r)
    for (int v = 0; v < NV; ++v) {
      C* y = Y + r * ldy + c + v * W;
      if (carry) {
        acc[r][v].store_unaligned(y);
        continue;
      }
      const V out = acc[r][v] * V(alpha);
      (beta == C(0) ? out : xsimd::fma(V::load_unaligned(y), V(beta), out)).store_unaligned(y);
    }
}

// B's rows in blocks of at most kRowsBlockBytes (in L1): each column pass of a block reads its
// rows from there, so that a B of many rows (a long sequence's V) is read from memory once, not
// once per pass (the passes of a whole 16384-row V each streamed it: 2.2x the time of one).
constexpr std::int64_t kRowsBlockBytes = 32768;
// Several rows over several column passes read X's block transposed ([p][M], copied once a
// block): a row's M weights are then one address's neighbours, where M row pointers left too few
// registers for the loop (8 rows of f32 over 128 columns, L2-resident: 0.85x the time of the untransposed).
constexpr std::int64_t kRowsTransposeRows = 64;

template <class Arch, class L, int M, bool kScaled>
void rows_weighted_scaled(std::int64_t n, std::int64_t k, typename L::C alpha, const typename L::C* X, std::int64_t ldx,
                          const typename L::E* Bm, std::int64_t ldb, const float* scale, std::int64_t ss,
                          typename L::C beta, typename L::C* Y, std::int64_t ldy, const typename L::E* next) {
  using C = typename L::C;
  constexpr std::int64_t W = batch<C, Arch>::size;
  constexpr int NV = std::max(1, std::min(4, kRowsAccumulators<Arch> / M));
  constexpr bool kT = M > 1;
  const bool transpose = kT && n > NV * W;
  std::int64_t block = n <= NV * W ? k : std::max<std::int64_t>(16, kRowsBlockBytes / (n * static_cast<std::int64_t>(sizeof(typename L::E))));
  if (transpose) block = std::min(block, kRowsTransposeRows);
  alignas(64) C xt[kT ? kRowsTransposeRows * M : 1];
  for (std::int64_t p0 = 0; p0 < k || p0 == 0; p0 += block) {
    const std::int64_t kb = std::min(block, k - p0);
    const C b = p0 == 0 ? beta : C(1);  // later blocks add to the first's
    const typename L::E* rows = Bm + p0 * ldb;
    const C* x = X + p0;
    const float* sc = kScaled ? scale + p0 * ss : scale;
    if (transpose)
      for (std::int64_t p = 0; p < kb; ++p)
        for (int r = 0; r < M; ++r) xt[p * M + r] = x[r * ldx + p];
    std::int64_t c = 0;
    if (transpose) {
      for (; c + NV * W <= n; c += NV * W)
        rows_weighted_cols<Arch, L, M, NV, kScaled, kT>(c, c == 0, k - p0, n, kb, alpha, xt, M, rows, ldb, sc, ss, b, Y, ldy, next);
      for (; c + W <= n; c += W)
        rows_weighted_cols<Arch, L, M, 1, kScaled, kT>(c, c == 0, k - p0, n, kb, alpha, xt, M, rows, ldb, sc, ss, b, Y, ldy, next);
    }
    for (; c + NV * W <= n; c += NV * W)
      rows_weighted_cols<Arch, L, M, NV, kScaled, false>(c, c == 0, k - p0, n, kb, alpha, x, ldx, rows, ldb, sc, ss, b, Y, ldy, next);
    for (; c + W <= n; c += W)
      rows_weighted_cols<Arch, L, M, 1, kScaled, false>(c, c == 0, k - p0, n, kb, alpha, x, ldx, rows, ldb, sc, ss, b, Y, ldy, next);
    for (; c < n; ++c)
      for (int r = 0; r < M; ++r) {
        C& y = Y[r * ldy + c];
        const bool carry = alpha == C(1) && b != C(0);  // as rows_weighted_cols
        C s = carry ? y * b : C(0);
        // std::fma: one rounding a step whatever the compiler contracts, so that a column's sum
        // does not depend on how many zero weights follow (the visible keys of a causal row)
        for (std::int64_t p = 0; p < kb; ++p)
          s = std::fma(kScaled ? x[r * ldx + p] * C(sc[p * ss]) : x[r * ldx + p], L::one(rows[p * ldb + c]), s);
        y = carry ? s : b == C(0) ? alpha * s : alpha * s + b * y;
      }
    if (k == 0) break;
  }
}

template <class Arch, class L, int M>
void rows_weighted(std::int64_t n, std::int64_t k, typename L::C alpha, const typename L::C* X, std::int64_t ldx,
                   const void* B, std::int64_t ldb, const float* scale, std::int64_t ss, typename L::C beta,
                   typename L::C* Y, std::int64_t ldy, const void* next_b) {
  const auto* Bm = static_cast<const typename L::E*>(B);
  const auto* next = static_cast<const typename L::E*>(next_b);
  alpha *= L::fold;
  if (scale != nullptr) rows_weighted_scaled<Arch, L, M, true>(n, k, alpha, X, ldx, Bm, ldb, scale, ss, beta, Y, ldy, next);
  else rows_weighted_scaled<Arch, L, M, false>(n, k, alpha, X, ldx, Bm, ldb, scale, ss, beta, Y, ldy, next);
}

// The table entries: m (1 .. kMaxProductRows) to the kernel of that many rows.
template <class Arch, class L>
void rows_dot_any(int m, std::int64_t n, std::int64_t k, typename L::C alpha, const typename L::C* X, std::int64_t ldx,
                  const void* B, std::int64_t ldb, const float* scale, std::int64_t ss, typename L::C* S, std::int64_t lds,
                  const void* next) {
  static_assert(kMaxProductRows == 8);
  switch (m) {
    case 1: return rows_dot<Arch, L, 1>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 2: return rows_dot<Arch, L, 2>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 3: return rows_dot<Arch, L, 3>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 4: return rows_dot<Arch, L, 4>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 5: return rows_dot<Arch, L, 5>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 6: return rows_dot<Arch, L, 6>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    case 7: return rows_dot<Arch, L, 7>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
    default: return rows_dot<Arch, L, 8>(n, k, alpha, X, ldx, B, ldb, scale, ss, S, lds, next);
  }
}

template <class Arch, class L>
void rows_weighted_any(int m, std::int64_t n, std::int64_t k, typename L::C alpha, const typename L::C* X,
                       std::int64_t ldx, const void* B, std::int64_t ldb, const float* scale, std::int64_t ss,
                       typename L::C beta, typename L::C* Y, std::int64_t ldy, const void* next) {
  switch (m) {
    case 1: return rows_weighted<Arch, L, 1>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 2: return rows_weighted<Arch, L, 2>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 3: return rows_weighted<Arch, L, 3>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 4: return rows_weighted<Arch, L, 4>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 5: return rows_weighted<Arch, L, 5>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 6: return rows_weighted<Arch, L, 6>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    case 7: return rows_weighted<Arch, L, 7>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
    default: return rows_weighted<Arch, L, 8>(n, k, alpha, X, ldx, B, ldb, scale, ss, beta, Y, ldy, next);
  }
}

template <class Arch, class L>
RowsKernels<typename L::C> make_rows_kernels() {
  return {.dot = &rows_dot_any<Arch, L>, .weighted = &rows_weighted_any<Arch, L>};
}

}  // namespace simdattn::simd::impl

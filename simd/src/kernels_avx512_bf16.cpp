// AVX512-BF16 build: the AVX-512 table plus bf16 GEMM kernels on vdpbf16ps (gemm_bf16_pairs).
// Compiled with the AVX-512 flags and -mavx512bf16 (see simd/CMakeLists.txt).
//
// vdpbf16ps multiplies the bf16 pairs of two vectors and adds both products of each pair to an
// f32 lane: 32 multiply-adds per instruction where an f32 FMA does 16, reading the packed bf16
// B panel (pairs of k) as it is, with no conversion. On Intel's cores it issues at a quarter of
// the FMA rate, so there the table's gemm_bf16 stays AVX-512's; on AMD's at the FMA rate, so
// there gemm_bf16 is these kernels (bf16_pairs_preferred, isa.hpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "impl/products/tile_pairs.hpp"
#include "impl/softmax/softmax_tiles.hpp"
#include "impl/tables.hpp"
#include "simdattn/simd/isa.hpp"

namespace simdattn::simd {

KernelTable make_table_avx512();

namespace {

constexpr int kMr = 12;  // 12 x 32 tile: 24 accumulators + 2 B vectors + 1 A broadcast
constexpr int kNv = 2;   // vectors of 16 f32 columns (16 pairs of bf16 each)

// The pair layout's micro-kernel (kernels.hpp, Gemm16Kernels::pairs): per pair of k steps,
// two 64-byte loads of B's pairs, M broadcasts of A's pairs, M x 2 vdpbf16ps. Two pair steps a
// loop iteration, so the counter and pointer updates take fewer issue slots.
template <int M>
void bf16_pairs_ukernel(std::int64_t kc, const void* Ap_, const std::uint16_t* Bp, float* C, std::int64_t ldc,
                        float alpha, float beta) {
  const auto* Ap = static_cast<const std::uint32_t*>(Ap_);
  constexpr int NR = kNv * 16;
  const std::int64_t steps = (kc + 1) / 2;
  if constexpr (M == 1) {
    // One row (a decode step's projection): four chains of pair steps instead of one, which
    // would wait on the instruction's latency (guarded by decode/native/gpt-layer-kv4096.bf16).
    __m512 part[4][kNv];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u)
#pragma GCC unroll 2
      for (int j = 0; j < kNv; ++j) part[u][j] = _mm512_setzero_ps();
    auto pair_step = [&](int u, std::int64_t s) __attribute__((always_inline)) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(Ap[s * kMr]));
#pragma GCC unroll 2
      for (int j = 0; j < kNv; ++j)
        part[u][j] = _mm512_dpbf16_ps(
            part[u][j], a, (__m512bh)_mm512_load_si512(reinterpret_cast<const void*>(Bp + s * 2 * NR + j * 32)));
    };
    std::int64_t s = 0;
    for (; s + 4 <= steps; s += 4)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) pair_step(u, s + u);
    for (; s < steps; ++s) pair_step(0, s);
#pragma GCC unroll 2
    for (int j = 0; j < kNv; ++j) {
      const __m512 r = _mm512_mul_ps(
          _mm512_add_ps(_mm512_add_ps(part[0][j], part[1][j]), _mm512_add_ps(part[2][j], part[3][j])),
          _mm512_set1_ps(alpha));
      _mm512_storeu_ps(C + j * 16, beta == 0.0f ? r : _mm512_fmadd_ps(_mm512_loadu_ps(C + j * 16), _mm512_set1_ps(beta), r));
    }
    return;
  }
  __m512 acc[M][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < kNv; ++j) acc[i][j] = _mm512_setzero_ps();
  auto step = [&](std::int64_t s) __attribute__((always_inline)) {
    asm volatile("" ::: "memory");
    __m512bh b[kNv];
#pragma GCC unroll 2
    for (int j = 0; j < kNv; ++j)
      b[j] = (__m512bh)_mm512_load_si512(reinterpret_cast<const void*>(Bp + s * 2 * NR + j * 32));
#pragma GCC unroll 16
    for (int i = 0; i < M; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(Ap[s * kMr + i]));
#pragma GCC unroll 2
      for (int j = 0; j < kNv; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
    }
  };
  std::int64_t s = 0;
  for (; s + 2 <= steps; s += 2) {
    step(s);
    step(s + 1);
  }
  if (s < steps) step(s);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < kNv; ++j) {
      float* c = C + i * ldc + j * 16;
      const __m512 r = _mm512_mul_ps(acc[i][j], va);
      _mm512_storeu_ps(c, beta == 0.0f ? r : _mm512_fmadd_ps(_mm512_loadu_ps(c), vb, r));
    }
}

// f32 to bf16 on vcvtneps2bf16: nearest even, NaN kept quiet with its sign and top payload
// bits, as half.hpp. The instruction reads subnormal inputs as zero, so a vector holding one takes
// the AVX-512 integer rounding instead (bit for bit half.hpp's). One instruction where that takes
// eight, and vcvtne2ps2bf16 rounds two vectors in one: `attention/native/bert.bf16` writes its
// output through here (4096 values: 0.42 us on the integer rounding, 0.16 us here).
void narrow_bf16_row(const float* src, std::uint16_t* dst, std::int64_t n) {
  auto subnormal = [](__m512 x) { return _mm512_fpclass_ps_mask(x, 0x20); };  // class 0x20: denormal
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {  // two vectors into one (vcvtne2ps2bf16)
    const __m512 x0 = _mm512_loadu_ps(src + i), x1 = _mm512_loadu_ps(src + i + 16);
    if ((subnormal(x0) | subnormal(x1)) != 0) impl::narrow16_row<xsimd::avx512bw, true>(src + i, dst + i, 32);
    else _mm512_storeu_si512(dst + i, (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
  }
  for (; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    if (subnormal(x) != 0) impl::narrow16_row<xsimd::avx512bw, true>(src + i, dst + i, std::min<std::int64_t>(16, n - i));
    else _mm512_mask_storeu_epi16(dst + i, m, _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(x)));
  }
}

// Convert16Kernels::narrow_pairs on vcvtne2ps2bf16: 16 columns of two rows rounded in one
// instruction, then interleaved into pair words by one vpermw; the last columns and an odd last row
// (its pair's high half from a zero vector) through masked loads and stores; a block holding a
// subnormal goes through the integer rounding (as narrow_bf16_row). (The rule's K^T is written 12
// columns at a time: masked blocks only.)
void narrow_bf16_pairs(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::uint32_t* dst,
                       std::int64_t dst_ld) {
  auto subnormal = [](__m512 x) { return _mm512_fpclass_ps_mask(x, 0x20); };
  alignas(64) static constexpr std::uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                                8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  for (std::int64_t s = 0; 2 * s < rows; ++s) {
    const float* r0 = src + 2 * s * ld;
    const float* r1 = 2 * s + 1 < rows ? r0 + ld : nullptr;
    std::uint32_t* d = dst + s * dst_ld;
    for (std::int64_t c = 0; c < cols; c += 16) {
      const auto m = static_cast<__mmask16>(cols - c >= 16 ? 0xffffu : (1u << (cols - c)) - 1u);
      const __m512 x0 = _mm512_maskz_loadu_ps(m, r0 + c);
      const __m512 x1 = r1 != nullptr ? _mm512_maskz_loadu_ps(m, r1 + c) : _mm512_setzero_ps();
      if ((subnormal(x0) | subnormal(x1)) != 0) {
        impl::narrow16_pairs<xsimd::avx512bw, true>(r0 + c, ld, r1 != nullptr ? 2 : 1, std::min<std::int64_t>(16, cols - c), d + c,
                                                    dst_ld);
        continue;
      }
      _mm512_mask_storeu_epi32(d + c, m, _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(x1, x0)));
    }
  }
}

// `iterations` steps of kFmaChains independent vdpbf16ps chains (ProbeKernels::pairs_peak, the
// perf suite's peak/vdpbf16ps): pairs of 2^-7, so the sums stay small. Returns a value of every
// chain so the work cannot be dropped.
float pairs_peak(std::int64_t iterations) {
  constexpr int kChains = impl::kFmaChains;
  __m512 acc[kChains];
#pragma GCC unroll 16
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));  // distinct: not merged
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3c003c00), b = (__m512bh)_mm512_set1_epi32(0x3c003c00);
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace

KernelTable make_table_avx512_bf16() {
  KernelTable t = make_table_avx512();
  t.isa = Isa::avx512_bf16;
  t.convert_bf16.narrow = &narrow_bf16_row;
  t.convert_bf16.narrow_pairs = &narrow_bf16_pairs;
  t.gemm_bf16_pairs = {.mr = kMr,
                 .nr = kNv * 16,
                 .kc = 256,  // a 256-deep B panel of 32 bf16 columns (16 KiB) stays in L1
                 .mc = 336,  // the mc x kc block of A's pairs (336 KiB) stays in L2
                 .pairs = true,
                 .ukernel = impl::rows_table<Gemm16Ukernel, kMr>(
                     [](auto m) { return &bf16_pairs_ukernel<decltype(m)::value>; }),
                 .k_align = 2};  // an odd depth's last pair
  // The engine's bf16 GEMM (the layer's projections): vdpbf16ps where it is the faster of the
  // two (bf16_pairs_preferred, isa.hpp), else AVX-512's widening kernels.
  if (bf16_pairs_preferred()) t.gemm_bf16 = t.gemm_bf16_pairs;
  // The fused attention path's bf16 steps in the tiles' layouts, on vdpbf16ps: where it runs at
  // the FMA rate (twice the multiply-adds of the widened f32 products), else null (the path
  // widens to f32).
  t.tile_attention_pairs = {.softmax_rows = &impl::softmax_rows_to_tiles<false>,
                            .softmax_rows_lse = &impl::softmax_rows_to_tiles<true>,
                            .block = &impl::pairs_block,
                            .pack_a = &impl::pack_a_tiles,
                            .pair_rows = &impl::pair_rows_tiles,
                            .done = &impl::pairs_done};
  if (bf16_pairs_preferred()) t.tile_attention = t.tile_attention_pairs;
  t.probe.pairs_peak = &pairs_peak;
  return t;
}

}  // namespace simdattn::simd

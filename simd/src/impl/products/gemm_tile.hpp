// GEMM micro-kernels (the contract is in kernels.hpp: GemmUkernel and its variants): one
// register tile of C over a kc-deep loop (gemm_tile, in named steps), and the entry points
// the tables hold, one per variant and row count.
#pragma once

#include <cstdint>
#include <type_traits>

#include "impl/batch.hpp"

namespace simdattn::simd::impl {

// An MR x (NV vectors) tile of C is held in registers for the whole kc loop. Per k step: NV
// loads of the B row, MR broadcasts of A (folded into the FMA as a memory-broadcast operand),
// MR * NV independent FMAs. The k loop is unrolled 4x by hand: without it the loop counter and
// pointer updates take issue slots from the FMAs (guarded by gemm/native/1024x1024x1024/t1).
//
// The template parameters of the steps below:
// MR rows are computed. kPackedA: element (i, k) of the A tile is A[k * AS + i] (packed with
// panel height AS >= MR) or A[i * lda + k] (in place).
// kPackedB: B rows are kBS apart and 64-byte aligned (packed), else ldb apart (in place). (A
// compile-time B stride matters: with a runtime one GCC interleaves the unrolled steps and
// spills accumulators.)
// kBS: the packed B panel's row stride (its width), >= NV * W.

// With a short k loop the C tile's stores dominate: start fetching its lines (for writing) now
// so they arrive while the k loop runs (guarded by gemm/native/2048x2048x64/t1). With a long k
// loop the early lines only crowd L1 (guarded by gemm/native/1024x1024x1024/t1), so not then.
template <class Arch, class T, int MR, int NV>
__attribute__((always_inline)) inline void prefetch_c_tile(std::int64_t kc, T* C, std::int64_t ldc) {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  if (kc <= 128) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      __builtin_prefetch(C + i * ldc, 1);
      __builtin_prefetch(C + i * ldc + NV * W - 1, 1);
    }
  }
}

// acc += a * b, in the accumulating form (vfmadd231) on AVX-512. Left to choose, GCC 12 gives
// the later unrolled steps of a tile the forms that overwrite a source operand, then moves
// accumulators between registers and spills some (2 per four steps of the 12 x 32 f32 tile,
// more in the 6 x 64 in-place tile): with the form fixed, the 14 x 32 tile fits its 31
// registers (guarded by mha/native/llama-layer, whose attention core runs on that tile).
template <class Arch, class T>
__attribute__((always_inline)) inline void fma_into(batch<T, Arch>& acc, const batch<T, Arch>& a,
                                                    const batch<T, Arch>& b) {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    if constexpr (sizeof(T) == 4) asm("vfmadd231ps %2, %1, %0" : "+v"(acc.data) : "v"(a.data), "v"(b.data));
    else asm("vfmadd231pd %2, %1, %0" : "+v"(acc.data) : "v"(a.data), "v"(b.data));
    return;
  }
#endif
  acc = xsimd::fma(a, b, acc);
}

// One k step at offset u from the current A and B positions: acc += A column (u) x B row (u).
template <class Arch, class T, int MR, int NV, bool kPackedA, bool kPackedB, int AS, int kBS>
__attribute__((always_inline)) inline void tile_step(batch<T, Arch> (&acc)[MR][NV], const T* A, std::int64_t lda,
                                                     const T* Bp, std::int64_t ldb, std::int64_t u) {
  using B = batch<T, Arch>;
  constexpr int W = static_cast<int>(B::size);
  // Keep each step's loads inside the step: left free, GCC hoists the next steps' loads and
  // runs out of the 32 registers (spilled accumulators).
  asm volatile("" ::: "memory");
  if constexpr (!kPackedB) {
    // B's rows in place are too far apart for the hardware prefetchers (3 KiB for a 768-wide
    // B): fetch each 8 steps ahead (guarded by gemm/native/128x768x768/t1 and t2).
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      if ((j * W * sizeof(T)) % 64 == 0) __builtin_prefetch(Bp + (u + 8) * ldb + j * W, 0, 3);
  }
  B b[NV];
#pragma GCC unroll 4
  for (int j = 0; j < NV; ++j)
    b[j] = kPackedB ? B::load_aligned(Bp + u * kBS + j * W) : B::load_unaligned(Bp + u * ldb + j * W);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    const B a(kPackedA ? A[u * AS + i] : A[i * lda + u]);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) fma_into<Arch, T>(acc[i][j], a, b[j]);
  }
}

// C := alpha * acc + beta * C; beta == 0 never reads C.
template <class Arch, class T, int MR, int NV>
__attribute__((always_inline)) inline void store_tile(const batch<T, Arch> (&acc)[MR][NV], T* C, std::int64_t ldc,
                                                      T alpha, T beta) {
  using B = batch<T, Arch>;
  constexpr int W = static_cast<int>(B::size);
  const B va(alpha);
  if (beta == T(0)) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) (acc[i][j] * va).store_unaligned(C + i * ldc + j * W);
  } else {
    const B vb(beta);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        T* c = C + i * ldc + j * W;
        xsimd::fma(acc[i][j], va, B::load_unaligned(c) * vb).store_unaligned(c);
      }
  }
}

// The tile: zeroed accumulators, the k loop in steps of four (kPf: one prefetch, into L2, of
// the next of pf_lines lines from pf per four steps), then C. BS: the packed B panel's row
// stride, or -1 for NV * W.
template <class Arch, class T, int MR, int NV, bool kPackedA, bool kPackedB, int AS = MR, int BS = -1, bool kPf = false>
__attribute__((always_inline)) inline void gemm_tile(std::int64_t kc, const T* __restrict A, std::int64_t lda,
                                                     const T* __restrict Bp, std::int64_t ldb,
                                                     T* __restrict C, std::int64_t ldc, T alpha, T beta,
                                                     const char* pf = nullptr, std::int64_t pf_lines = 0) {
  using B = batch<T, Arch>;
  constexpr int W = static_cast<int>(B::size);
  constexpr int kBS = BS > 0 ? BS : NV * W;
  prefetch_c_tile<Arch, T, MR, NV>(kc, C, ldc);
  B acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = B(T(0));
  auto step = [&](std::int64_t u) __attribute__((always_inline)) {
    tile_step<Arch, T, MR, NV, kPackedA, kPackedB, AS, kBS>(acc, A, lda, Bp, ldb, u);
  };
  std::int64_t k = 0;
  for (; k + 4 <= kc; k += 4) {
    if constexpr (kPf) {
      if (pf_lines > 0) {
        __builtin_prefetch(pf, 0, 2);
        pf += 64;
        --pf_lines;
      }
    }
    step(0);
    step(1);
    step(2);
    step(3);
    A += kPackedA ? 4 * AS : 4;
    Bp += kPackedB ? 4 * kBS : 4 * ldb;
  }
  for (; k < kc; ++k) {
    step(0);
    A += kPackedA ? AS : 1;
    Bp += kPackedB ? kBS : ldb;
  }
  store_tile<Arch, T, MR, NV>(acc, C, ldc, alpha, beta);
}

// Steps ahead at which the deep tile fetches its A and B lines into L1: both stream from L2, and
// 16 steps ahead beat 8 and none (guarded by mha/native/llama-layer's deep q|k|v projection).
constexpr int kDeepPfSteps = 16;

// The tile over the whole depth (GemmUkernelDeep): the k loop runs through every depth block of
// the B panel in turn, the accumulators live across them, and C is stored once. Per four steps it
// prefetches the lines of A and B that kDeepPfSteps steps later will read.
template <class Arch, class T, int MR, int NV, int AS>
__attribute__((always_inline)) inline void gemm_tile_deep(std::int64_t K, std::int64_t kc, const T* __restrict A,
                                                          const T* __restrict Bp, std::int64_t block_stride,
                                                          T* __restrict C, std::int64_t ldc, T alpha, T beta) {
  using B = batch<T, Arch>;
  constexpr int W = static_cast<int>(B::size);
  constexpr int kBS = NV * W;
  constexpr int kBLines = (4 * kBS * static_cast<int>(sizeof(T)) + 63) / 64;  // per four steps
  constexpr int kALines = (4 * AS * static_cast<int>(sizeof(T)) + 63) / 64;
  B acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = B(T(0));
  for (std::int64_t p = 0; p < K; p += kc, Bp += block_stride) {
    const T* b = Bp;
    std::int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
#pragma GCC unroll 8
      for (int l = 0; l < kBLines; ++l)
        __builtin_prefetch(reinterpret_cast<const char*>(b + kDeepPfSteps * kBS) + 64 * l, 0, 3);
#pragma GCC unroll 8
      for (int l = 0; l < kALines; ++l)
        __builtin_prefetch(reinterpret_cast<const char*>(A + kDeepPfSteps * AS) + 64 * l, 0, 3);
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) tile_step<Arch, T, MR, NV, true, true, AS, kBS>(acc, A, 0, b, 0, u);
      A += 4 * AS;
      b += 4 * kBS;
    }
    for (; k < kc; ++k) {
      tile_step<Arch, T, MR, NV, true, true, AS, kBS>(acc, A, 0, b, 0, 0);
      A += AS;
      b += kBS;
    }
  }
  store_tile<Arch, T, MR, NV>(acc, C, ldc, alpha, beta);
}

// ---------------------------------------------------------------------------------------------
// The entry points. Each variant and row count is its own function: inlining two tile bodies
// into one function costs the register allocator dearly (spilled accumulators).

// M rows of a packed A panel of height MR (M == MR: the full tile; M < MR: the last rows of C),
// B packed.
template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C, std::int64_t ldc,
                  T alpha, T beta) {
  gemm_tile<Arch, T, M, NV, true, true, MR>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta);
}

// The same, prefetching the caller's next lines (GemmUkernelPf).
template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel_pf(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C, std::int64_t ldc, T alpha,
                     T beta, const void* pf, std::int64_t pf_lines) {
  gemm_tile<Arch, T, M, NV, true, true, MR, -1, true>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta,
                                                      static_cast<const char*>(pf), pf_lines);
}

// M rows of a packed A panel of height MR over the whole depth of a pre-packed B
// (GemmUkernelDeep).
template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel_deep(std::int64_t K, std::int64_t kc, const T* Ap, const T* Bp, std::int64_t block_stride, T* C,
                       std::int64_t ldc, T alpha, T beta) {
  gemm_tile_deep<Arch, T, M, NV, MR>(K, kc, Ap, Bp, block_stride, C, ldc, alpha, beta);
}

// The same with B read in place.
template <class Arch, class T, int M, int NV, int MR>
void gemm_ukernel_b_in_place(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C,
                             std::int64_t ldc, T alpha, T beta) {
  gemm_tile<Arch, T, M, NV, true, false, MR>(kc, Ap, MR, Bp, ldb, C, ldc, alpha, beta);
}

// A read in place (GemmUkernelAInPlace): M rows by NV vectors of a packed B panel NVP vectors
// wide.
template <class Arch, class T, int M, int NV, int NVP>
void gemm_ukernel_a_in_place(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp, std::int64_t ldb,
                             T* C, std::int64_t ldc, T alpha, T beta) {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  gemm_tile<Arch, T, M, NV, false, true, M, NVP * W>(kc, A, lda, Bp, ldb, C, ldc, alpha, beta);
}

// The same, prefetching the caller's next lines (GemmUkernelAInPlacePf).
template <class Arch, class T, int M, int NV, int NVP>
void gemm_ukernel_a_in_place_pf(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp, std::int64_t ldb,
                                T* C, std::int64_t ldc, T alpha, T beta, const void* pf, std::int64_t pf_lines) {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  gemm_tile<Arch, T, M, NV, false, true, M, NVP * W, true>(kc, A, lda, Bp, ldb, C, ldc, alpha, beta,
                                                           static_cast<const char*>(pf), pf_lines);
}

}  // namespace simdattn::simd::impl

// The native GEMM: C = alpha * op(A) op(B) + beta * C for row-major matrices, f32 and f64.
//
// Goto/BLIS structure: five loops around the simd/ micro-kernel, with B packed into kc x nr
// micro-panels (L1) inside an nc-wide block and A packed into mr-row micro-panels inside an
// mc x kc block (L2); block sizes come from the ISA's table (simd/src/kernels_<isa>.cpp).
// M == 1 takes a matrix-vector path that streams B once. Threads split C into balanced column
// (or row) ranges, each run by the serial driver with its own packing buffers; small problems
// stay on the calling thread.
#pragma once

#include <cstdint>

#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

enum class Trans : std::uint8_t { N, T };

template <class T>
struct GemmArgs {
  Trans trans_a = Trans::N, trans_b = Trans::N;
  std::int64_t M = 0, N = 0, K = 0;
  T alpha = T(1);
  const T* A = nullptr;  // op(A) is M x K: A is M x K (N) or K x M (T), leading dimension lda
  std::int64_t lda = 0;
  const T* B = nullptr;  // op(B) is K x N: B is K x N (N) or N x K (T), leading dimension ldb
  std::int64_t ldb = 0;
  T beta = T(0);         // beta == 0 never reads C
  T* C = nullptr;        // M x N, leading dimension ldc
  std::int64_t ldc = 0;
};

// threads: 0 = OpenMP's default, 1 = the calling thread only. `kt` picks the ISA (tests run
// every ISA the CPU has); by default the dispatched one.
template <class T>
void gemm(const GemmArgs<T>& args, int threads = 0, const simd::KernelTable* kt = nullptr);

// Grows the calling thread's packing buffers to what a single-threaded gemm of any size up to
// `bound` (M, N, K each at most bound's) needs, so that such calls allocate nothing. Throws
// std::bad_alloc.
template <class T>
void gemm_reserve(const GemmArgs<T>& bound, const simd::KernelTable* kt = nullptr);

}  // namespace simdattn::detail

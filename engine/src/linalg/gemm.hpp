// The native GEMM: C = alpha * op(A) op(B) + beta * C for row-major matrices, f32 and f64.
//
// Goto/BLIS structure: five loops around the simd/ micro-kernel, with B packed into kc x nr
// micro-panels (L1) inside an nc-wide block and A packed into mr-row micro-panels inside an
// mc x kc block (L2); block sizes come from the ISA's table (simd/src/kernels_<isa>.cpp).
// A pre-packed B several depth blocks deep, times many rows, goes deep instead: each register
// tile runs over the whole depth, so C is written once. M == 1 takes a matrix-vector path that
// streams B once. Threads split C into balanced column (or row) ranges, each run by the serial
// driver with its own packing buffers; small problems stay on the calling thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "runtime/prefetch.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

namespace scratch {
struct GemmPackedB : ScratchSlot {};    // the GEMM's packed B block
struct GemmPackedA : ScratchSlot {};    // the GEMM's packed A block and an edge tile
struct GemmDeepA : HugePagesSlot {};    // the GEMM's deep mode: a chunk of rows of A packed over all of K
}  // namespace scratch

enum class Trans : std::uint8_t { N, T };

// 64-byte aligned storage for std::vector (packed panels are read with aligned vector loads),
// on huge pages when large (allocate_buffer).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    T* p = allocate_elements<T>(n, true);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept { free_buffer(p, n * sizeof(T), true); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};

// A K x N matrix packed once into the micro-panels of one ISA's packed micro-kernel, for a B
// that many GEMMs multiply (a layer's weights): they skip packing it (a 128-row projection
// spends ~14% of its time there otherwise: mha/native/bert-layer). The panel of columns [j, j + nr) (j a multiple of nr) in the
// depth block [p, p + kc) (p a multiple of kc) holds min(kc, K - p) rows nr apart at
// data + p * Np + (j / nr) * nr * min(kc, K - p), Np = N rounded up to nr; zero past N.
// Packed for the in-place-A micro-kernel (a_in_place: its nr and kc), the calls that take it read
// A in place whatever their width: a B the caller keeps in this layout and also writes (as the C
// of another product, a panel of nr columns at a time with ldc = nr) is never packed at all (the
// gated delta rule's state and its chunk's U: linear_attention/gated_delta.cpp).
template <class T>
struct PackedB {
  std::int64_t K = 0, N = 0, Np = 0;
  int nr = 0, kc = 0;  // the blocking it was packed for
  bool a_in_place = false;  // ... the in-place-A kernel's (else the packed-A kernels')
  std::vector<T, AlignedAllocator<T>> data;
  const T* panel(std::int64_t j, std::int64_t p) const {  // (j a multiple of nr)
    return data.data() + p * Np + j * std::min<std::int64_t>(kc, K - p);
  }
};

// Packs B (K x N, row-major, leading dimension ldb) for `kt`'s packed micro-kernel (by default
// the dispatched ISA's), or its in-place-A kernel. Throws std::bad_alloc.
template <class T>
PackedB<T> pack_matrix_b(const T* B, std::int64_t ldb, std::int64_t K, std::int64_t N,
                         const simd::KernelTable* kt = nullptr, bool a_in_place = false);

// An empty (zero) K x N B in `kt`'s layout (as pack_matrix_b's), for a caller that writes it.
// Throws std::bad_alloc.
template <class T>
PackedB<T> packed_b_zeros(std::int64_t K, std::int64_t N, const simd::KernelTable* kt = nullptr, bool a_in_place = false);

// The K x N matrix `pb` holds, row-major (leading dimension N): its panels unpacked (for a
// caller that hands the same weights to another library).
template <class T>
std::vector<T> unpack_matrix_b(const PackedB<T>& pb);

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
  // If set: C := alpha op(A) op(B) + c_row on every row (N values; a bias), beta unused. The deep
  // mode writes each row's c_row just before its tiles add to it, not all of C up front.
  const T* c_row = nullptr;
  // Pre-packed B (B, ldb and trans_b unused): op(B) is columns [b_col, b_col + N) of it, b_col a
  // multiple of its nr; it must have been packed for the ISA the call runs on (and, packed for
  // the in-place-A kernel, trans_a N).
  const PackedB<T>* packed_b = nullptr;
  std::int64_t b_col = 0;
  // If set (a call on one thread, A read in place): lines the caller reads next, prefetched into
  // L2 a few per tile, spread over the call's arithmetic (runtime/prefetch.hpp).
  NextRows* next = nullptr;
};

// threads: 0 = OpenMP's default, 1 = the calling thread only. `kt` picks the ISA (tests run
// every ISA the CPU has); by default the dispatched one.
template <class T>
void gemm(const GemmArgs<T>& args, int threads = 0, const simd::KernelTable* kt = nullptr);

// Grows the calling thread's packing buffers to what a single-threaded gemm of any size up to
// `bound` (M, N, K each at most bound's; B pre-packed if bound's is) needs, so that such calls
// allocate nothing. Throws std::bad_alloc.
template <class T>
void gemm_reserve(const GemmArgs<T>& bound, const simd::KernelTable* kt = nullptr);

}  // namespace simdattn::detail

// The 16-bit GEMM: C (f32) = A B + beta C with A and B in bf16 or f16 and every product summed
// in f32, B a layer's weights packed once (Packed16) in the layout of the ISA's micro-kernel
// (simd::Gemm16Kernels: f32 A against widened B, or pairs of k for AVX512-BF16's vdpbf16ps).
//
// Columns outer: each mc x kc block of A is packed (widened to f32, or gathered into pairs),
// then every kc x nr panel of B is read once per block from memory and reused, from L1, by the
// block's row tiles (a block of four row tiles or more widens the panel to f32 once and runs the
// f32 micro-kernel on it). A single row (a decode step) streams B once. Threads split B's column
// panels, or A's rows when each thread gets at least 8 row tiles.
#pragma once

#include <cstdint>
#include <vector>

#include "linalg/gemm.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

namespace scratch {
struct GemmWidenedA : ScratchSlot {};  // rows of A widened to f32 before packing
struct GemmWidenedB : ScratchSlot {};  // one kc x nr panel of B widened to f32 for a tall block
struct GemmAmxA : ScratchSlot {};      // on AMX: 32 rows of A at one depth block, as tiles
}  // namespace scratch

// B (K x N) packed for one ISA's 16-bit micro-kernel: the panel of columns [j, j + nr) in the
// depth block [p, p + kc) holds rows(p) rows of nr values (pairs: rows(p) / 2 rows of nr pairs)
// at data + p * Np + (j / nr) * nr * rows(p), rows(p) = min(kc, K - p) rounded up to k_align
// (pairs: 2; an AMX table's: 32, whole tiles), Np = N rounded up to nr; zeros past N and past K.
struct Packed16 {
  std::int64_t K = 0, N = 0, Np = 0;
  int nr = 0, kc = 0;
  int k_align = 1;  // rows(p) is a multiple of it (pairs: 2; AMX tiles: 32), zeros past K
  bool pairs = false, bf16 = true;  // the layout; the format
  bool pair_kernels = false;        // packed for the table's gemm_bf16_pairs (else gemm_bf16 / gemm_f16)
  std::vector<std::uint16_t, AlignedAllocator<std::uint16_t>> data;
  std::int64_t rows(std::int64_t p) const {
    const std::int64_t r = std::min<std::int64_t>(kc, K - p);
    return (r + k_align - 1) / k_align * k_align;
  }
  const std::uint16_t* panel(std::int64_t j, std::int64_t p) const { return data.data() + p * Np + (j / nr) * nr * rows(p); }
};

// The kernels of one 16-bit format in a table (pairs: bf16's vdpbf16ps kernels, which only an
// AVX512-BF16 table has).
inline const simd::Gemm16Kernels& gemm16_kernels(const simd::KernelTable& t, bool bf16, bool pairs = false) {
  return pairs ? t.gemm_bf16_pairs : bf16 ? t.gemm_bf16 : t.gemm_f16;
}

// Packs B (K x N, row-major, leading dimension ldb; bf16 or f16 bits) for `kt`'s micro-kernel
// (by default the dispatched ISA's; pairs: its vdpbf16ps kernels, bf16 on AVX512-BF16 only).
// Throws std::bad_alloc.
Packed16 pack16_b(const std::uint16_t* B, std::int64_t ldb, std::int64_t K, std::int64_t N, bool bf16,
                       const simd::KernelTable* kt = nullptr, bool pairs = false);

// pack16_b's layout for a K x N matrix, every value zero (to be filled in place: the gated delta
// rule's bf16 states and chunk values, narrowed into its pair panels). Throws as pack16_b.
Packed16 packed16_zeros(std::int64_t K, std::int64_t N, bool bf16, const simd::KernelTable* kt = nullptr,
                        bool pairs = false);

// The K x N matrix (bf16 or f16 bits) `pb` holds, row-major (leading dimension N): its panels
// unpacked.
std::vector<std::uint16_t> unpack16_b(const Packed16& pb);

struct Gemm16Args {
  std::int64_t M = 0, N = 0, K = 0;
  const std::uint16_t* A = nullptr;  // M x K, leading dimension lda, the format B was packed in
  std::int64_t lda = 0;
  const Packed16* B = nullptr;     // columns [b_col, b_col + N) of it (b_col a multiple of its nr)
  std::int64_t b_col = 0;
  float* C = nullptr;                // M x N f32, leading dimension ldc
  std::int64_t ldc = 0;
  float beta = 0.0f;                 // beta == 0 never reads C
  const void* packed_a = nullptr;    // A already packed by pack16_a (then A is not read)
};

// A (M x K, row-major, leading dimension lda; B's format) packed as gemm16 packs it for B's
// kernels (not AMX), for a caller that multiplies it by several B (Gemm16Args::packed_a): one
// block, M <= mc and K <= kc of the kernels (pack16_a_fits); dst holds pack16_a_words(..) words.
bool pack16_a_fits(std::int64_t M, std::int64_t K, const Packed16& B, const simd::KernelTable* kt = nullptr);
std::int64_t pack16_a_words(std::int64_t M, std::int64_t K, const Packed16& B, const simd::KernelTable* kt = nullptr);
void pack16_a(const std::uint16_t* A, std::int64_t lda, std::int64_t M, std::int64_t K, const Packed16& B, void* dst,
              const simd::KernelTable* kt = nullptr);

// threads as gemm(); `kt` must be the table B was packed for (by default the dispatched one);
// the kernels are the ones B was packed for.
// Throws std::bad_alloc (scratch), std::logic_error if B was packed for another ISA.
void gemm16(const Gemm16Args& args, int threads, const simd::KernelTable* kt = nullptr);

}  // namespace simdattn::detail

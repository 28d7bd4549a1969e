// Part of the gated delta rule (gated_delta.cpp): a chunk's products on the bf16 pair kernels
// (GdrProducts::bf16_pairs; vdpbf16ps, simd::Gemm16Kernels::pairs), their operands rounded from
// the chunk's f32 rows and states (gated_delta_pairs.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "linear_attention/gated_delta.hpp"

namespace simdattn::detail {

// C = A B + accumulate C on the calling thread, on the bf16 pair kernels: A bf16 rows (rows lda
// apart; or packed_a: A packed once for several products, pack16_a), B columns b_col .. b_col + N
// - 1 of a B packed for gemm_bf16_pairs.
void gdr_product16(std::int64_t M, std::int64_t N, std::int64_t Kd, const std::uint16_t* A, std::int64_t lda,
                   const void* packed_a, const Packed16* B, std::int64_t b_col, float* C, std::int64_t ldc, float accumulate);

// Columns [j0, j1) of the K rows of f32 values in P (packed as the rule's states and U) narrowed
// into the bf16 pair panels of Pb (Pb's depth blocks within P's and its panels within P's:
// gdr_pairs_fit(); j0 a multiple of Pb's nr).
void gdr_narrow_to_pairs(const PackedB<float>& P, Packed16& Pb, std::int64_t K, std::int64_t j0, std::int64_t j1);

// Whether the dispatched table has the pair kernels and their layout's panels and depth blocks
// nest in the f32 state's (gdr_narrow_to_pairs).
bool gdr_pairs_fit(const GdrSizes& z);

// A chunk's key operands on the pair kernels: [K; Q] and K^T rounded to bf16 (row-major, K^T's
// rows ldkt apart) and, where each is one block of the kernels, packed once for the value heads
// that share them (KQp, Ktp: else null); U narrowed into pair panels. (Each state's pair panels
// are its own: gated_delta.cpp's Sb.) One per thread.
struct GdrPairs {
  std::vector<std::uint16_t, AlignedAllocator<std::uint16_t>> KQ, Kt;
  Packed16 U, KtB;  // KtB: K^T as [K; Q] K^T's B; U also names the kernels to pack16_a
  std::vector<std::uint32_t, AlignedAllocator<std::uint32_t>> KQ_packed, Kt_packed;
  const void *KQp = nullptr, *Ktp = nullptr;

  GdrPairs(const GdrSizes& z, std::int64_t chunk, std::int64_t ldkt);
  // Whether set() takes every key operand of a chunk of n from its f32 rows alone: Dk even (for
  // keys_product), each A one block of the kernels, the state one depth block (f32_kc deep).
  // Else set() needs K^T in f32 too.
  bool direct(std::int64_t n, std::int64_t Dk, int f32_kc) const;
  // [K; Q] (2 n x Dk, f32 rows, Q after K's n rows) rounded and packed, and K^T as the state
  // update's A: where direct(), packed straight from K's rows (a pair of K^T[d, 2s], K^T[d, 2s +
  // 1] is rows 2s and 2s + 1 of K at column d: narrow_pairs, a tile's mr columns at a time; Kt_f32
  // null), else rounded from Kt_f32 (Dk x n, rows ldkt apart) and packed where it fits.
  void set(const float* K, const float* Kt_f32, std::int64_t n, std::int64_t Dk, std::int64_t ldkt, int f32_kc);
  // KKQK = [K; Q] K^T (2 n x n, rows n apart) from set()'s rows, where Dk is even: K^T's pair
  // panels are K's bf16 rows read as 32-bit words, transposed (else false: the f32 product's).
  bool keys_product(std::int64_t n, std::int64_t Dk, float* KKQK);
};

}  // namespace simdattn::detail

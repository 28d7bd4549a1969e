// The SIMD layer's kernels, one table per ISA, chosen once at run time.
//
// Callers (engine/) see plain function pointers over float/double arrays; only simd/src touches
// xsimd batch types. Each ISA's table is built in its own translation unit compiled with that
// ISA's flags (kernels_avx512.cpp, kernels_avx2.cpp, kernels_sse2.cpp) from the one set of
// Arch-templated kernels in simd/src/impl/ (tables.hpp builds the table).
#pragma once

#include <array>
#include <cstdint>

#include "simdattn/simd/code8.hpp"
#include "simdattn/simd/isa.hpp"

namespace simdattn::simd {

// GEMM micro-kernel contract (BLIS-style), for T = float or double:
//
//   C[0:MR, 0:NR] := alpha * (Ap * Bp) + beta * C          (row-major C with leading dim ldc)
//
//   Ap: packed A micro-panel, kc steps of MR contiguous values (column k of the MR rows);
//   Bp: B micro-panel, kc rows of NR contiguous values (row k of the NR columns) spaced by
//       ldb elements: packed (ldb = NR, 64-byte aligned) or read in place from a row-major B;
//   kc >= 0 (kc == 0 gives alpha * 0 + beta * C). beta == 0 never reads C (C may hold NaN).
//   All NR columns are written: a narrower edge goes through a scratch tile (the caller's).
template <class T>
using GemmUkernel = void (*)(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C,
                             std::int64_t ldc, T alpha, T beta);

// A tile with A read in place instead of packed: row i of the tile is A + i * lda, and step k
// reads column k (A[i * lda + k]). For narrow C (e.g. P.V with N = head size), where a packed A
// would be reused too few times to pay for packing. Its tile is short and wide (e.g. 6 x 64 f32
// on AVX-512) so that the MR rows of A, which may sit at a multiple of 4 KiB apart and so share
// one L1 set, stay within the L1's associativity. All MR rows must exist.
template <class T>
using GemmUkernelAInPlace = void (*)(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp,
                                    std::int64_t ldb, T* C, std::int64_t ldc, T alpha, T beta);
// The same, also prefetching (into L2) pf_lines cache lines from pf on, one per four k steps:
// a caller that streams its next inputs from memory spreads their misses over its arithmetic
// (a burst of software prefetches stalls on the core's few line-fill buffers instead).
template <class T>
using GemmUkernelAInPlacePf = void (*)(std::int64_t kc, const T* A, std::int64_t lda, const T* Bp,
                                      std::int64_t ldb, T* C, std::int64_t ldc, T alpha, T beta,
                                      const void* pf, std::int64_t pf_lines);

// The packed-A, packed-B tile, also prefetching (into L2) pf_lines cache lines from pf on, one
// per four k steps (the driver hands it the next B panel's lines).
template <class T>
using GemmUkernelPf = void (*)(std::int64_t kc, const T* Ap, const T* Bp, std::int64_t ldb, T* C, std::int64_t ldc,
                               T alpha, T beta, const void* pf, std::int64_t pf_lines);

// The packed-A, pre-packed-B tile over the whole depth K in one call: Ap holds all K steps (as
// GemmUkernel's), Bp is the panel's first depth block (kc rows of NR values) and depth block q
// starts at Bp + q * block_stride; K is a multiple of kc. C is written once, not read and
// written again for every depth block, and both operands stream from L2 (fetched into L1 ahead).
template <class T>
using GemmUkernelDeep = void (*)(std::int64_t K, std::int64_t kc, const T* Ap, const T* Bp, std::int64_t block_stride,
                                 T* C, std::int64_t ldc, T alpha, T beta);

// Cache blocking of the GEMM driver for one ISA and dtype. Each ISA's numbers, and the reasons
// for them, are in simd/src/kernels_<isa>.cpp.
struct GemmBlocking {
  int mr, nr;  // register tile (micro-kernel)
  int lanes;   // elements per vector (nr is a multiple)
  int mc;      // columns outer (B read in place or pre-packed): rows of A packed per block (the
               // mc x kc block stays in L2), multiple of mr
  int kc;      // depth of one pass (an A micro-panel mr x kc stays in L1)
  int nc;      // most columns of B packed per block (kc x nc stays in L2; the driver lowers nc to fit
               // half of the CPU's L2), multiple of nr
  int kc_b_in_place;  // depth of one pass with B read in place (its kernel prefetches B's rows,
                      // so a deeper panel than L1 holds costs nothing, and C is passed over less)
};

// Largest register tile height, and width in vectors, of any ISA.
inline constexpr int kMaxMr = 16;
inline constexpr int kMaxNv = 4;

// Products of a few rows X (m <= kMaxProductRows, row stride ldx) with a B streamed once, each
// B row read once for all m rows (a decode step's grouped query heads as one matrix). B's
// element is the table's: T (GemmKernels::rows), bf16 / f16 bits widened exactly
// (KernelTable::rows_bf16, rows_f16) or 8-bit codes (Quant8Kernels::rows, the codes' values as
// decode8 gives them); scale null: 1. Sums in T (f32 for 16-bit and codes). `next`: the first row
// of the B a caller multiplies after this one (a paged cache's next block of the same head, row
// stride ldb as B's), whose first rows are fetched into cache as B's last are read, or null; it is
// never read.
inline constexpr int kMaxProductRows = 8;
template <class T>
struct RowsKernels {
  // S[r * lds + j] = alpha * scale[j * ss] * sum_p X[r * ldx + p] * B[j * ldb + p], r < m, j < n:
  // B's rows dotted with every row of X (a group's scores against K's rows).
  void (*dot)(int m, std::int64_t n, std::int64_t k, T alpha, const T* X, std::int64_t ldx, const void* B,
              std::int64_t ldb, const float* scale, std::int64_t ss, T* S, std::int64_t lds, const void* next);
  // Y[r * ldy + c] = alpha * sum_p X[r * ldx + p] * scale[p * ss] * B[p * ldb + c] + beta * Y[r * ldy + c],
  // r < m, c < n: B's rows weighted by each row of X and summed (a group's P V); beta == 0 never
  // reads Y.
  void (*weighted)(int m, std::int64_t n, std::int64_t k, T alpha, const T* X, std::int64_t ldx, const void* B,
                   std::int64_t ldb, const float* scale, std::int64_t ss, T beta, T* Y, std::int64_t ldy,
                   const void* next);
};

template <class T>
struct GemmKernels {
  GemmBlocking blocking;  // packed A and B
  // ukernel[m] computes the first m rows of the tile (m = 1..mr; ukernel[mr] is the full tile),
  // so the last rows of C cost only what they have; entry 0 is null.
  std::array<GemmUkernel<T>, kMaxMr + 1> ukernel;
  // The same with B read in place (ldb = B's row stride; full NR-wide panels only).
  std::array<GemmUkernel<T>, kMaxMr + 1> ukernel_b_in_place;
  // ukernel, also prefetching the caller's next lines (GemmUkernelPf).
  std::array<GemmUkernelPf<T>, kMaxMr + 1> ukernel_pf;
  // ukernel over all of a pre-packed B's depth blocks (GemmUkernelDeep).
  std::array<GemmUkernelDeep<T>, kMaxMr + 1> ukernel_deep;
  GemmBlocking blocking_a_in_place;  // A in place, B packed (mc unused)
  // ukernel_a_in_place[nv][m]: m rows (1..mr) by the first nv vectors (1..nr / lanes) of a packed
  // B panel nr wide, so that the last, narrower columns of C (a head size of 40, the 197th key)
  // cost only the vectors they have. One-vector tiles (nv = 1) exist for m up to 2 mr.
  std::array<std::array<GemmUkernelAInPlace<T>, kMaxMr + 1>, kMaxNv + 1> ukernel_a_in_place;
  std::array<std::array<GemmUkernelAInPlacePf<T>, kMaxMr + 1>, kMaxNv + 1> ukernel_a_in_place_pf;
  // y[0:n] := alpha * sum_k x[k] * B[k, 0:n] + beta * y  (B row-major, leading dim ldb);
  // beta == 0 never reads y. Streams B once.
  void (*gemv_n)(std::int64_t n, std::int64_t k, T alpha, const T* x, const T* B, std::int64_t ldb,
                 T beta, T* y);
  // y[0:n] := alpha * sum_k x[k] * B[0:n, k] + beta * y  (B is n x k row-major: dot products).
  void (*gemv_t)(std::int64_t n, std::int64_t k, T alpha, const T* x, const T* B, std::int64_t ldb,
                 T beta, T* y);
  RowsKernels<T> rows;  // B of T
};

template <class T>
struct VectorKernels {
  // y[i] = exp(x[i]); y may equal x. Max relative error 3 ulp over the finite range, including
  // denormal results; exp(-inf) = 0, overflow gives +inf, NaN propagates.
  void (*exp)(const T* x, T* y, std::int64_t n);
  // Horizontal max (of an empty array: -inf) and sum (empty: 0).
  T (*max)(const T* x, std::int64_t n);
  T (*sum)(const T* x, std::int64_t n);
  // Softmax pass 1, fused: x[i] = x[i] * scale + (add ? add[i] : 0); returns max_i x[i].
  T (*scale_add_max)(T* x, std::int64_t n, T scale, const T* add);
  // Softmax pass 2, fused: x[i] = exp(x[i] - max); returns the sum of the new x[i].
  // max = -inf (a fully masked row) yields x[i] = 0 and sum 0, never NaN. Results below the
  // smallest normal number are 0 (no denormals: they would cost a microcode assist each).
  // f32 weights are within 3 + |x[i] - max| / 16 ulp of exp(x[i] - max) (3 ulp on SSE2, and
  // for f64): a cheaper exp than `exp` above (see exp_batch).
  T (*exp_sub_max_sum)(T* x, std::int64_t n, T max);
  // x[i] *= a (the online softmax's rescale of an output row).
  void (*scale)(T* x, std::int64_t n, T a);
  // y[i] = x[i] * a (an output row's final 1 / l, written where it belongs).
  void (*scale_to)(const T* x, T* y, std::int64_t n, T a);
  // Transposing pack (K^T panels): dst[c * dst_ld + r] = src[r * ld + c] for r < rows, c < cols,
  // and 0 for rows <= r < width; nothing at or past width is written (so a panel can be filled
  // a slice of columns at a time). rows <= width <= dst_ld (GEMM's A panels are 12 wide).
  void (*pack_transpose)(const T* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, T* dst,
                         std::int64_t dst_ld, std::int64_t width);
  // Linear attention's feature maps, y may equal x, NaN propagates:
  // elu1: y[i] = elu(x[i]) + 1 = max(x, 0) + exp(min(x, 0)) (the exp above); relu: max(x, 0).
  void (*elu1)(const T* x, T* y, std::int64_t n);
  void (*relu)(const T* x, T* y, std::int64_t n);
  // The soft cap of scaled scores, plus a bias: x[i] = cap * tanh(x[i] * scale / cap) + (add ?
  // add[i] : 0) (cap > 0); returns max_i x[i]. tanh within a few ulp (a polynomial near 0, exp
  // elsewhere), +-inf to +-cap, NaN kept.
  T (*softcap_add_max)(T* x, std::int64_t n, T scale, T cap, const T* add);
  // The online-softmax step of a block of scores, rows r < rows of x (ld apart), keys n:
  //   s = x[r, :] * scale (computed as passes 1 and 2 above do: the same values), or with
  //       cap > 0 the soft-capped score cap * tanh(x[r, :] * scale / cap) (as softcap_add_max's;
  //       cap = 0: none)
  //   m_new = max(s) if that exceeds m[r] + 8, or exceeds m[r] = -inf; else m[r] (the row's
  //           reference max moves only when a block's max passes it by more than e^8, so the
  //           weights are at most e^8 and most later blocks of a long row rescale nothing)
  //   x[r, :] = exp(s - m_new) (0 where m_new = -inf; flushed below the smallest normal; as
  //   accurate as exp_sub_max_sum's weights)
  //   alpha[r] = exp(m[r] - m_new) if the max grew from a finite m[r], -1 if m[r] = -inf and
  //              m_new is not (the row's first visible key: its accumulated output is to be
  //              discarded), else 1
  //   l[r] = l[r] * alpha[r] (when the max grew) + sum of the new x[r, :];  m[r] = m_new.
  // The caller rescales (or, for -1, clears) the output rows with alpha[r] != 1. One call per
  // block: the passes of four rows are interleaved and the constants loaded once, where a pair of
  // calls per row cost as much again as the arithmetic on short rows (guarded by
  // attention/native/sdcross: 77 keys).
  // With lo and hi (else null), row r sees only the keys [lo[r], hi[r]) (0 <= lo, hi <= n; none
  // if hi <= lo): the others weigh exactly 0 and are neither read nor part of the max (a causal
  // or window edge block, without a separate masking pass).
  void (*softmax_rows)(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T cap, const std::int64_t* lo,
                       const std::int64_t* hi, T* m, T* l, T* alpha);
  // The online softmax's last step for a block of rows: y[r, :n] = x[r, :n] * (1 / l[r]), and
  // zeros without reading x[r] where l[r] == 0 (a row with no visible key). y may be x with
  // n <= ldy <= ldx: rows go in order, each left to right, so the rows are packed in place. One call per block:
  // on short rows (sdcross's are 40 wide) a call per row costs a measurable share of the run
  // (guarded by attention/native/sdcross).
  void (*normalize_rows)(const T* x, std::int64_t ldx, std::int64_t rows, std::int64_t n, const T* l, T* y,
                         std::int64_t ldy);
  // Softmax down the columns of a block of scores (one query per column: keys are rows), not
  // normalised: x[:, c] = exp(s - max s), s = x[:, c] * scale, for columns c < n, and l[c] = the
  // sum (0 where no score is finite: those columns become zeros; NaN where a score is NaN or
  // +inf). x aligned to the vector width, ld and n multiples of it; weights as exact as
  // exp_sub_max_sum's (so never denormal).
  void (*softmax_cols)(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, T scale, T* l);
  // x[r, c] *= 1 / l[c] for rows r and columns c < n, 0 where l[c] == 0 (the weighted sums of
  // softmax_cols' columns, normalised). Alignment as softmax_cols.
  void (*normalize_cols)(T* x, std::int64_t ld, std::int64_t rows, std::int64_t n, const T* l);
};

// The gated delta rule's f32 kernels (engine/src/linear_attention/gated_delta.cpp).
struct DeltaKernels {
  // A decode step's first pass over a state S [rows, cols] (row stride ld): sk = S^T k, sq = S^T q.
  void (*state_dots)(const float* S, std::int64_t rows, std::int64_t cols, std::int64_t ld, const float* k,
                     const float* q, float* sk, float* sq);
  // Its second: dst[d, j] = decay src[d, j] + k[d] u[j]; dst may be src (in place).
  void (*state_update)(const float* src, std::int64_t lds, float* dst, std::int64_t ldd, std::int64_t rows,
                       std::int64_t cols, float decay, const float* k, const float* u);
  // Whether every x[i], i < n, is finite.
  bool (*all_finite)(const float* x, std::int64_t n);
  // Whether no x[i], i < n (bf16 or f16 bits), has every bit of `exponent` set (0x7f80 bf16,
  // 0x7c00 f16: Inf and NaN).
  bool (*all_finite16)(const std::uint16_t* x, std::int64_t n, std::uint16_t exponent);
  // The chunk form's forward substitution, rows in order: U[i, :cols] -= sum_{s < i} A[i, s] U[s, :cols]
  // for i < n (U row stride ldu, A row stride lda; each row's sums held in registers).
  void (*forward_substitute)(float* U, std::int64_t ldu, std::int64_t n, std::int64_t cols, const float* A,
                             std::int64_t lda);
  // y[i] = x[i] * f, i < n, with f = mult / sqrt(sum_i x[i]^2 + eps) (norm) or mult (the rule's
  // L2 norm of a query or key row, and its scale); y may be x.
  void (*scale_row)(const float* x, float* y, std::int64_t n, float mult, float eps, bool norm);
  // The chunk form's weights from gam[0:n], its cumulative log decays (double: a strong decay's
  // sum would swallow the small ones after it in f32), with E[i, s] = exp(float(gam[i] - gam[s]))
  // (VectorKernels::exp's, bit for bit): eg[i] = exp(float(gam[i])); A[i, s] = (beta[i] E[i, s])
  // KK[i, s] for s < i (A[i, s >= i] not written); QKm[i, s] = QK[i, s] E[i, s] for s <= i, 0 for
  // i < s < n (QKm may be QK); last[s] = E[n - 1, s]. Rows ldk, ldq, lda, ldm apart.
  void (*chunk_weights)(std::int64_t n, const double* gam, const float* beta, const float* KK, std::int64_t ldk,
                        const float* QK, std::int64_t ldq, float* A, std::int64_t lda, float* QKm, std::int64_t ldm,
                        float* eg, float* last);
  // y[r, :cols] = f[r] x[r, :cols] for r < rows (rows ldx, ldy apart; y may be x).
  void (*scale_rows)(const float* x, std::int64_t ldx, std::int64_t rows, std::int64_t cols, const float* f, float* y,
                     std::int64_t ldy);
  // The chunk form's right sides: U[i, :cols] = fma(-(beta[i] eg[i]), KS[i, :cols], beta[i] V[i, :cols])
  // and U[i, cols:width] = 0, for i < n (rows ldv, ldks, ldu apart).
  void (*right_sides)(std::int64_t n, std::int64_t cols, std::int64_t width, const float* V, std::int64_t ldv,
                      const float* KS, std::int64_t ldks, const float* beta, const float* eg, float* U, std::int64_t ldu);
};

// The merge of two attention states (engine/src/attention/states.cpp).
struct StateKernels {
  // y[i] = fma(wb, b[i], 0 + wa a[i]) in double, rounded once to f32, i < n: to nearest even, or
  // (odd) to odd, for a rounding to bf16 / f16 after that gives the double's own (simdattn/half.hpp's
  // round_to_odd). The same bits on every ISA; y may be a or b.
  void (*merge_rows)(const float* a, const float* b, float* y, std::int64_t n, double wa, double wb, bool odd);
};

// Machine-limit probes for the perf suite (perf/suite/bench_machine.cpp).
struct ProbeKernels {
  // Runs `iters` steps of kFmaChains independent FMA chains on full-width f32 vectors; returns
  // a value that depends on every chain (so nothing is optimised away).
  float (*fma_chains)(std::int64_t iters, float seed);
  int flops_per_iter;  // 2 * chains * lanes
  // AMX only (else null): `iters` rounds of four independent tdpbf16ps on resident tiles, each
  // 2 * 16 * 16 * 32 FLOPs; releases the tiles after.
  float (*amx_peak)(std::int64_t iters) = nullptr;
  // AVX512-BF16 tables (else null): `iters` steps of kFmaChains independent vdpbf16ps chains on
  // 16-lane vectors, each instruction 64 FLOPs (16 lanes, two products and their sums a lane).
  float (*pairs_peak)(std::int64_t iters) = nullptr;
};

// GEMM with B in 16-bit floats (bf16 or f16 bits) and f32 accumulation, for weights packed
// once (engine/src/linalg/gemm16.cpp):
//
//   C[0:m, 0:nr] := alpha * (Ap * Bp) + beta * C        (C f32, row-major, leading dim ldc)
//
// in one of two layouts (Gemm16Kernels::pairs):
//   false: Ap holds kc steps of mr f32 values (column k of the rows, as GemmUkernel's), Bp kc
//          rows of nr 16-bit values;
//   true:  k goes in pairs (AVX512-BF16's vdpbf16ps): Ap holds ceil(kc / 2) steps of mr 32-bit
//          words, word i of step s the bf16 pair (A[i, 2s], A[i, 2s + 1]) (the first in the low
//          half), and Bp ceil(kc / 2) rows of nr such pairs (B[2s, j], B[2s + 1, j]); an odd kc's
//          missing last k is zero in both.
// Bp is 64-byte aligned; all nr columns are computed (a narrower edge goes through a scratch
// tile, the caller's). beta == 0 never reads C.
using Gemm16Ukernel = void (*)(std::int64_t kc, const void* Ap, const std::uint16_t* Bp, float* C,
                                 std::int64_t ldc, float alpha, float beta);

// AMX (Gemm16Kernels::amx_block): C[0:m, 0:n] (+)= A[0:m, 0:kb] Bp for m <= 32, any n >= 1 and
// one depth block (kb <= kc). A's tile for rows 0-15 of the step of 32 k at s is at A + (s / 32) *
// a_step, rows 16-31 a_half further, rows a_stride bytes apart: A packed as tiles (a_step 1024,
// a_half 512, a_stride 64, zeros past kb) or read in place (a_step 32, a_half 16 * lda, a_stride
// 2 * lda; kb a multiple of 32, as nothing past it may be read); Bp the packed B panels of that
// block, columns 32 j .. 32 j + 31 in the panel at Bp + j * b_stride (pairs of 32 columns, its
// rows rounded up to 32 with zeros: Packed16::panel in engine/src/linalg/gemm16.hpp; B's rows past
// kb may hold any finite values where packed A is zero there: they meet only A's zeros, or are
// not read at all where the products stop at kb's last pair). accumulate:
// C's values are added to, else overwritten (never read). The calling thread's tiles stay
// configured until amx_done.
using Gemm16AmxBlock = void (*)(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half,
                              std::int64_t a_stride, int m, const std::uint16_t* Bp, std::int64_t b_stride, int n,
                              float* C, std::int64_t ldc, bool accumulate);

struct Gemm16Kernels {
  int mr, nr;  // register tile
  int kc;      // depth of one pass (even): a kc x nr panel of B stays in L1 across an mc-row block
  int mc;      // rows of A packed per block (a multiple of mr; the mc x kc block stays in L2)
  bool pairs;  // the layout above
  // ukernel[m]: the first m rows of the tile (m = 1..mr); entry 0 is null.
  std::array<Gemm16Ukernel, kMaxMr + 1> ukernel;
  int k_align = 1;  // packed B's depth blocks are rounded up to this many rows (pairs: 2; AMX: 32)
  Gemm16AmxBlock amx_block = nullptr;  // AMX tables' bf16 only: blocks of C on tiles
  void (*amx_done)() = nullptr;      // releases the calling thread's tiles
  // A[0:m, 0:kb] (m <= 32, row stride lda) as amx_block's packed A: the step of 32 k at s holds
  // row r's A[r, s .. s + 31] at ap + s * 32 + r * 32 (64 bytes, zeros past kb); rows past m are
  // not written. ap 64-byte aligned.
  void (*amx_pack_a)(const std::uint16_t* A, std::int64_t lda, int m, std::int64_t kb, std::uint16_t* ap) = nullptr;
};

// Rows between 16-bit floats (bf16 or f16 bits) and f32, bit for bit as simdattn/half.hpp:
// widen is exact (a signalling f16 NaN may come out quiet); narrow rounds to nearest even,
// overflows to Inf (f16) and keeps NaN quiet.
struct Convert16Kernels {
  void (*widen)(const std::uint16_t* src, float* dst, std::int64_t n);
  void (*narrow)(const float* src, std::uint16_t* dst, std::int64_t n);
  // rows x cols f32 values (rows ld apart) into the pair layout of Gemm16Kernels::pairs, rounded
  // as narrow: dst[s * dst_ld + c] holds src[2s, c] in its low half and src[2s + 1, c] in its high
  // half (zero past an odd rows' last row).
  void (*narrow_pairs)(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::uint32_t* dst,
                       std::int64_t dst_ld);
  // VectorKernels<float>::pack_transpose from 16-bit rows, each value widened.
  void (*pack_transpose)(const std::uint16_t* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, float* dst,
                         std::int64_t dst_ld, std::int64_t width);
};

// 8-bit K/V codes of one format (simdattn/simd/code8.hpp), bit for bit as its scalar rules.
struct Quant8Kernels {
  // rows rows of n f32 values (ldx apart) to codes (ldc bytes apart) and one scale each (at
  // scale + r * scale_stride), on IEEE arithmetic whatever the caller's MXCSR. Returns the first
  // row with a NaN or an infinity (it and the rows after it are not written), or -1.
  std::int64_t (*quantize)(const float* x, std::int64_t rows, std::int64_t n, std::int64_t ldx, std::uint8_t* codes,
                           std::int64_t ldc, float* scale, std::int64_t scale_stride);
  // dst[i] = decode(codes[i]) * scale (rounded to f32), i < n.
  void (*dequantize)(const std::uint8_t* codes, std::int64_t n, float scale, float* dst);
  RowsKernels<float> rows;  // B of codes
};

// The fused attention path's bf16 kernels over tile layouts (engine/src/attention/native/fused/
// tile_steps.hpp): AMX tables, their products on tiles; AVX512-BF16 tables where vdpbf16ps runs
// at the FMA rate (bf16_pairs_preferred, isa.hpp: AMD's cores), the same layouts and contracts on
// vdpbf16ps. Elsewhere null.
struct TileAttentionKernels {
  // The online-softmax step of VectorKernels::softmax_rows (the same m, l, alpha and lo / hi
  // contract) on rows r < rows <= 32 of f32 scores x (ld apart, keys 0 .. n - 1), except that x
  // is only read and each row's weights are rounded to bf16 (nearest even) into row r of a group
  // of 32 x 32 tiles: key j at column c = lead + j, column c at p[(c / 32) * 1024 + r * 32 + c %
  // 32], zeros in columns [0, lead) and [lead + n, next multiple of 32), none of x read there.
  // lead + n <= 512; p 64-byte aligned. The weights before rounding are within 8.6e-5 (relative)
  // of exp(s - m_new) plus the f32 argument's rounding, 1.2e-7 (|s - m_new| + |m_new|) where
  // |m_new| <= 256, else 1.2e-7 |s|, and 0 below 2^-126; P rounds them to nearest even bf16 (up to
  // 2^-8 more). l[r] adds their unrounded sum: within those bounds of the exact sum, and within
  // 2^-8 of the sum of P. A NaN score does not enter the block max; its weight is NaN.
  void (*softmax_rows)(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t n, float scale,
                       const std::int64_t* lo, const std::int64_t* hi, float* m, float* l, float* alpha,
                       std::uint16_t* p, std::int64_t lead) = nullptr;
  // softmax_rows with the weights before rounding within 2.9e-6 of exp(s - m_new) plus the same
  // argument's rounding (l too): for calls whose lse is an output.
  void (*softmax_rows_lse)(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t n, float scale,
                           const std::int64_t* lo, const std::int64_t* hi, float* m, float* l, float* alpha,
                           std::uint16_t* p, std::int64_t lead) = nullptr;
  // Gemm16AmxBlock's contract (A as tiles or in place, Bp pair panels of 32 columns) at any depth
  // kb (the S products' is D, MLA's 576 included: the K panels' pair rows lie back to back), bf16
  // products summed in f32 (on AMX: Gemm16Kernels::amx_block's tiles), and pf_lines cache lines
  // from pf on (the next key block's rows) prefetched into L2, spread over the products.
  void (*block)(std::int64_t kb, const std::uint16_t* A, std::int64_t a_step, std::int64_t a_half, std::int64_t a_stride,
                int m, const std::uint16_t* Bp, std::int64_t b_stride, int n, float* C, std::int64_t ldc, bool accumulate,
                const void* pf, std::int64_t pf_lines) = nullptr;
  // Gemm16Kernels::amx_pack_a's contract.
  void (*pack_a)(const std::uint16_t* A, std::int64_t lda, int m, std::int64_t kb, std::uint16_t* ap) = nullptr;
  // Two rows of 16-bit values as one row of 32-bit pairs (V's pair-rows): dst[c] = r0[c] |
  // r1[c] << 16 for c < n (r1 null: zero high halves); nothing at or past n written.
  void (*pair_rows)(const std::uint16_t* r0, const std::uint16_t* r1, std::int64_t n, std::uint32_t* dst) = nullptr;
  // The end of a thread's blocks (AMX: releases its tiles; vdpbf16ps: nothing).
  void (*done)() = nullptr;
};

struct KernelTable {
  Isa isa;
  ProbeKernels probe;
  GemmKernels<float> gemm_f32;
  GemmKernels<double> gemm_f64;
  VectorKernels<float> vec_f32;
  VectorKernels<double> vec_f64;
  RowsKernels<float> rows_bf16;  // B of bf16 bits
  RowsKernels<float> rows_f16;   // B of f16 bits
  Gemm16Kernels gemm_bf16;
  Gemm16Kernels gemm_f16;
  // bf16 in the pair layout on vdpbf16ps (AVX512-BF16 only; elsewhere mr == 0). gemm_bf16 is
  // these kernels on AMD's cores (bf16_pairs_preferred, isa.hpp: vdpbf16ps at the FMA rate, 1.5-2.1x
  // the widening kernels on Zen 5's GEMM rows); on Intel's, where vdpbf16ps retires half the
  // multiply-adds per cycle of f32 FMAs, gemm_bf16 widens to f32 (guarded by
  // mha/native/gpt-layer.bf16). Tested in any case, for the pair layout AMX tiles also take.
  Gemm16Kernels gemm_bf16_pairs;
  Convert16Kernels convert_bf16;
  Convert16Kernels convert_f16;
  // by simdattn::simd::Code8: int8, e4m3, e5m2
  std::array<Quant8Kernels, 3> quant8;
  TileAttentionKernels tile_attention;
  // The vdpbf16ps ones (AVX512-BF16 tables, whichever tile_attention is; elsewhere null): tested
  // in any case.
  TileAttentionKernels tile_attention_pairs;
  DeltaKernels delta;
  StateKernels states;

  const Quant8Kernels& code8(Code8 f) const { return quant8[static_cast<std::size_t>(f)]; }
  template <class T> const GemmKernels<T>& gemm() const;
  template <class T> const VectorKernels<T>& vec() const;
};

template <> inline const GemmKernels<float>& KernelTable::gemm<float>() const { return gemm_f32; }
template <> inline const GemmKernels<double>& KernelTable::gemm<double>() const { return gemm_f64; }
template <> inline const VectorKernels<float>& KernelTable::vec<float>() const { return vec_f32; }
template <> inline const VectorKernels<double>& KernelTable::vec<double>() const { return vec_f64; }

// The table of selected_isa(), resolved once.
const KernelTable& kernels();

// The table of one ISA, or nullptr if this CPU cannot run it (for tests and comparisons).
const KernelTable* kernels_for(Isa isa);

}  // namespace simdattn::simd

// Part of linalg/gemm.cpp, the one file that includes it: packing A and B into micro-panels,
// and the plan of a call (its mode, block sizes and the extents of its packing buffers). Internal
// linkage, as when it was written in gemm.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>

#include <unistd.h>

#include "linalg/gemm.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {
namespace {

// Ap: ceil(mc / mr) micro-panels; panel r holds, for each k < kc, rows i0 + r*mr .. + mr - 1
// (zero past mc).
template <class T>
void pack_a(const GemmArgs<T>& g, const simd::VectorKernels<T>& vk, std::int64_t i0, std::int64_t mc,
            std::int64_t p0, std::int64_t kc, int mr, T* Ap) {
  for (std::int64_t ir = 0; ir < mc; ir += mr) {
    const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
    T* dst = Ap + ir * kc;
    if (g.trans_a == Trans::N) {
      // A panel is the transpose of m rows of A: the SIMD transposing pack (register transposes
      // on AVX-512 f32), not a scalar loop of mr read streams and one write stream. Guarded by
      // gemm/native/1024x1024x1024.
      vk.pack_transpose(g.A + (i0 + ir) * g.lda + p0, g.lda, m, kc, dst, mr, mr);
      continue;
    }
    for (std::int64_t k = 0; k < kc; ++k) {
      const T* src = g.A + (p0 + k) * g.lda + i0 + ir;
      for (std::int64_t r = 0; r < m; ++r) dst[k * mr + r] = src[r];
      for (std::int64_t r = m; r < mr; ++r) dst[k * mr + r] = T(0);
    }
  }
}

// Bp: ceil(nc / nr) micro-panels; panel c holds, for each k < kc, columns j0 + c*nr .. + nr - 1
// (zero past nc). Packs panels [panel_begin, panel_end) only.
template <class T>
void pack_b(const GemmArgs<T>& g, const simd::VectorKernels<T>& vk, std::int64_t p0, std::int64_t kc,
            std::int64_t j0, std::int64_t nc, int nr, T* Bp, std::int64_t panel_begin, std::int64_t panel_end) {
  if (g.trans_b == Trans::N) {
    // Full panels row by row: each row of the block is read once, front to back, which the
    // hardware prefetchers follow (a panel at a time reads a column strip, a new page per row).
    // Guarded by gemm/native/1024x1024x1024.
    const std::int64_t full_end = std::min(nc / nr, panel_end);
    if (panel_begin < full_end) {
      const std::size_t bytes = sizeof(T) * static_cast<std::size_t>(nr);
      for (std::int64_t k = 0; k < kc; ++k) {
        const T* src = g.B + (p0 + k) * g.ldb + j0;
        T* dst = Bp + k * nr;
        for (std::int64_t p = panel_begin; p < full_end; ++p) {
          if (bytes == 128) std::memcpy(dst + p * nr * kc, src + p * nr, 128);  // a constant size inlines
          else if (bytes == 64) std::memcpy(dst + p * nr * kc, src + p * nr, 64);
          else std::memcpy(dst + p * nr * kc, src + p * nr, bytes);
        }
      }
      panel_begin = full_end;
    }
  }
  for (std::int64_t jr = panel_begin * nr; jr < std::min(nc, panel_end * nr); jr += nr) {
    const std::int64_t n = std::min<std::int64_t>(nr, nc - jr);
    T* dst = Bp + jr * kc;
    if (g.trans_b == Trans::N) {
      for (std::int64_t k = 0; k < kc; ++k) {
        const T* src = g.B + (p0 + k) * g.ldb + j0 + jr;
        T* d = dst + k * nr;
        std::memcpy(d, src, sizeof(T) * static_cast<std::size_t>(n));
        for (std::int64_t c = n; c < nr; ++c) d[c] = T(0);
      }
    } else {
      // B^T rows are B's columns: the SIMD transposing pack (zero past n).
      vk.pack_transpose(g.B + (j0 + jr) * g.ldb + p0, g.ldb, n, kc, dst, nr, nr);
    }
  }
}

// C = beta * C (beta == 0 writes zeros without reading C).
template <class T>
void scale_c(const GemmArgs<T>& g) {
  for (std::int64_t i = 0; i < g.M; ++i) {
    T* c = g.C + i * g.ldc;
    if (g.beta == T(0)) std::fill(c, c + g.N, T(0));
    else for (std::int64_t j = 0; j < g.N; ++j) c[j] *= g.beta;
  }
}

// A narrow C reuses each packed A micro-panel only ceil(N / nr) times: up to this many columns
// the in-place-A kernel runs instead (perf: gemm 2048x64x2048, the P.V shape).
constexpr std::int64_t kAInPlaceMaxCols = 128;

// With few rows, each packed B panel is reused by few tiles and packing B costs more than it
// saves (perf: gemm 128x768x768, a BERT projection): up to this many rows the micro-kernel reads
// a row-major B in place. Not when B's rows are a multiple of 4 KiB apart: they would all share
// one L1 set.
constexpr std::int64_t kBInPlaceMaxRows = 256;
// ... and only while B's rows are at most a page apart: a kc-row panel of wider rows touches a
// page per row, and every load of the in-place kernel risks a TLB miss (perf: mha/native/
// bert-layer, whose QKV projection reads a 768 x 2304 weight, is faster packed).
constexpr std::int64_t kBInPlaceMaxRowBytes = 4096;

// Columns of B per packed block: the table's nc, fewer if the kc x nc block (kc = min(K, the
// table's kc)) would not fit in half of this CPU's L2, where it stays while every A micro-panel
// sweeps it.
long l2_bytes() {
  static const long l2 = [] {
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return n > 0 ? n : 1L << 20;  // unknown: assume 1 MiB
  }();
  return l2;
}

template <class T>
int fit_nc(const simd::GemmBlocking& bs, std::int64_t K) {
  const long cols = l2_bytes() / 2 / (std::min<long>(bs.kc, K) * static_cast<long>(sizeof(T)));
  return static_cast<int>(std::clamp<long>(cols / bs.nr * bs.nr, bs.nr, bs.nc));
}

// A pre-packed B goes rows outer (see pass_rows_outer) only when each thread has at least this
// many rows: the first sweep of A rows over a block of B pulls it from L3, which few rows do not
// amortise. The crossover lies between 256 and 384 rows; guarded by mha/native/bert-layer (128
// rows: columns outer faster) and mha/native/gpt-layer (1024 rows: rows outer faster).
constexpr std::int64_t kPrepackedRowsOuterMin = 384;

// Deep mode: a pre-packed B at least kDeepMinBlocks depth blocks deep, times at least
// kDeepMinRows rows of A, runs each tile over the whole depth (GemmUkernelDeep), so C is written
// once instead of read and written once per depth block (the llama layer's q|k|v projection,
// 1024 x 3072 x 2048, is such a GEMM; guarded by mha/native/llama-layer and mha/native/gpt-layer).
constexpr std::int64_t kDeepMinBlocks = 2;
constexpr std::int64_t kDeepMinRows = 384;
// Rows of A packed over all of K at a time in deep mode (at most this many bytes); the B blocks
// are read again for every such chunk.
constexpr std::int64_t kDeepMaxABytes = std::int64_t{8} << 20;

// A read in place: a narrow C, or a B pre-packed for that kernel.
template <class T>
bool in_place_a(const GemmArgs<T>& g) {
  return g.trans_a == Trans::N && (g.packed_b != nullptr ? g.packed_b->a_in_place : g.N <= kAInPlaceMaxCols);
}

// Which micro-kernel the driver runs, its blocking and loop order, whether A or B is read in
// place. nt: the threads that will split the rows.
template <class T>
struct Mode {
  simd::GemmBlocking bs;
  bool a_in_place, b_in_place, rows_outer;
  bool deep = false;
  int nv;  // vectors of a full tile's width (nr / lanes)
  Mode(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, int nt)
      : bs(in_place_a(g) ? gk.blocking_a_in_place : gk.blocking),
        a_in_place(in_place_a(g)),
        b_in_place(g.packed_b == nullptr && !a_in_place && g.trans_b == Trans::N && g.M <= kBInPlaceMaxRows &&
                 (g.ldb * static_cast<std::int64_t>(sizeof(T))) % 4096 != 0 &&
                 g.ldb * static_cast<std::int64_t>(sizeof(T)) <= kBInPlaceMaxRowBytes),
        rows_outer(!a_in_place && !b_in_place && (g.packed_b == nullptr || g.M / nt >= kPrepackedRowsOuterMin)) {
    nv = bs.nr / bs.lanes;
    if (rows_outer) bs.nc = fit_nc<T>(bs, g.K);
    if (b_in_place) bs.kc = bs.kc_b_in_place;
    // (not on nt: which mode runs decides the order of the sums, and every thread count must give
    // the same bits)
    deep = g.packed_b != nullptr && !a_in_place && g.M >= kDeepMinRows && g.K % bs.kc == 0 && g.K >= kDeepMinBlocks * bs.kc;
  }
};

// Deep mode's columns per block: the K x nc block of B fills half of this CPU's L2, where it
// stays while the rows' micro-panels sweep it.
template <class T>
std::int64_t deep_nc(const simd::GemmBlocking& bs, std::int64_t K) {
  const std::int64_t cols = l2_bytes() / 2 / (K * static_cast<std::int64_t>(sizeof(T)));
  return std::max<std::int64_t>(bs.nr, cols / bs.nr * bs.nr);
}

// Deep mode's rows of A per packed chunk (a multiple of mr).
template <class T>
std::int64_t deep_chunk_rows(const simd::GemmBlocking& bs, std::int64_t rows, std::int64_t K) {
  const std::int64_t cap = std::max<std::int64_t>(bs.mr, kDeepMaxABytes / (K * static_cast<std::int64_t>(sizeof(T))) / bs.mr * bs.mr);
  return std::min((rows + bs.mr - 1) / bs.mr * bs.mr, cap);
}

// True if the driver makes a single pass over B: one kc x nc block (kc and nc as the mode
// blocks them), so a thread that has packed it can run any rows with it.
template <class T>
bool single_block(const GemmArgs<T>& g, const Mode<T>& mode) {
  return g.K <= mode.bs.kc && g.N <= mode.bs.nc;
}

// Row tiles (mr rows each) per claim of a dynamic row split: 48 rows of f32 on AVX-512, ~45 us of
// a 2048-wide, 64-deep product; small enough to even out a thread that falls 100 us behind.
// Guarded by gemm/native/2048x2048x64/t2.
constexpr std::int64_t kRowUnitsPerClaim = 4;

// Column panels per claim of a dynamic column split: 64 columns of f32 on AVX-512 (gemm
// 128x768x768: 12 claims of ~35 us). Guarded by gemm/native/128x768x768/t2.
constexpr std::int64_t kColUnitsPerClaim = 2;

// Buffer sizes (elements) for one thread's part of the driver.
template <class T>
struct Extents {
  std::int64_t kc, mc, nc;  // kc_max, mc_max rounded to mr, nc_max rounded to nr
  Extents(const GemmArgs<T>& g, const simd::GemmBlocking& bs)
      : kc(std::min<std::int64_t>(bs.kc, g.K)),
        mc((std::min<std::int64_t>(bs.mc, g.M) + bs.mr - 1) / bs.mr * bs.mr),
        nc((std::min<std::int64_t>(bs.nc, g.N) + bs.nr - 1) / bs.nr * bs.nr) {}
  std::size_t b_size() const { return static_cast<std::size_t>(kc * nc); }
  std::size_t a_size(const simd::GemmBlocking& bs) const {
    return static_cast<std::size_t>(mc * kc + bs.mr * bs.nr);  // A block + an edge tile
  }
};

// body(Bp, Aws) on the calling thread's packing buffers, sized for `ex`: the packed B block and
// the packed A block with an edge tile. Throws std::bad_alloc (inside a parallel region, run
// it under a RegionFailure).
template <class T, class Body>
void with_packing_buffers(const Extents<T>& ex, const simd::GemmBlocking& bs, Body&& body) {
  T* Bp = thread_buffer<T, scratch::GemmPackedB>().get(ex.b_size());
  body(Bp, thread_buffer<T, scratch::GemmPackedA>().get(ex.a_size(bs)));
}

}  // namespace
}  // namespace simdattn::detail

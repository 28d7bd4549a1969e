#include "linalg/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include <omp.h>
#include <unistd.h>

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
// once instead of read and written once per depth block: 1024 x 3072 x 2048 at two threads, the
// llama layer's q|k|v projection, 307-316 GFLOP/s against 290-294 (guarded by
// mha/native/llama-layer and mha/native/gpt-layer).
constexpr std::int64_t kDeepMinBlocks = 2;
constexpr std::int64_t kDeepMinRows = 384;
// Rows of A packed over all of K at a time in deep mode (at most this many bytes); the B blocks
// are read again for every such chunk.
constexpr std::int64_t kDeepMaxABytes = std::int64_t{8} << 20;

// Which micro-kernel the driver runs, its blocking and loop order, whether A or B is read in
// place. nt: the threads that will split the rows.
template <class T>
struct Mode {
  simd::GemmBlocking bs;
  bool a_in_place, b_in_place, rows_outer;
  bool deep = false;
  Mode(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, int nt)
      : bs(g.packed_b == nullptr && g.trans_a == Trans::N && g.N <= kAInPlaceMaxCols ? gk.blocking_a_in_place
                                                                                      : gk.blocking),
        a_in_place(g.packed_b == nullptr && g.trans_a == Trans::N && g.N <= kAInPlaceMaxCols),
        b_in_place(g.packed_b == nullptr && !a_in_place && g.trans_b == Trans::N && g.M <= kBInPlaceMaxRows &&
                 (g.ldb * static_cast<std::int64_t>(sizeof(T))) % 4096 != 0 &&
                 g.ldb * static_cast<std::int64_t>(sizeof(T)) <= kBInPlaceMaxRowBytes),
        rows_outer(!a_in_place && !b_in_place && (g.packed_b == nullptr || g.M / nt >= kPrepackedRowsOuterMin)) {
    if (rows_outer) bs.nc = fit_nc<T>(bs, g.K);
    if (b_in_place) bs.kc = bs.kc_b_in_place;
    // (not on nt: which mode runs decides the order of the sums, and every thread count must give
    // the same bits)
    deep = g.packed_b != nullptr && g.M >= kDeepMinRows && g.K % bs.kc == 0 && g.K >= kDeepMinBlocks * bs.kc;
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

// The first m x n values of an edge tile (rows nr apart) into C: alpha * tile + beta * C, beta
// == 0 never reading C.
template <class T>
void store_edge_tile(const T* tile, int nr, std::int64_t m, std::int64_t n, T alpha, T beta, T* c, std::int64_t ldc) {
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t q = 0; q < n; ++q) {
      T& cij = c[r * ldc + q];
      cij = beta == T(0) ? alpha * tile[r * nr + q] : alpha * tile[r * nr + q] + beta * cij;
    }
}

// One micro-tile of C at rows i, columns j (m x n valid). Short tiles (m < mr) run the m-row
// kernel; narrow ones (n < nr) go through `tile`. B's rows are ldb apart.
template <class T>
inline void run_tile(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const Mode<T>& mode,
                     std::int64_t kc, const T* a, std::int64_t lda, const T* bp, std::int64_t ldb,
                     bool b_packed, std::int64_t i, std::int64_t j, std::int64_t m, std::int64_t n, T beta,
                     T* tile, NextRows::Run pf = {}) {
  const int nr = mode.bs.nr;
  T* c = g.C + i * g.ldc + j;
  const bool full = n == nr;
  T* out = full ? c : tile;
  const std::int64_t ldo = full ? g.ldc : nr;
  const T alpha = full ? g.alpha : T(1), b = full ? beta : T(0);
  if (mode.a_in_place) gk.ukernel_a_in_place[nr / mode.bs.lanes][m](kc, a, lda, bp, ldb, out, ldo, alpha, b);
  else if (b_packed && pf.lines > 0) gk.ukernel_pf[m](kc, a, bp, ldb, out, ldo, alpha, b, pf.at, pf.lines);
  else if (b_packed) gk.ukernel[m](kc, a, bp, ldb, out, ldo, alpha, b);
  else gk.ukernel_b_in_place[m](kc, a, bp, ldb, out, ldo, alpha, b);
  if (!full) store_edge_tile(tile, nr, m, n, g.alpha, beta, c, g.ldc);
}

// One pass of the driver: the kc x nc block of B at depth pc and column jc, and how to reach
// its panels (packed into Bp, pre-packed, or read in place).
template <class T>
struct BPass {
  const GemmArgs<T>& g;
  std::int64_t jc, nc, pc, kc;
  int nr;
  std::int64_t first_packed;  // panels before it are read in place (B in place)
  T* Bp;
  T beta;                     // g.beta for the first pass over K, then 1
  const T* panel(std::int64_t jr) const {
    if (g.packed_b != nullptr) return g.packed_b->panel(g.b_col + jc + jr, pc);
    return jr / nr < first_packed ? g.B + pc * g.ldb + jc + jr : Bp + jr * kc;
  }
  std::int64_t ld(std::int64_t jr) const { return jr / nr < first_packed ? g.ldb : std::int64_t{nr}; }
  bool packed(std::int64_t jr) const { return jr / nr >= first_packed; }
  std::int64_t width(std::int64_t jr) const { return std::min<std::int64_t>(nr, nc - jr); }
};

// A read in place: rows outer; the mr x kc slice of A stays in L1 across the few column panels.
template <class T>
void pass_a_in_place(const BPass<T>& bp, const simd::GemmKernels<T>& gk, const Mode<T>& mode, std::int64_t i_begin,
                   std::int64_t i_end, T* tile) {
  const GemmArgs<T>& g = bp.g;
  const int mr = mode.bs.mr;
  for (std::int64_t i = i_begin; i < i_end; i += mr) {
    const std::int64_t m = std::min<std::int64_t>(mr, i_end - i);
    for (std::int64_t jr = 0; jr < bp.nc; jr += bp.nr)
      run_tile(g, gk, mode, bp.kc, g.A + i * g.lda + bp.pc, g.lda, bp.panel(jr), bp.ld(jr), bp.packed(jr), i,
               bp.jc + jr, m, bp.width(jr), bp.beta, tile);
  }
}

// B in place (few rows of C) or pre-packed (with few rows per thread): columns outer, so each
// kc x nr panel of B is read from L3 once and reused, from L1 or L2, across the rows of the
// packed mc x kc block of A (in L2). With a_ready, A is one mc x kc block Ap already holds.
// While a B panel's tiles run, they prefetch the next panel into L2.
template <class T>
void pass_columns_outer(const BPass<T>& bp, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
                        const Mode<T>& mode, std::int64_t i_begin, std::int64_t i_end, T* Ap, T* tile, bool a_ready) {
  const int mr = mode.bs.mr;
  for (std::int64_t ic = i_begin; ic < i_end; ic += mode.bs.mc) {
    const std::int64_t mc = std::min<std::int64_t>(mode.bs.mc, i_end - ic);
    if (!a_ready) pack_a(bp.g, vk, ic, mc, bp.pc, bp.kc, mr, Ap);
    NextRows next;
    for (std::int64_t jr = 0; jr < bp.nc; jr += bp.nr) {
      next.clear();
      if (jr + bp.nr < bp.nc) next.add(bp.panel(jr + bp.nr), bp.ld(jr + bp.nr), 1, bp.kc, std::int64_t{bp.nr});
      for (std::int64_t ir = 0; ir < mc; ir += mr)
        run_tile(bp.g, gk, mode, bp.kc, Ap + ir * bp.kc, 0, bp.panel(jr), bp.ld(jr), bp.packed(jr), ic + ir,
                 bp.jc + jr, std::min<std::int64_t>(mr, mc - ir), bp.width(jr), bp.beta, tile, next.take(bp.kc));
    }
  }
}

// B packed: rows outer. Each mr x kc micro-panel of A is packed just before its row of tiles and
// stays in L1 while they sweep the kc x nc block of B, which stays in L2 (rather than columns
// outer with an mc x kc block of A in L2: guarded by gemm/native/1024x1024x1024/t1). The tiles
// prefetch the next micro-panel's rows of A into L2 meanwhile. C goes out with ordinary stores,
// row panel by row panel, which the prefetchers follow (non-temporal stores lose here: guarded
// by gemm/native/2048x2048x64).
template <class T>
void pass_rows_outer(const BPass<T>& bp, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
                     const Mode<T>& mode, std::int64_t i_begin, std::int64_t i_end, T* Ap, T* tile) {
  const GemmArgs<T>& g = bp.g;
  const int mr = mode.bs.mr;
  NextRows next;
  for (std::int64_t i = i_begin; i < i_end; i += mr) {
    const std::int64_t m = std::min<std::int64_t>(mr, i_end - i);
    pack_a(g, vk, i, m, bp.pc, bp.kc, mr, Ap);
    next.clear();
    if (const std::int64_t mn = std::min<std::int64_t>(mr, i_end - i - m); mn > 0) {
      if (g.trans_a == Trans::N) next.add(g.A + (i + m) * g.lda + bp.pc, g.lda, 1, mn, bp.kc);
      else next.add(g.A + bp.pc * g.lda + i + m, g.lda, 1, bp.kc, mn);
    }
    for (std::int64_t jr = 0; jr < bp.nc; jr += bp.nr)
      run_tile(g, gk, mode, bp.kc, Ap, 0, bp.panel(jr), bp.ld(jr), bp.packed(jr), i, bp.jc + jr, m, bp.width(jr),
               bp.beta, tile, next.take(bp.kc));
  }
}

// Deep mode over rows [i_begin, i_end): chunks of rows of A packed over all of K into this
// thread's deep buffer; for each K x nc block of the pre-packed B, every micro-panel of the
// chunk sweeps its panels, each tile over the whole depth. Narrow edge tiles go through `tile`.
template <class T>
void pass_deep(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
               const Mode<T>& mode, std::int64_t i_begin, std::int64_t i_end, T* tile) {
  const simd::GemmBlocking& bs = mode.bs;
  const int mr = bs.mr, nr = bs.nr;
  const PackedB<T>& pb = *g.packed_b;
  const std::int64_t nc = deep_nc<T>(bs, g.K), chunk = deep_chunk_rows<T>(bs, i_end - i_begin, g.K);
  const std::int64_t block_stride = pb.kc * pb.Np;
  T* Ap = thread_buffer<T, scratch::GemmDeepA>().get(static_cast<std::size_t>(chunk * g.K));
  for (std::int64_t ic = i_begin; ic < i_end; ic += chunk) {
    const std::int64_t mc = std::min(chunk, i_end - ic);
    pack_a(g, vk, ic, mc, 0, g.K, mr, Ap);
    for (std::int64_t jc = 0; jc < g.N; jc += nc) {
      const std::int64_t jend = std::min(g.N, jc + nc);
      for (std::int64_t ir = 0; ir < mc; ir += mr) {
        const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
        const T* a = Ap + ir * g.K;
        if (g.c_row != nullptr)  // C's rows start as c_row just before their tiles add to them
          for (std::int64_t r = 0; r < m; ++r)
            std::memcpy(g.C + (ic + ir + r) * g.ldc + jc, g.c_row + jc, sizeof(T) * static_cast<std::size_t>(jend - jc));
        const T beta = g.c_row != nullptr ? T(1) : g.beta;
        for (std::int64_t j = jc; j < jend; j += nr) {
          const std::int64_t n = std::min<std::int64_t>(nr, g.N - j);
          const T* b = pb.panel(g.b_col + j, 0);
          T* c = g.C + (ic + ir) * g.ldc + j;
          if (n == nr) {
            gk.ukernel_deep[m](g.K, pb.kc, a, b, block_stride, c, g.ldc, g.alpha, beta);
            continue;
          }
          gk.ukernel_deep[m](g.K, pb.kc, a, b, block_stride, tile, nr, T(1), T(0));
          store_edge_tile(tile, nr, m, n, g.alpha, beta, c, g.ldc);
        }
      }
    }
  }
}

// The loops over rows [i_begin, i_end) of C (a multiple of mr apart, except at M). Bp receives
// each kc x nc block of B, Aws the packed A; both are the calling thread's own. With
// b_ready, B is one block (single_block) that this thread's Bp already holds, packed; with
// a_ready (columns outer only), A is one mc x kc block that Aws already holds, packed.
template <class T>
void gemm_rows(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
               const Mode<T>& mode, std::int64_t i_begin, std::int64_t i_end, T* Bp, T* Aws, bool b_ready = false,
               bool a_ready = false) {
  const simd::GemmBlocking& bs = mode.bs;
  const Extents<T> ex(g, bs);
  T* tile = Aws + ex.mc * ex.kc;
  if (mode.deep) {
    pass_deep(g, gk, vk, mode, i_begin, i_end, tile);
    return;
  }
  for (std::int64_t jc = 0; jc < g.N; jc += bs.nc) {
    const std::int64_t nc = std::min<std::int64_t>(bs.nc, g.N - jc);
    const std::int64_t panels = (nc + bs.nr - 1) / bs.nr;
    for (std::int64_t pc = 0; pc < g.K; pc += bs.kc) {
      const std::int64_t kc = std::min<std::int64_t>(bs.kc, g.K - pc);
      // B in place: only a partial last panel is packed (reads must stay inside B's rows).
      const std::int64_t first = mode.b_in_place ? nc / bs.nr : 0;
      if (g.packed_b == nullptr && !b_ready) pack_b(g, vk, pc, kc, jc, nc, bs.nr, Bp, first, panels);
      const BPass<T> pass{g, jc, nc, pc, kc, bs.nr, first, Bp, pc == 0 ? g.beta : T(1)};
      if (mode.a_in_place) pass_a_in_place(pass, gk, mode, i_begin, i_end, tile);
      else if (!mode.rows_outer) pass_columns_outer(pass, gk, vk, mode, i_begin, i_end, Aws, tile, a_ready);
      else pass_rows_outer(pass, gk, vk, mode, i_begin, i_end, Aws, tile);
    }
  }
}

// M == 1: y = alpha * x op(B) + beta * y, split over column ranges.
template <class T>
void gemv(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, int threads) {
  const T* x = g.A;
  thread_local std::vector<T> xbuf;
  if (g.trans_a == Trans::T && g.lda != 1) {  // x is a strided column of A: gather it
    xbuf.resize(static_cast<std::size_t>(g.K));
    for (std::int64_t p = 0; p < g.K; ++p) xbuf[p] = g.A[p * g.lda];
    x = xbuf.data();
  }
  constexpr std::int64_t kChunk = 64;  // columns: a multiple of every ISA's vector width
  const std::int64_t chunks = (g.N + kChunk - 1) / kChunk;
  // Bandwidth-bound: a thread is worth its fork/join (a few us) once it streams ~10 us of B.
  constexpr double kMinGemvBytesPerThread = 256.0 * 1024;
  const double bytes_per_chunk = double(g.K) * double(kChunk) * sizeof(T);
  const auto min_chunks = static_cast<std::int64_t>(kMinGemvBytesPerThread / bytes_per_chunk) + 1;
  parallel_for(chunks, threads, min_chunks, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t j0 = c0 * kChunk, j1 = std::min(g.N, c1 * kChunk);
    if (g.packed_b != nullptr) {  // panel by panel, depth block by depth block
      const PackedB<T>& pb = *g.packed_b;
      for (std::int64_t j = j0; j < j1; j += pb.nr)
        for (std::int64_t p = 0; p < g.K; p += pb.kc)
          gk.gemv_n(std::min<std::int64_t>(pb.nr, j1 - j), std::min<std::int64_t>(pb.kc, g.K - p), g.alpha, x + p,
                    pb.panel(g.b_col + j, p), pb.nr, p == 0 ? g.beta : T(1), g.C + j);
    } else if (g.trans_b == Trans::N) gk.gemv_n(j1 - j0, g.K, g.alpha, x, g.B + j0, g.ldb, g.beta, g.C + j0);
    else gk.gemv_t(j1 - j0, g.K, g.alpha, x, g.B + j0 * g.ldb, g.ldb, g.beta, g.C + j0);
  });
}

// Rows split across threads. Each packs every block of B into its own buffer: twice the
// packing work, but no barrier per block and no block half in the other core's cache (guarded
// by gemm/native/1024x1024x1024/t2 and gemm/native/1024x3072x1024/t2).
template <class T>
void split_rows(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
                const Mode<T>& mode, int nt) {
  const simd::GemmBlocking& bs = mode.bs;
  const Extents<T> ex(g, bs);
  const std::int64_t row_units = (g.M + bs.mr - 1) / bs.mr;
  auto rows = [&](std::int64_t u0, std::int64_t u1, T* Bp, T* Aws, bool b_ready) {
    gemm_rows(g, gk, vk, mode, std::min(g.M, u0 * bs.mr), std::min(g.M, u1 * bs.mr), Bp, Aws, b_ready);
  };
  if (nt == 1) {
    with_packing_buffers(ex, bs, [&](T* Bp, T* Aws) { rows(0, row_units, Bp, Aws, false); });
    return;
  }
  RegionFailure failure;
  if (single_block(g, mode)) {
    // One block of B: each thread packs it once, then claims row chunks until none is left, so
    // a thread whose vCPU is descheduled a while (a noisy VM) leaves its rows to the other
    // instead of holding up the call. Which thread computes a row changes none of its bits.
    // Blocks of B past the first would need a barrier each: those keep the static split below.
    const std::int64_t chunks = (row_units + kRowUnitsPerClaim - 1) / kRowUnitsPerClaim;
    parallel_claims(chunks, nt, 1, [&](auto next) {
      failure.guard([&] {
        with_packing_buffers(ex, bs, [&](T* Bp, T* Aws) {
          bool packed = false;  // B, by this thread's first chunk
          for (std::int64_t c = next(); c < chunks; c = next(), packed = true)
            rows(c * kRowUnitsPerClaim, std::min(row_units, (c + 1) * kRowUnitsPerClaim), Bp, Aws, packed);
        });
      });
    });
  } else {
    parallel_for(row_units, nt, 1, [&](std::int64_t u0, std::int64_t u1) {
      failure.guard([&] { with_packing_buffers(ex, bs, [&](T* Bp, T* Aws) { rows(u0, u1, Bp, Aws, false); }); });
    });
  }
  failure.rethrow();
}

// Few rows: the columns split across threads; each runs the whole driver on its own columns
// with its own buffers (packing the small A twice costs little).
template <class T>
void split_columns(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const simd::VectorKernels<T>& vk,
                   const Mode<T>& mode, int nt) {
  const simd::GemmBlocking& bs = mode.bs;
  const std::int64_t col_units = (g.N + bs.nr - 1) / bs.nr;
  // The problem restricted to column panels [u0, u1).
  auto columns = [&](std::int64_t u0, std::int64_t u1) {
    GemmArgs<T> part = g;
    const std::int64_t j0 = u0 * bs.nr, j1 = std::min(g.N, u1 * bs.nr);
    part.N = j1 - j0;
    part.B = g.trans_b == Trans::N ? g.B + j0 : g.B + j0 * g.ldb;
    part.b_col = g.b_col + j0;
    part.C = g.C + j0;
    if (g.c_row != nullptr) part.c_row = g.c_row + j0;
    return part;
  };
  RegionFailure failure;
  // Columns go out in chunks to whichever thread is free (as rows do in split_rows) when a chunk
  // costs no repacking of A: A read in place, or one mc x kc block of it, packed once per
  // thread (guarded by gemm/native/128x768x768/t2). Otherwise each thread takes a static share
  // and packs A once per block.
  if (mode.a_in_place || (!mode.rows_outer && g.M <= bs.mc && g.K <= bs.kc)) {
    const std::int64_t chunks = (col_units + kColUnitsPerClaim - 1) / kColUnitsPerClaim;
    const Extents<T> ex(g, bs);  // sized for the whole problem's columns: one size for every chunk
    parallel_claims(chunks, nt, 1, [&](auto next) {
      failure.guard([&] {
        with_packing_buffers(ex, bs, [&](T* Bp, T* Aws) {
          bool a_packed = false;  // A, by this thread's first chunk (unused when A is read in place)
          for (std::int64_t c = next(); c < chunks; c = next(), a_packed = true) {
            const GemmArgs<T> part = columns(c * kColUnitsPerClaim, std::min(col_units, (c + 1) * kColUnitsPerClaim));
            gemm_rows(part, gk, vk, mode, 0, part.M, Bp, Aws, false, a_packed);
          }
        });
      });
    });
  } else {
    parallel_for(col_units, nt, 1, [&](std::int64_t u0, std::int64_t u1) {
      const GemmArgs<T> part = columns(u0, u1);
      if (part.N <= 0) return;
      // The whole problem's mode, not the slice's: a narrow slice would otherwise switch kernels
      // (and k blocking), and results would depend on the thread count.
      failure.guard([&] {
        with_packing_buffers(Extents<T>(part, bs), bs,
                             [&](T* Bp, T* Aws) { gemm_rows(part, gk, vk, mode, 0, part.M, Bp, Aws); });
      });
    });
  }
  failure.rethrow();
}

}  // namespace

// C's rows set to g.c_row (the driver then adds to them: beta 1, no c_row).
template <class T>
void fill_c_rows(GemmArgs<T>& g) {
  for (std::int64_t i = 0; i < g.M; ++i) std::memcpy(g.C + i * g.ldc, g.c_row, sizeof(T) * static_cast<std::size_t>(g.N));
  g.c_row = nullptr;
  g.beta = T(1);
}

template <class T>
void gemm(const GemmArgs<T>& args, int threads, const simd::KernelTable* kt) {
  if (args.M <= 0 || args.N <= 0) return;
  GemmArgs<T> g = args;
  if (g.K <= 0 || g.alpha == T(0)) {
    if (g.c_row != nullptr) fill_c_rows(g);
    else scale_c(g);
    return;
  }
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  const simd::GemmKernels<T>& gk = table.template gemm<T>();
  const simd::VectorKernels<T>& vk = table.template vec<T>();
  if (const PackedB<T>* pb = g.packed_b) {  // an internal contract: a misuse is a bug here
    if (pb->nr != gk.blocking.nr || pb->kc != gk.blocking.kc || pb->K != g.K || g.b_col % pb->nr != 0 ||
        g.b_col < 0 || g.b_col + g.N > pb->N)
      throw std::logic_error("gemm: the pre-packed B does not match this call or ISA");
  }
  if (g.M == 1) {
    if (g.c_row != nullptr) fill_c_rows(g);
    gemv(g, gk, threads);
    return;
  }
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  const int nt = static_cast<int>(std::clamp<double>(std::min<double>(resolve_threads(threads),
                                                                      flops / kMinFlopsPerThread),
                                                     1.0, 1e6));
  const Mode<T> mode(g, gk, nt);
  if (g.c_row != nullptr && !mode.deep) fill_c_rows(g);  // (deep mode fills them tile row by tile row)
  // Below 8 row tiles per thread a row split is lumpy (128 rows = 11 tiles: 6 + 5); columns
  // split evenly (guarded by gemm/native/128x768x768/t2 and mha/native/bert-layer/t2).
  if (nt == 1 || (g.M + mode.bs.mr - 1) / mode.bs.mr >= 8 * nt) split_rows(g, gk, vk, mode, nt);
  else split_columns(g, gk, vk, mode, nt);
}

template <class T>
void gemm_reserve(const GemmArgs<T>& g, const simd::KernelTable* kt) {
  if (g.M <= 1 || g.N <= 0 || g.K <= 0) return;  // gemv and empty problems use no buffers
  const simd::GemmKernels<T>& gk = (kt ? *kt : simd::kernels()).template gemm<T>();
  simd::GemmBlocking b_in_place = gk.blocking;  // (as Mode has it for B read in place)
  b_in_place.kc = b_in_place.kc_b_in_place;
  const simd::GemmBlocking* blockings[] = {&gk.blocking, &b_in_place, &gk.blocking_a_in_place};
  std::size_t b = 0, a = 0;
  for (const simd::GemmBlocking* bs : blockings) {
    const Extents<T> ex(g, *bs);
    b = std::max(b, ex.b_size());
    a = std::max(a, ex.a_size(*bs));
  }
  thread_buffer<T, scratch::GemmPackedB>().get(b);
  thread_buffer<T, scratch::GemmPackedA>().get(a);
  // Deep mode (a pre-packed B, kDeepMinRows rows or more): a chunk of rows packed over a depth of
  // up to K, chunk * K' <= min(M * K', max(mr * K', kDeepMaxABytes)) for every deep K' <= K.
  const std::int64_t k_blocks = g.K / gk.blocking.kc * gk.blocking.kc, mr = gk.blocking.mr;
  if (g.packed_b != nullptr && g.M >= kDeepMinRows && k_blocks >= kDeepMinBlocks * gk.blocking.kc) {
    const std::int64_t rows = (g.M + mr - 1) / mr * mr;
    const std::int64_t cap = std::max(mr * k_blocks, kDeepMaxABytes / static_cast<std::int64_t>(sizeof(T)));
    thread_buffer<T, scratch::GemmDeepA>().get(static_cast<std::size_t>(std::min(rows * k_blocks, cap)));
  }
}

template <class T>
PackedB<T> pack_matrix_b(const T* B, std::int64_t ldb, std::int64_t K, std::int64_t N, const simd::KernelTable* kt) {
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  const simd::GemmBlocking& bs = table.template gemm<T>().blocking;
  PackedB<T> pb;
  pb.K = K, pb.N = N, pb.nr = bs.nr, pb.kc = bs.kc;
  pb.Np = (N + bs.nr - 1) / bs.nr * bs.nr;
  pb.data.resize(static_cast<std::size_t>(std::max<std::int64_t>(1, K * pb.Np)));
  GemmArgs<T> g;  // B as the driver packs it: each depth block's panels back to back
  g.B = B, g.ldb = ldb;
  for (std::int64_t p = 0; p < K; p += bs.kc)
    pack_b(g, table.template vec<T>(), p, std::min<std::int64_t>(bs.kc, K - p), 0, N, bs.nr,
           const_cast<T*>(pb.panel(0, p)), 0, pb.Np / bs.nr);
  return pb;
}

template <class T>
std::vector<T> unpack_matrix_b(const PackedB<T>& pb) {
  std::vector<T> out(static_cast<std::size_t>(pb.K * pb.N));
  for (std::int64_t p = 0; p < pb.K; p += pb.kc)
    for (std::int64_t j = 0; j < pb.N; j += pb.nr) {
      const T* panel = pb.panel(j, p);
      for (std::int64_t k = p; k < std::min<std::int64_t>(pb.K, p + pb.kc); ++k)
        for (std::int64_t c = 0; c < pb.nr && j + c < pb.N; ++c) out[static_cast<std::size_t>(k * pb.N + j + c)] = panel[(k - p) * pb.nr + c];
    }
  return out;
}

template std::vector<float> unpack_matrix_b<float>(const PackedB<float>&);
template std::vector<double> unpack_matrix_b<double>(const PackedB<double>&);
template void gemm<float>(const GemmArgs<float>&, int, const simd::KernelTable*);
template void gemm<double>(const GemmArgs<double>&, int, const simd::KernelTable*);
template void gemm_reserve<float>(const GemmArgs<float>&, const simd::KernelTable*);
template void gemm_reserve<double>(const GemmArgs<double>&, const simd::KernelTable*);
template PackedB<float> pack_matrix_b<float>(const float*, std::int64_t, std::int64_t, std::int64_t,
                                             const simd::KernelTable*);
template PackedB<double> pack_matrix_b<double>(const double*, std::int64_t, std::int64_t, std::int64_t,
                                               const simd::KernelTable*);

}  // namespace simdattn::detail

#include "gemm.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "prefetch.hpp"
#include "threading.hpp"
#include "workspace.hpp"

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
      // on AVX-512 f32; the scalar loop it replaced, mr read streams and one write stream, made
      // gemm 1024^3/t1 7% slower: 15.89 vs 14.87 ms, /t2 10%: 8.60 vs 7.79 ms, best of 5).
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
    // hardware prefetchers follow (a panel at a time reads a column strip, a new page per row:
    // gemm 1024^3 t1 0.3 ms faster, same-process harness).
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
constexpr std::int64_t kDirectAMaxCols = 128;

// With few rows, each packed B panel is reused by few tiles and packing B costs more than it
// saves (perf: gemm 128x768x768, a BERT projection): up to this many rows the micro-kernel reads
// a row-major B in place. Not when B's rows are a multiple of 4 KiB apart: they would all share
// one L1 set.
constexpr std::int64_t kDirectBMaxRows = 256;
// ... and only while B's rows are at most a page apart: a kc-row panel of wider rows touches a
// page per row, and every load of the in-place kernel risks a TLB miss (perf: mha bert-layer,
// whose QKV projection reads a 768 x 2304 weight, best of 6 runs 5.39 ms packed vs 5.73 ms in
// place).
constexpr std::int64_t kDirectBMaxRowBytes = 4096;

// Columns of B per packed block: the table's nc, fewer if the kc x nc block (kc = min(K, the
// table's kc)) would not fit in half of this CPU's L2, where it stays while every A micro-panel
// sweeps it.
template <class T>
int fit_nc(const simd::GemmBlocking& bs, std::int64_t K) {
  static const long l2 = [] {
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return n > 0 ? n : 1L << 20;  // unknown: assume 1 MiB
  }();
  const long cols = l2 / 2 / (std::min<long>(bs.kc, K) * static_cast<long>(sizeof(T)));
  return static_cast<int>(std::clamp<long>(cols / bs.nr * bs.nr, bs.nr, bs.nc));
}

// A pre-packed B goes rows outer (see gemm_rows) only when each thread has at least this many
// rows: the first sweep of A rows over a block of B pulls it from L3, which few rows do not
// amortise (perf: mha bert-layer's QKV projection, 128x2304x768 pre-packed, same-process
// harness: columns outer 2.68-2.72 ms, rows outer 2.95; 256 rows 5.55 vs 5.80 ms; 384 rows
// 8.69 vs 8.64; gpt-layer's, 1024 rows, 25.7 vs 23.0 ms, and 11.5 vs 11.4 ms at 2 threads).
constexpr std::int64_t kPrepackedRowsOuterMin = 384;

// Which micro-kernel the driver runs, its blocking and loop order, whether A or B is read in
// place. nt: the threads that will split the rows.
template <class T>
struct Mode {
  simd::GemmBlocking bs;
  bool direct_a, direct_b, rows_outer;
  Mode(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, int nt)
      : bs(g.packed_b == nullptr && g.trans_a == Trans::N && g.N <= kDirectAMaxCols ? gk.direct_blocking
                                                                                      : gk.blocking),
        direct_a(g.packed_b == nullptr && g.trans_a == Trans::N && g.N <= kDirectAMaxCols),
        direct_b(g.packed_b == nullptr && !direct_a && g.trans_b == Trans::N && g.M <= kDirectBMaxRows &&
                 (g.ldb * static_cast<std::int64_t>(sizeof(T))) % 4096 != 0 &&
                 g.ldb * static_cast<std::int64_t>(sizeof(T)) <= kDirectBMaxRowBytes),
        rows_outer(!direct_a && !direct_b && (g.packed_b == nullptr || g.M / nt >= kPrepackedRowsOuterMin)) {
    if (rows_outer) bs.nc = fit_nc<T>(bs, g.K);
    if (direct_b) bs.kc = bs.kc_b_in_place;
  }
};

// True if the driver makes a single pass over B: one kc x nc block (kc and nc as the mode
// blocks them), so a thread that has packed it can run any rows with it.
template <class T>
bool single_block(const GemmArgs<T>& g, const Mode<T>& mode) {
  return g.K <= mode.bs.kc && g.N <= mode.bs.nc;
}

// Row tiles (mr rows each) per claim of a dynamic row split: 48 rows of f32 on AVX-512, ~45 us of
// a 2048-wide, 64-deep product; small enough to even out a thread that falls 100 us behind.
constexpr std::int64_t kRowUnitsPerClaim = 4;

// Column panels per claim of a dynamic column split: 64 columns of f32 on AVX-512 (gemm
// 128x768x768: 12 claims of ~35 us).
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

// The calling thread's packing buffers inside a parallel region, where an exception must not
// escape: a failed allocation skips the thread's work and is rethrown after the region.
template <class T>
struct ThreadBuffers {
  bool failed = false;
  // body(Bp, Aws) on this thread's buffers, sized for `ex`.
  template <class Body>
  void run(const Extents<T>& ex, const simd::GemmBlocking& bs, Body&& body) {
    T* Bp = nullptr;
    T* Aws = nullptr;
    try {
      Bp = thread_buffer<T, Scratch::gemm_packed_b>().get(ex.b_size());
      Aws = thread_buffer<T, Scratch::gemm_packed_a>().get(ex.a_size(bs));
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
      return;
    }
    body(Bp, Aws);
  }
  void rethrow() const {
    if (failed) throw std::bad_alloc();
  }
};

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
  if (mode.direct_a) gk.ukernel_direct_a[nr / mode.bs.lanes][m](kc, a, lda, bp, ldb, out, ldo, alpha, b);
  else if (b_packed && pf.lines > 0) gk.ukernel_pf[m](kc, a, bp, ldb, out, ldo, alpha, b, pf.at, pf.lines);
  else if (b_packed) gk.ukernel[m](kc, a, bp, ldb, out, ldo, alpha, b);
  else gk.ukernel_b_in_place[m](kc, a, bp, ldb, out, ldo, alpha, b);
  if (full) return;
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t q = 0; q < n; ++q) {
      T& cij = c[r * g.ldc + q];
      cij = beta == T(0) ? g.alpha * tile[r * nr + q] : g.alpha * tile[r * nr + q] + beta * cij;
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
  const int mr = bs.mr, nr = bs.nr;
  const std::int64_t MC = bs.mc, KC = bs.kc, NC = bs.nc;
  const Extents<T> ex(g, bs);
  T* Ap = Aws;
  T* tile = Aws + ex.mc * ex.kc;

  for (std::int64_t jc = 0; jc < g.N; jc += NC) {
    const std::int64_t nc = std::min(NC, g.N - jc);
    const std::int64_t panels = (nc + nr - 1) / nr;
    for (std::int64_t pc = 0; pc < g.K; pc += KC) {
      const std::int64_t kc = std::min(KC, g.K - pc);
      const T beta = pc == 0 ? g.beta : T(1);
      // B in place: only a partial last panel is packed (reads must stay inside B's rows).
      const std::int64_t first = mode.direct_b ? nc / nr : 0;
      if (g.packed_b == nullptr && !b_ready) pack_b(g, vk, pc, kc, jc, nc, nr, Bp, first, panels);
      // Panel jr of B for this pass, and the distance between its rows.
      auto b_panel = [&](std::int64_t jr) {
        if (g.packed_b != nullptr) return g.packed_b->panel(g.b_col + jc + jr, pc);
        return jr / nr < first ? g.B + pc * g.ldb + jc + jr : Bp + jr * kc;
      };
      auto b_ld = [&](std::int64_t jr) { return jr / nr < first ? g.ldb : std::int64_t{nr}; };
      auto b_packed = [&](std::int64_t jr) { return jr / nr >= first; };
      if (mode.direct_a) {
        // Rows outer: the mr x kc slice of A stays in L1 across the few column panels.
        for (std::int64_t i = i_begin; i < i_end; i += mr) {
          const std::int64_t m = std::min<std::int64_t>(mr, i_end - i);
          for (std::int64_t jr = 0; jr < nc; jr += nr)
            run_tile(g, gk, mode, kc, g.A + i * g.lda + pc, g.lda, b_panel(jr), b_ld(jr), b_packed(jr), i, jc + jr, m,
                     std::min<std::int64_t>(nr, nc - jr), beta, tile);
        }
      } else if (!mode.rows_outer) {
        // B in place (few rows of C) or pre-packed (with few rows per thread): columns outer,
        // so each kc x nr panel of B is read from L3 once and reused, from L1 or L2, across
        // the rows of the packed mc x kc block of A (in L2).
        for (std::int64_t ic = i_begin; ic < i_end; ic += MC) {
          const std::int64_t mc = std::min(MC, i_end - ic);
          if (!a_ready) pack_a(g, vk, ic, mc, pc, kc, mr, Ap);
          // While a B panel's tiles run, they prefetch the next panel into L2.
          NextRows next;
          for (std::int64_t jr = 0; jr < nc; jr += nr) {
            next.clear();
            if (jr + nr < nc) next.add(b_panel(jr + nr), b_ld(jr + nr), 1, kc, std::int64_t{nr});
            for (std::int64_t ir = 0; ir < mc; ir += mr)
              run_tile(g, gk, mode, kc, Ap + ir * kc, 0, b_panel(jr), b_ld(jr), b_packed(jr), ic + ir, jc + jr,
                       std::min<std::int64_t>(mr, mc - ir), std::min<std::int64_t>(nr, nc - jr), beta, tile,
                       next.take(kc));
          }
        }
      } else {
        // B packed: rows outer. Each mr x kc micro-panel of A is packed just before its row of
        // tiles and stays in L1 while they sweep the kc x nc block of B, which stays in L2
        // (columns outer, with an mc x kc block of A in L2 and B's panels meant for L1, had
        // gemm 1024^3 t1 at 14.9 ms, this 13.5-13.7 ms, same-process harness, best of 8). The
        // tiles prefetch the next micro-panel's rows of A into L2 meanwhile. C goes out with
        // ordinary stores, row panel by row panel, which the prefetchers follow (non-temporal
        // stores for a large C written in one pass, a gain with columns outer, lost here: gemm
        // 2048x2048x64 3.54 against 3.36 ms at 1 thread, 1.78 against 1.65 at 2).
        NextRows next;
        for (std::int64_t i = i_begin; i < i_end; i += mr) {
          const std::int64_t m = std::min<std::int64_t>(mr, i_end - i);
          pack_a(g, vk, i, m, pc, kc, mr, Ap);
          next.clear();
          if (const std::int64_t mn = std::min<std::int64_t>(mr, i_end - i - m); mn > 0) {
            if (g.trans_a == Trans::N) next.add(g.A + (i + m) * g.lda + pc, g.lda, 1, mn, kc);
            else next.add(g.A + pc * g.lda + i + m, g.lda, 1, kc, mn);
          }
          for (std::int64_t jr = 0; jr < nc; jr += nr)
            run_tile(g, gk, mode, kc, Ap, 0, b_panel(jr), b_ld(jr), b_packed(jr), i, jc + jr, m,
                     std::min<std::int64_t>(nr, nc - jr), beta, tile, next.take(kc));
        }
      }
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

}  // namespace

template <class T>
void gemm(const GemmArgs<T>& g, int threads, const simd::KernelTable* kt) {
  if (g.M <= 0 || g.N <= 0) return;
  if (g.K <= 0 || g.alpha == T(0)) {
    scale_c(g);
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
    gemv(g, gk, threads);
    return;
  }
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  const int nt = static_cast<int>(std::clamp<double>(std::min<double>(resolve_threads(threads),
                                                                      flops / kMinFlopsPerThread),
                                                     1.0, 1e6));
  const Mode<T> mode(g, gk, nt);
  const simd::GemmBlocking& bs = mode.bs;
  const Extents<T> ex(g, bs);
  const std::int64_t row_units = (g.M + bs.mr - 1) / bs.mr;

  // Below 8 row tiles per thread a row split is lumpy (128 rows = 11 tiles: 6 + 5); columns
  // split evenly (perf: gemm 128x768x768/t2, best of 5 runs 553 us with columns vs 618 us with
  // rows, when rows still shared B between barriers; mha bert-layer/t2 3.18 vs 3.61 ms).
  if (nt == 1 || row_units >= 8 * nt) {
    // Rows split across threads. Each packs every block of B into its own buffer: twice the
    // packing work, but no barrier per block and no block half in the other core's cache
    // (sharing one packed block between barriers was slower at 2 threads, same-process
    // harness, best of 6: gemm 1024^3 6.87 against 6.68 ms, 1024x3072x1024 21.9 against 21.2,
    // 2048x64x2048 1.59 against 1.57).
    if (nt == 1) {
      gemm_rows(g, gk, vk, mode, 0, g.M, thread_buffer<T, Scratch::gemm_packed_b>().get(ex.b_size()),
                thread_buffer<T, Scratch::gemm_packed_a>().get(ex.a_size(bs)));
      return;
    }
    ThreadBuffers<T> buffers;
    if (single_block(g, mode)) {
      // One block of B: each thread packs it once, then claims row chunks until none is left,
      // so a thread whose vCPU is descheduled a while (a noisy VM) leaves its rows to the other
      // instead of holding up the call. Which thread computes a row changes none of its bits.
      // (Same-process harness, alternating, best of 5, at a noisy hour: gemm 2048x2048x64 t2
      // 1.709-1.926 ms against 1.739-1.916 with the static split, oneDNN 1.73-2.19; 2048x64x2048
      // 1.590 against 1.599. Blocks of B past the first would need a barrier each: those keep
      // the static split below.)
      const std::int64_t chunks = (row_units + kRowUnitsPerClaim - 1) / kRowUnitsPerClaim;
      parallel_claims(chunks, nt, 1, [&](auto next) {
        buffers.run(ex, bs, [&](T* Bp, T* Aws) {
          bool packed = false;  // B, by this thread's first chunk
          for (std::int64_t c = next(); c < chunks; c = next(), packed = true) {
            const std::int64_t u0 = c * kRowUnitsPerClaim, u1 = std::min(row_units, u0 + kRowUnitsPerClaim);
            gemm_rows(g, gk, vk, mode, std::min(g.M, u0 * bs.mr), std::min(g.M, u1 * bs.mr), Bp, Aws, packed);
          }
        });
      });
      buffers.rethrow();
      return;
    }
#pragma omp parallel num_threads(nt)
    {
      const int tid = omp_get_thread_num(), T_ = omp_get_num_threads();
      const std::int64_t u0 = row_units * tid / T_, u1 = row_units * (tid + 1) / T_;
      buffers.run(ex, bs, [&](T* Bp, T* Aws) {
        gemm_rows(g, gk, vk, mode, std::min(g.M, u0 * bs.mr), std::min(g.M, u1 * bs.mr), Bp, Aws);
      });
    }
    buffers.rethrow();
    return;
  }

  // Few rows: split the columns instead; each thread runs the whole driver on its own columns
  // with its own buffers (packing the small A twice costs little).
  const std::int64_t col_units = (g.N + bs.nr - 1) / bs.nr;
  ThreadBuffers<T> buffers;
  // The problem restricted to column panels [u0, u1).
  auto columns = [&](std::int64_t u0, std::int64_t u1) {
    GemmArgs<T> part = g;
    const std::int64_t j0 = u0 * bs.nr, j1 = std::min(g.N, u1 * bs.nr);
    part.N = j1 - j0;
    part.B = g.trans_b == Trans::N ? g.B + j0 : g.B + j0 * g.ldb;
    part.b_col = g.b_col + j0;
    part.C = g.C + j0;
    return part;
  };
  // Columns go out in chunks to whichever thread is free (as rows do above) when a chunk costs
  // no repacking of A: A read in place, or one mc x kc block of it, packed once per thread
  // (gemm 128x768x768 t2, same-process harness, alternating, quiet: 0.440-0.446 ms against
  // 0.430-0.445 with static halves, oneDNN 0.429-0.439). Otherwise each thread takes a static
  // share and packs A once per block.
  const bool claim = mode.direct_a || (!mode.rows_outer && g.M <= bs.mc && g.K <= bs.kc);
  if (claim) {
    const std::int64_t chunks = (col_units + kColUnitsPerClaim - 1) / kColUnitsPerClaim;
    parallel_claims(chunks, nt, 1, [&](auto next) {
      // Buffers sized for the whole problem's columns: one size for every chunk.
      buffers.run(ex, bs, [&](T* Bp, T* Aws) {
        bool a_packed = false;  // A, by this thread's first chunk (unused when A is read in place)
        for (std::int64_t c = next(); c < chunks; c = next(), a_packed = true) {
          const GemmArgs<T> part = columns(c * kColUnitsPerClaim, std::min(col_units, (c + 1) * kColUnitsPerClaim));
          gemm_rows(part, gk, vk, mode, 0, part.M, Bp, Aws, false, a_packed);
        }
      });
    });
    buffers.rethrow();
    return;
  }
  parallel_for(col_units, nt, 1, [&](std::int64_t u0, std::int64_t u1) {
    const GemmArgs<T> part = columns(u0, u1);
    if (part.N <= 0) return;
    // The whole problem's mode, not the slice's: a narrow slice would otherwise switch kernels
    // (and k blocking), and results would depend on the thread count.
    buffers.run(Extents<T>(part, bs), bs,
                [&](T* Bp, T* Aws) { gemm_rows(part, gk, vk, mode, 0, part.M, Bp, Aws); });
  });
  buffers.rethrow();
}

template <class T>
void gemm_reserve(const GemmArgs<T>& g, const simd::KernelTable* kt) {
  if (g.M <= 1 || g.N <= 0 || g.K <= 0) return;  // gemv and empty problems use no buffers
  const simd::GemmKernels<T>& gk = (kt ? *kt : simd::kernels()).template gemm<T>();
  simd::GemmBlocking b_in_place = gk.blocking;  // (as Mode has it for B read in place)
  b_in_place.kc = b_in_place.kc_b_in_place;
  const simd::GemmBlocking* blockings[] = {&gk.blocking, &b_in_place, &gk.direct_blocking};
  std::size_t b = 0, a = 0;
  for (const simd::GemmBlocking* bs : blockings) {
    const Extents<T> ex(g, *bs);
    b = std::max(b, ex.b_size());
    a = std::max(a, ex.a_size(*bs));
  }
  thread_buffer<T, Scratch::gemm_packed_b>().get(b);
  thread_buffer<T, Scratch::gemm_packed_a>().get(a);
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

template void gemm<float>(const GemmArgs<float>&, int, const simd::KernelTable*);
template void gemm<double>(const GemmArgs<double>&, int, const simd::KernelTable*);
template void gemm_reserve<float>(const GemmArgs<float>&, const simd::KernelTable*);
template void gemm_reserve<double>(const GemmArgs<double>&, const simd::KernelTable*);
template PackedB<float> pack_matrix_b<float>(const float*, std::int64_t, std::int64_t, std::int64_t,
                                             const simd::KernelTable*);
template PackedB<double> pack_matrix_b<double>(const double*, std::int64_t, std::int64_t, std::int64_t,
                                               const simd::KernelTable*);

}  // namespace simdattn::detail

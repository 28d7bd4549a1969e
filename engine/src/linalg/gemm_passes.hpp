// Part of linalg/gemm.cpp, the one file that includes it: the passes of a call over its tiles
// (A in place, columns outer, rows outer, deep), the matrix-vector product, and the splits of
// the rows or columns among threads. Internal linkage, as when it was written in gemm.cpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

#include "linalg/gemm.hpp"
#include "linalg/gemm_plan.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {
namespace {

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
// kernel; narrow ones (n < nr) go through `tile`, except with A in place, whose kernels compute
// the panel's first vectors only: those as wide as n write C directly (a 32-wide C on AVX-512
// costs two vectors of the four).
template <class T>
inline void run_tile(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const Mode<T>& mode,
                     std::int64_t kc, const T* a, std::int64_t lda, const T* bp, std::int64_t ldb,
                     bool b_packed, std::int64_t i, std::int64_t j, std::int64_t m, std::int64_t n, T beta,
                     T* tile, NextRows::Run pf = {}) {
  const int nr = mode.bs.nr, lanes = mode.bs.lanes;
  const int nv = !mode.a_in_place || n == nr ? mode.nv : static_cast<int>((n + lanes - 1) / lanes);
  T* c = g.C + i * g.ldc + j;
  const bool full = n == nv * lanes;
  T* out = full ? c : tile;
  const std::int64_t ldo = full ? g.ldc : nr;
  const T alpha = full ? g.alpha : T(1), b = full ? beta : T(0);
  if (mode.a_in_place && pf.lines > 0)
    gk.ukernel_a_in_place_pf[nv][m](kc, a, lda, bp, ldb, out, ldo, alpha, b, pf.at, pf.lines);
  else if (mode.a_in_place) gk.ukernel_a_in_place[nv][m](kc, a, lda, bp, ldb, out, ldo, alpha, b);
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
    return jr < first_packed * nr ? g.B + pc * g.ldb + jc + jr : Bp + jr * kc;
  }
  std::int64_t ld(std::int64_t jr) const { return jr < first_packed * nr ? g.ldb : std::int64_t{nr}; }
  bool packed(std::int64_t jr) const { return jr >= first_packed * nr; }
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
               bp.jc + jr, m, bp.width(jr), bp.beta, tile, g.next != nullptr ? g.next->take(bp.kc) : NextRows::Run{});
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

// One thread, B pre-packed for the in-place-A kernel: nothing to plan or pack, the tiles run
// straight over its panels (a narrow edge through a tile on the stack). The arithmetic of
// gemm_rows in that mode: the same bits. For callers that make many small products (the gated
// delta rule's ~5 a chunk and value head: the planning and the per-thread buffers' lookups cost
// ~5% of its run).
template <class T>
void gemm_prepacked_in_place(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk, const Mode<T>& mode) {
  alignas(64) T tile[simd::kMaxMr * simd::kMaxNv * 64 / sizeof(T)];  // mr x nr: nr is at most kMaxNv 64-byte vectors
  const PackedB<T>& pb = *g.packed_b;
  for (std::int64_t pc = 0; pc < g.K; pc += pb.kc) {
    const BPass<T> pass{g, 0, g.N, pc, std::min<std::int64_t>(pb.kc, g.K - pc), mode.bs.nr, 0, nullptr, pc == 0 ? g.beta : T(1)};
    pass_a_in_place(pass, gk, mode, 0, g.M, tile);
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
}  // namespace simdattn::detail

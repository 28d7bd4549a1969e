#include "gemm.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "threading.hpp"

namespace simdattn::detail {
namespace {

// Below this many flops per thread a parallel region costs more than it saves (an OpenMP
// fork/join is a few microseconds; 4 MFLOP is ~16 us at this machine's per-core peak).
// perf/bench_gemm.cpp's 128x768x768 and 1x4096x128 cases sit on either side of it.
constexpr double kMinFlopsPerThread = 4e6;

// Per-thread packing buffers, grown once and reused: no allocation after the first call of a
// given size on a thread. 64-byte aligned for the micro-kernel's aligned B loads.
template <class T>
struct Workspace {
  T* data = nullptr;
  std::size_t capacity = 0;  // elements
  ~Workspace() { std::free(data); }
  T* get(std::size_t n) {
    if (n > capacity) {
      std::free(data);
      const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      data = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (data == nullptr) throw std::bad_alloc();
      capacity = n;
    }
    return data;
  }
};

template <class T>
Workspace<T>& workspace() {
  thread_local Workspace<T> ws;
  return ws;
}

template <class T>
inline T at_a(const GemmArgs<T>& g, std::int64_t i, std::int64_t p) {
  return g.trans_a == Trans::N ? g.A[i * g.lda + p] : g.A[p * g.lda + i];
}

// Ap: ceil(mc / mr) micro-panels; panel r holds, for each k < kc, rows i0 + r*mr .. + mr - 1
// (zero past mc).
template <class T>
void pack_a(const GemmArgs<T>& g, std::int64_t i0, std::int64_t mc, std::int64_t p0, std::int64_t kc,
            int mr, T* Ap) {
  for (std::int64_t ir = 0; ir < mc; ir += mr) {
    const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
    T* dst = Ap + ir * kc;
    if (g.trans_a == Trans::N) {
      for (std::int64_t r = 0; r < m; ++r) {
        const T* src = g.A + (i0 + ir + r) * g.lda + p0;
        for (std::int64_t k = 0; k < kc; ++k) dst[k * mr + r] = src[k];
      }
    } else {
      for (std::int64_t k = 0; k < kc; ++k) {
        const T* src = g.A + (p0 + k) * g.lda + i0 + ir;
        for (std::int64_t r = 0; r < m; ++r) dst[k * mr + r] = src[r];
      }
    }
    for (std::int64_t r = m; r < mr; ++r)
      for (std::int64_t k = 0; k < kc; ++k) dst[k * mr + r] = T(0);
  }
}

// Bp: ceil(nc / nr) micro-panels; panel c holds, for each k < kc, columns j0 + c*nr .. + nr - 1
// (zero past nc).
template <class T>
void pack_b(const GemmArgs<T>& g, std::int64_t p0, std::int64_t kc, std::int64_t j0, std::int64_t nc,
            int nr, T* Bp) {
  for (std::int64_t jr = 0; jr < nc; jr += nr) {
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
      for (std::int64_t c = 0; c < n; ++c) {
        const T* src = g.B + (j0 + jr + c) * g.ldb + p0;
        for (std::int64_t k = 0; k < kc; ++k) dst[k * nr + c] = src[k];
      }
      for (std::int64_t c = n; c < nr; ++c)
        for (std::int64_t k = 0; k < kc; ++k) dst[k * nr + c] = T(0);
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

// The five loops for one thread's part of C.
template <class T>
void gemm_serial(const GemmArgs<T>& g, const simd::GemmKernels<T>& gk) {
  const simd::GemmBlocking& bs = gk.blocking;
  const int mr = bs.mr, nr = bs.nr;
  const std::int64_t MC = bs.mc, KC = bs.kc, NC = bs.nc;
  const std::int64_t kc_max = std::min(KC, g.K);
  const std::int64_t mc_max = (std::min(MC, g.M) + mr - 1) / mr * mr;
  const std::int64_t nc_max = (std::min(NC, g.N) + nr - 1) / nr * nr;
  T* buf = workspace<T>().get(static_cast<std::size_t>(mc_max * kc_max + kc_max * nc_max + mr * nr) + 16);
  T* Bp = buf;                                         // kc x nc_max, 64-byte aligned
  T* Ap = Bp + kc_max * nc_max;                        // mc_max x kc
  T* tile = Ap + mc_max * kc_max;                      // mr x nr scratch for edge tiles

  for (std::int64_t jc = 0; jc < g.N; jc += NC) {
    const std::int64_t nc = std::min(NC, g.N - jc);
    for (std::int64_t pc = 0; pc < g.K; pc += KC) {
      const std::int64_t kc = std::min(KC, g.K - pc);
      const T beta = pc == 0 ? g.beta : T(1);
      pack_b(g, pc, kc, jc, nc, nr, Bp);
      for (std::int64_t ic = 0; ic < g.M; ic += MC) {
        const std::int64_t mc = std::min(MC, g.M - ic);
        pack_a(g, ic, mc, pc, kc, mr, Ap);
        for (std::int64_t jr = 0; jr < nc; jr += nr) {
          const std::int64_t n = std::min<std::int64_t>(nr, nc - jr);
          for (std::int64_t ir = 0; ir < mc; ir += mr) {
            const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
            T* c = g.C + (ic + ir) * g.ldc + jc + jr;
            if (m == mr && n == nr) {
              gk.ukernel(kc, Ap + ir * kc, Bp + jr * kc, c, g.ldc, g.alpha, beta);
            } else {
              gk.ukernel(kc, Ap + ir * kc, Bp + jr * kc, tile, nr, T(1), T(0));
              for (std::int64_t i = 0; i < m; ++i)
                for (std::int64_t j = 0; j < n; ++j) {
                  T& cij = c[i * g.ldc + j];
                  cij = beta == T(0) ? g.alpha * tile[i * nr + j] : g.alpha * tile[i * nr + j] + beta * cij;
                }
            }
          }
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
  const double flops_per_chunk = 2.0 * double(g.K) * double(kChunk);
  const auto min_chunks = static_cast<std::int64_t>(kMinFlopsPerThread / flops_per_chunk) + 1;
  parallel_for(chunks, threads, min_chunks, [&](std::int64_t c0, std::int64_t c1) {
    const std::int64_t j0 = c0 * kChunk, j1 = std::min(g.N, c1 * kChunk);
    if (g.trans_b == Trans::N) gk.gemv_n(j1 - j0, g.K, g.alpha, x, g.B + j0, g.ldb, g.beta, g.C + j0);
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
  const simd::GemmKernels<T>& gk = (kt ? *kt : simd::kernels()).template gemm<T>();
  if (g.M == 1) {
    gemv(g, gk, threads);
    return;
  }
  const int mr = gk.blocking.mr, nr = gk.blocking.nr;
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  // Split the wider dimension of C into units of the register tile: columns keep each thread's
  // B block distinct; rows are used when C is too narrow (e.g. P.V with N = head size).
  const bool split_n = g.N >= 4 * nr || g.N >= g.M;
  const std::int64_t unit = split_n ? nr : mr;
  const std::int64_t units = ((split_n ? g.N : g.M) + unit - 1) / unit;
  const auto min_units = static_cast<std::int64_t>(kMinFlopsPerThread / (flops / double(units))) + 1;
  parallel_for(units, threads, min_units, [&](std::int64_t u0, std::int64_t u1) {
    GemmArgs<T> part = g;
    if (split_n) {
      const std::int64_t j0 = u0 * unit, j1 = std::min(g.N, u1 * unit);
      part.N = j1 - j0;
      part.B = g.trans_b == Trans::N ? g.B + j0 : g.B + j0 * g.ldb;
      part.C = g.C + j0;
    } else {
      const std::int64_t i0 = u0 * unit, i1 = std::min(g.M, u1 * unit);
      part.M = i1 - i0;
      part.A = g.trans_a == Trans::N ? g.A + i0 * g.lda : g.A + i0;
      part.C = g.C + i0 * g.ldc;
    }
    if (part.M > 0 && part.N > 0) gemm_serial(part, gk);
  });
}

template void gemm<float>(const GemmArgs<float>&, int, const simd::KernelTable*);
template void gemm<double>(const GemmArgs<double>&, int, const simd::KernelTable*);

}  // namespace simdattn::detail

#include "linalg/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include <omp.h>
#include <unistd.h>

#include "linalg/gemm_passes.hpp"
#include "linalg/gemm_plan.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {

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
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  const simd::GemmKernels<T>& gk = table.template gemm<T>();
  if (const PackedB<T>* pb = args.packed_b) {  // an internal contract: a misuse is a bug here
    const simd::GemmBlocking& bs = pb->a_in_place ? gk.blocking_a_in_place : gk.blocking;
    if (pb->nr != bs.nr || pb->kc != bs.kc || pb->K != args.K || args.b_col % pb->nr != 0 || args.b_col < 0 ||
        args.b_col + args.N > pb->N || (pb->a_in_place && args.trans_a != Trans::N))
      throw std::logic_error("gemm: the pre-packed B does not match this call or ISA");
    // one thread over a B pre-packed for the in-place-A kernel: straight to its tiles, the
    // arguments read where they are (a copy of them, just written, stalls on store forwarding)
    if (threads == 1 && pb->a_in_place && args.M > 1 && args.K > 0 && args.alpha != T(0) && args.c_row == nullptr)
      return gemm_prepacked_in_place(args, gk, Mode<T>(args, gk, 1));
  }
  GemmArgs<T> g = args;
  if (g.K <= 0 || g.alpha == T(0)) {
    if (g.c_row != nullptr) fill_c_rows(g);
    else scale_c(g);
    return;
  }
  const simd::VectorKernels<T>& vk = table.template vec<T>();
  if (g.M == 1) {
    if (g.c_row != nullptr) fill_c_rows(g);
    gemv(g, gk, threads);
    return;
  }
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  const int nt = threads == 1 ? 1
                              : static_cast<int>(std::clamp<double>(
                                    std::min<double>(resolve_threads(threads), flops / kMinFlopsPerThread), 1.0, 1e6));
  const Mode<T> mode(g, gk, nt);
  if (nt > 1) g.next = nullptr;  // (one thread's lines)
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
PackedB<T> packed_b_zeros(std::int64_t K, std::int64_t N, const simd::KernelTable* kt, bool a_in_place) {
  const simd::GemmKernels<T>& gk = (kt ? *kt : simd::kernels()).template gemm<T>();
  const simd::GemmBlocking& bs = a_in_place ? gk.blocking_a_in_place : gk.blocking;
  PackedB<T> pb;
  pb.K = K, pb.N = N, pb.nr = bs.nr, pb.kc = bs.kc, pb.a_in_place = a_in_place;
  pb.Np = (N + bs.nr - 1) / bs.nr * bs.nr;
  pb.data.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, K * pb.Np)), T(0));
  return pb;
}

template <class T>
PackedB<T> pack_matrix_b(const T* B, std::int64_t ldb, std::int64_t K, std::int64_t N, const simd::KernelTable* kt,
                         bool a_in_place) {
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  PackedB<T> pb = packed_b_zeros<T>(K, N, &table, a_in_place);
  GemmArgs<T> g;  // B as the driver packs it: each depth block's panels back to back
  g.B = B, g.ldb = ldb;
  for (std::int64_t p = 0; p < K; p += pb.kc)
    pack_b(g, table.template vec<T>(), p, std::min<std::int64_t>(pb.kc, K - p), 0, N, pb.nr, const_cast<T*>(pb.panel(0, p)),
           0, pb.Np / pb.nr);
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
                                             const simd::KernelTable*, bool);
template PackedB<double> pack_matrix_b<double>(const double*, std::int64_t, std::int64_t, std::int64_t,
                                               const simd::KernelTable*, bool);
template PackedB<float> packed_b_zeros<float>(std::int64_t, std::int64_t, const simd::KernelTable*, bool);
template PackedB<double> packed_b_zeros<double>(std::int64_t, std::int64_t, const simd::KernelTable*, bool);

}  // namespace simdattn::detail

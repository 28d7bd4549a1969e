// Part of linear_attention/linear_attention.cpp, the one file that includes it: the native
// chunked kernel (LinearPlan, LinearWorker, native<T>). Internal linkage, as when it was written
// in linear_attention.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/problem.hpp"
#include "linalg/panels.hpp"
#include "linear_attention/phi.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/linear.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn {
namespace {

namespace scratch {
struct LinearAttention : detail::ScratchSlot {};  // the native kernel's panels and state
}  // namespace scratch

using detail::Problem;

// dst[r * ldd + d] = phi(src[r * rs + d * ds]) for rows [0, rows), on the dispatched ISA's
// feature-map kernels (NaN kept); ex is scratch of rows * D elements for strided inputs.
template <class T>
void phi_rows(FeatureMap f, const simd::VectorKernels<T>& vk, const T* src, std::int64_t rs, std::int64_t ds,
              std::int64_t rows, std::int64_t D, T* dst, std::int64_t ldd, T* ex) {
  if (ds != 1) {  // gather a strided input first
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t d = 0; d < D; ++d) ex[r * D + d] = src[r * rs + d * ds];
    src = ex;
    rs = D;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    if (f == FeatureMap::elu1) vk.elu1(src + r * rs, dst + r * ldd, D);
    else if (f == FeatureMap::relu) vk.relu(src + r * rs, dst + r * ldd, D);
    else std::memcpy(dst + r * ldd, src + r * rs, sizeof(T) * static_cast<std::size_t>(D));
  }
}

using detail::round_up;

// Every product of the chunked kernel runs on the in-place-A micro-kernel (the fused attention
// kernel's), with the B operands kept in its packed-panel form: no GEMM driver, no per-call
// packing. Panels are tile_cols columns wide, rows tile_cols apart, 64-byte aligned.
//
// Per-thread scratch, in order: QA: rows [phi(q_r) (D) | A_r (Cp)], lq apart, so that one
// product [phi(Q_c) | A] [state; V_c] gives a chunk's numerators | fk, ex [C, D] | KT: phi(K_c)^T
// as key_panels panels [D, tile_cols] | SV: value_panels panels of D + C rows, tile_cols wide, ls
// apart: the state's columns (D rows) over V_c's (C rows, zero past the chunk and Dv) | num [C,
// Dvp] | z [D] | den [C] | ones [C].
template <class T>
struct LinearPlan {
  const Problem& p;
  const LinearAttentionOptions& o;
  const simd::GemmKernels<T>& gk;
  const simd::VectorKernels<T>& vk;
  std::int64_t tile_rows, tile_cols, lanes;  // the in-place-A tile
  std::int64_t C, Cp, Dvp;                   // chunk rows; C and Dv rounded up to tile_cols
  std::int64_t key_panels, value_panels;     // Cp / tile_cols, Dvp / tile_cols
  std::int64_t slice;                        // keys per loaded slice: a vector's width
  std::int64_t lq, ls;                       // row stride of QA, panel stride of SV
  std::int64_t s_qa, s_f, s_kt, s_sv, s_num, s_z, s_den;
  LinearPlan(const Problem& prob, const LinearAttentionOptions& opt)
      : p(prob), o(opt), gk(simd::kernels().gemm<T>()), vk(simd::kernels().vec<T>()) {
    tile_rows = gk.blocking_a_in_place.mr, tile_cols = gk.blocking_a_in_place.nr, lanes = gk.blocking_a_in_place.lanes;
    C = std::max<std::int64_t>(1, std::min(o.chunk, std::max(p.Sq, p.Sk)));
    Cp = round_up(C, tile_cols), Dvp = round_up(p.Dv, tile_cols);
    key_panels = Cp / tile_cols, value_panels = Dvp / tile_cols;
    slice = lanes;
    lq = p.D + Cp, ls = (p.D + C) * tile_cols;
    const std::int64_t al = detail::kLineElems<T>;
    s_qa = round_up(C * lq, al), s_f = round_up(C * p.D, al), s_kt = round_up(key_panels * p.D * tile_cols, al);
    s_sv = round_up(value_panels * ls, al), s_num = round_up(C * Dvp, al);
    s_z = round_up(p.D, al), s_den = round_up(C, al);
  }
  std::size_t scratch_size() const {
    return static_cast<std::size_t>(s_qa + 2 * s_f + s_kt + s_sv + s_num + s_z + s_den + C);
  }
  std::int64_t min_items_per_thread() const {
    const double flops_per_item = 4.0 * double(std::max(p.Sq, p.Sk)) * double(p.D) * double(p.Dv + 1);
    return static_cast<std::int64_t>(detail::kMinFlopsPerThread / std::max(1.0, flops_per_item)) + 1;
  }
};

// One thread's part: heads (b, h), one at a time, on its scratch.
template <class T>
class LinearWorker {
 public:
  LinearWorker(const LinearPlan<T>& plan, T* scratch) : pl_(plan), p_(plan.p) {
    fq_ = scratch, a_ = fq_ + p_.D;
    fk_ = fq_ + pl_.s_qa, ex_ = fk_ + pl_.s_f, kt_ = ex_ + pl_.s_f, sv_ = kt_ + pl_.s_kt, num_ = sv_ + pl_.s_sv;
    z_ = num_ + pl_.s_num, den_ = z_ + pl_.s_z, ones_ = den_ + pl_.s_den;  // ones: z's column sums as a GEMV
    std::fill(ones_, ones_ + pl_.C, T(1));
  }

  void run(std::int64_t b, std::int64_t h);

 private:
  // Every query against every key: the state of all keys first, then each query chunk.
  void full();

  // The causal form, chunk by chunk, a row block at a time (causal_rows). Reading the inputs in
  // small slices between products lets the hardware prefetchers stream them while the FMA units
  // work (loading a whole chunk up front stalls on memory; guarded by linear/native/long).
  void causal();

  // Rows r0 .. r0 + rows of the chunk at c0 (n rows): their Q rows and the keys they are the
  // first to see are loaded, then the masked product A = phi(Q) phi(K_c)^T over the keys
  // j < r0 + rows they can see, num = [phi(Q) | A] [state; V_c] in one product (the state holds
  // the earlier chunks; the first chunk uses A V_c alone), and their output rows are written.
  void causal_rows(std::int64_t c0, std::int64_t n, std::int64_t r0, std::int64_t& keys);

  // fq rows r0.. = phi(Q rows i0 + r0..)
  void load_q(std::int64_t i0, std::int64_t r0, std::int64_t n);

  // Keys [g * slice, g * slice + slice) of the chunk at j0 (n keys): fk rows = phi(K rows), their
  // columns of KT, their rows of SV's V part (zero past n and Dv). The slice divides tile_cols,
  // so it never straddles a panel.
  void load_keys(std::int64_t j0, std::int64_t n, std::int64_t g);

  // Rows [r0, r0 + C) (those below S) of an input or the output, `cols` wide: the next chunk's
  // rows, prefetched by the products of this one.
  void queue(const T* base, const Shape4& st, std::int64_t r0, std::int64_t S, std::int64_t cols);

  // Cm[M, N] (beta: 0 or 1) += A[M, K] (rows lda apart) x B (panels pstride apart); writes
  // columns up to round_up(N, lanes) of Cm.
  void product(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, std::int64_t lda, const T* B,
               std::int64_t pstride, T* Cm, std::int64_t ldc, T beta);

  // state += phi(K_c)^T V_c, key panel by key panel
  void carry(std::int64_t n);

  // den[r] = phi(q_r) . z, rows r0..
  void den_from_z(std::int64_t r0, std::int64_t n);

  // out rows i0 + r0.. = num / (den + eps)
  void write(std::int64_t i0, std::int64_t r0, std::int64_t n);

  const LinearPlan<T>& pl_;
  const Problem& p_;
  T *fq_, *a_, *fk_, *ex_, *kt_, *sv_, *num_, *z_, *den_, *ones_;
  const T *q_ = nullptr, *k_ = nullptr, *v_ = nullptr;  // the current head's inputs
  T* out_ = nullptr;
  detail::NextRows next_;
};

template <class T>
inline void LinearWorker<T>::run(std::int64_t b, std::int64_t h) {
  const std::int64_t hk = h / (p_.H / p_.Hkv);
  q_ = static_cast<const T*>(p_.q) + b * p_.q_strides[0] + h * p_.q_strides[1];
  k_ = static_cast<const T*>(p_.k) + b * p_.k_strides[0] + hk * p_.k_strides[1];
  v_ = static_cast<const T*>(p_.v) + b * p_.v_strides[0] + hk * p_.v_strides[1];
  out_ = static_cast<T*>(p_.o) + b * p_.o_strides[0] + h * p_.o_strides[1];
  std::fill(z_, z_ + p_.D, T(0));
  std::fill(sv_, sv_ + pl_.s_sv, T(0));
  if (pl_.o.causal) causal();
  else full();
}

template <class T>
inline void LinearWorker<T>::full() {
  const std::int64_t C = pl_.C;
  for (std::int64_t j0 = 0; j0 < p_.Sk; j0 += C) {
    const std::int64_t n = std::min(C, p_.Sk - j0);
    next_.clear();
    queue(k_, p_.k_strides, j0 + n, p_.Sk, p_.D);
    queue(v_, p_.v_strides, j0 + n, p_.Sk, p_.Dv);
    for (std::int64_t g = 0; g * pl_.slice < n; ++g) load_keys(j0, n, g);
    pl_.gk.gemv_n(p_.D, n, T(1), ones_, fk_, p_.D, T(1), z_);  // z += column sums of phi(K_c)
    carry(n);
  }
  for (std::int64_t i0 = 0; i0 < p_.Sq; i0 += C) {
    const std::int64_t n = std::min(C, p_.Sq - i0);
    next_.clear();
    queue(q_, p_.q_strides, i0 + n, p_.Sq, p_.D);
    queue(out_, p_.o_strides, i0 + n, p_.Sq, p_.Dv);
    load_q(i0, 0, n);
    product(n, p_.Dv, p_.D, fq_, pl_.lq, sv_, pl_.ls, num_, pl_.Dvp, T(0));
    den_from_z(0, n);
    write(i0, 0, n);
  }
}

template <class T>
inline void LinearWorker<T>::causal() {
  for (std::int64_t c0 = 0; c0 < p_.Sq; c0 += pl_.C) {
    const std::int64_t n = std::min(pl_.C, p_.Sq - c0);
    std::int64_t keys = 0;  // keys of this chunk loaded so far
    next_.clear();
    queue(q_, p_.q_strides, c0 + n, p_.Sq, p_.D);
    queue(k_, p_.k_strides, c0 + n, p_.Sq, p_.D);
    queue(v_, p_.v_strides, c0 + n, p_.Sq, p_.Dv);
    queue(out_, p_.o_strides, c0 + n, p_.Sq, p_.Dv);
    for (std::int64_t r0 = 0; r0 < n; r0 += pl_.tile_rows) causal_rows(c0, n, r0, keys);
    pl_.gk.gemv_n(p_.D, n, T(1), ones_, fk_, p_.D, T(1), z_);  // z += column sums of phi(K_c)
    carry(n);
  }
}

template <class T>
inline void LinearWorker<T>::causal_rows(std::int64_t c0, std::int64_t n, std::int64_t r0, std::int64_t& keys) {
  const std::int64_t tc = pl_.tile_cols, lanes = pl_.lanes, lq = pl_.lq, D = p_.D;
  const std::int64_t rows = std::min(pl_.tile_rows, n - r0), kmax = r0 + rows;
  for (; keys < kmax; keys += pl_.slice) load_keys(c0, n, keys / pl_.slice);
  load_q(c0, r0, rows);
  if (c0 > 0) den_from_z(r0, rows);  // the earlier chunks' key sums
  else std::fill(den_ + r0, den_ + r0 + rows, T(0));
  const T* fqr = fq_ + r0 * lq;
  T* a = a_ + r0 * lq;
  for (std::int64_t c = 0; c * tc < kmax; ++c) {
    const std::int64_t nv = (std::min(tc, kmax - c * tc) + lanes - 1) / lanes;
    const detail::NextRows::Run pf = next_.take(D);
    pl_.gk.ukernel_a_in_place_pf[nv][rows](D, fqr, lq, kt_ + c * D * tc, tc, a + c * tc, lq, T(1), T(0), pf.at,
                                         pf.lines);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    T* ai = a + i * lq;
    std::fill(ai + r0 + i + 1, ai + kmax, T(0));
    den_[r0 + i] += pl_.vk.sum(ai, r0 + i + 1);
  }
  // the first chunk has no state: its product starts past phi(Q) and the state's rows
  const std::int64_t skip = c0 > 0 ? 0 : D;
  for (std::int64_t c = 0; c < pl_.value_panels; ++c) {
    const std::int64_t nv = (std::min(tc, p_.Dv - c * tc) + lanes - 1) / lanes;
    const detail::NextRows::Run pf = next_.take(D + kmax - skip);
    pl_.gk.ukernel_a_in_place_pf[nv][rows](D + kmax - skip, fqr + skip, lq, sv_ + c * pl_.ls + skip * tc, tc,
                                         num_ + r0 * pl_.Dvp + c * tc, pl_.Dvp, T(1), T(0), pf.at, pf.lines);
  }
  write(c0, r0, rows);
}

template <class T>
inline void LinearWorker<T>::load_q(std::int64_t i0, std::int64_t r0, std::int64_t n) {
  phi_rows(pl_.o.feature_map, pl_.vk, q_ + (i0 + r0) * p_.q_strides[2], p_.q_strides[2], p_.q_strides[3], n, p_.D, fq_ + r0 * pl_.lq,
           pl_.lq, ex_);
}

template <class T>
inline void LinearWorker<T>::load_keys(std::int64_t j0, std::int64_t n, std::int64_t g) {
  const std::int64_t G = pl_.slice, tc = pl_.tile_cols, D = p_.D;
  const std::int64_t f = g * G, rows = std::min(G, n - f);
  phi_rows(pl_.o.feature_map, pl_.vk, k_ + (j0 + f) * p_.k_strides[2], p_.k_strides[2], p_.k_strides[3], rows, D, fk_ + f * D, D, ex_);
  pl_.vk.pack_transpose(fk_ + f * D, D, rows, D, kt_ + (f / tc) * D * tc + f % tc, tc, G);
  detail::pack_row_panels(v_ + (j0 + f) * p_.v_strides[2], p_.v_strides[2], p_.v_strides[3], rows, std::min(G, pl_.C - f), p_.Dv, tc,
                          pl_.value_panels, sv_ + (D + f) * tc, pl_.ls);
}

template <class T>
inline void LinearWorker<T>::queue(const T* base, const Shape4& st, std::int64_t r0, std::int64_t S,
                                   std::int64_t cols) {
  if (r0 < S) next_.add(base + r0 * st[2], st[2], st[3], std::min(pl_.C, S - r0), cols);
}

template <class T>
inline void LinearWorker<T>::product(std::int64_t M, std::int64_t N, std::int64_t K, const T* A, std::int64_t lda,
                                     const T* B, std::int64_t pstride, T* Cm, std::int64_t ldc, T beta) {
  const std::int64_t tc = pl_.tile_cols, tr = pl_.tile_rows;
  for (std::int64_t c = 0; c * tc < N; ++c) {
    const std::int64_t nv = (std::min(tc, N - c * tc) + pl_.lanes - 1) / pl_.lanes;
    for (std::int64_t r0 = 0; r0 < M; r0 += tr) {
      const detail::NextRows::Run pf = next_.take(K);
      pl_.gk.ukernel_a_in_place_pf[nv][std::min(tr, M - r0)](K, A + r0 * lda, lda, B + c * pstride, tc,
                                                           Cm + r0 * ldc + c * tc, ldc, T(1), beta, pf.at,
                                                           pf.lines);
    }
  }
}

template <class T>
inline void LinearWorker<T>::carry(std::int64_t n) {
  const std::int64_t tc = pl_.tile_cols, tr = pl_.tile_rows, D = p_.D;
  for (std::int64_t c = 0; c < pl_.value_panels; ++c) {
    const std::int64_t nv = (std::min(tc, p_.Dv - c * tc) + pl_.lanes - 1) / pl_.lanes;
    for (std::int64_t pk = 0; pk * tc < n; ++pk) {
      const std::int64_t kk = std::min(tc, n - pk * tc);
      for (std::int64_t r0 = 0; r0 < D; r0 += tr) {
        const detail::NextRows::Run pf = next_.take(kk);
        pl_.gk.ukernel_a_in_place_pf[nv][std::min(tr, D - r0)](kk, kt_ + pk * D * tc + r0 * tc, tc,
                                                             sv_ + c * pl_.ls + (D + pk * tc) * tc, tc,
                                                             sv_ + c * pl_.ls + r0 * tc, tc, T(1), T(1), pf.at,
                                                             pf.lines);
      }
    }
  }
}

template <class T>
inline void LinearWorker<T>::den_from_z(std::int64_t r0, std::int64_t n) {
  pl_.gk.gemv_t(n, p_.D, T(1), z_, fq_ + r0 * pl_.lq, pl_.lq, T(0), den_ + r0);
}

template <class T>
inline void LinearWorker<T>::write(std::int64_t i0, std::int64_t r0, std::int64_t n) {
  const T eps = static_cast<T>(pl_.o.eps);
  for (std::int64_t r = r0; r < r0 + n; ++r) {
    const T inv = T(1) / (den_[r] + eps);
    T* dst = out_ + (i0 + r) * p_.o_strides[2];
    if (p_.o_strides[3] == 1) pl_.vk.scale_to(num_ + r * pl_.Dvp, dst, p_.Dv, inv);
    else
      for (std::int64_t e = 0; e < p_.Dv; ++e) dst[e * p_.o_strides[3]] = num_[r * pl_.Dvp + e] * inv;
  }
}


template <class T>
void native(const Problem& p, const LinearAttentionOptions& o) {
  const LinearPlan<T> plan(p, o);
  detail::RegionFailure failure;
  // (b, h) items are large (a whole head's sequence) and few: claimed one at a time
  detail::parallel_claims(p.B * p.H, p.threads, plan.min_items_per_thread(), [&](auto next_item) {
    failure.guard([&] {
      LinearWorker<T> worker(plan, detail::thread_buffer<T, scratch::LinearAttention>().get(plan.scratch_size()));
      for (std::int64_t it = next_item(); it < p.B * p.H; it = next_item()) worker.run(it / p.H, it % p.H);
    });
  });
  failure.rethrow();
}

}  // namespace
}  // namespace simdattn

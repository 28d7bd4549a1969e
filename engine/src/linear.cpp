// Linear attention: the reference (double-precision sums straight from the definition), the
// native chunked kernel on the GEMM, and the recurrent state for decoding (see linear.hpp).
#include "simdattn/linear.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "panels.hpp"
#include "prefetch.hpp"
#include "problem.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/error.hpp"
#include "threading.hpp"
#include "workspace.hpp"

namespace simdattn {

std::string_view feature_map_name(FeatureMap f) noexcept {
  switch (f) {
    case FeatureMap::elu1: return "elu1";
    case FeatureMap::relu: return "relu";
    case FeatureMap::identity: return "identity";
  }
  return "?";
}

namespace {

using detail::Problem;

template <class T>
inline T phi(FeatureMap f, T x) {
  switch (f) {
    case FeatureMap::elu1: return x > T(0) ? x + T(1) : std::exp(x);  // NaN -> exp(NaN) = NaN
    case FeatureMap::relu: return x < T(0) ? T(0) : x;                // NaN stays NaN
    case FeatureMap::identity: return x;
  }
  return x;
}

// ---- reference --------------------------------------------------------------------------------

template <class T>
void reference(const Problem& p, const LinearAttentionOptions& o) {
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.o);
  const std::int64_t group = p.H / p.Hkv, W = p.Dv + 1;
  std::vector<double> s(static_cast<std::size_t>(p.D * W)), fq(static_cast<std::size_t>(p.D));
  // s += phi(k_j) [v_j, 1]^T
  auto add_key = [&](std::int64_t b, std::int64_t hk, std::int64_t j) {
    for (std::int64_t d = 0; d < p.D; ++d) {
      const double f = phi<double>(o.feature_map, k[b * p.ks[0] + hk * p.ks[1] + j * p.ks[2] + d * p.ks[3]]);
      for (std::int64_t e = 0; e < p.Dv; ++e)
        s[d * W + e] += f * static_cast<double>(v[b * p.vs[0] + hk * p.vs[1] + j * p.vs[2] + e * p.vs[3]]);
      s[d * W + p.Dv] += f;
    }
  };
  auto write_row = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    for (std::int64_t d = 0; d < p.D; ++d)
      fq[d] = phi<double>(o.feature_map, q[b * p.qs[0] + h * p.qs[1] + i * p.qs[2] + d * p.qs[3]]);
    double den = o.eps;
    for (std::int64_t d = 0; d < p.D; ++d) den += fq[d] * s[d * W + p.Dv];
    for (std::int64_t e = 0; e < p.Dv; ++e) {
      double num = 0.0;
      for (std::int64_t d = 0; d < p.D; ++d) num += fq[d] * s[d * W + e];
      out[b * p.os[0] + h * p.os[1] + i * p.os[2] + e * p.os[3]] = static_cast<T>(num / den);
    }
  };
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h) {
      const std::int64_t hk = h / group;
      std::fill(s.begin(), s.end(), 0.0);
      if (!o.causal) {
        for (std::int64_t j = 0; j < p.Sk; ++j) add_key(b, hk, j);
        for (std::int64_t i = 0; i < p.Sq; ++i) write_row(b, h, i);
      } else {
        for (std::int64_t i = 0; i < p.Sq; ++i) {
          add_key(b, hk, i);
          write_row(b, h, i);
        }
      }
    }
}

// ---- native -----------------------------------------------------------------------------------

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
// packing. Panels are dnr columns wide, rows dnr apart, 64-byte aligned.
template <class T>
void native(const Problem& p, const LinearAttentionOptions& o) {
  const simd::KernelTable& kt = simd::kernels();
  const simd::GemmKernels<T>& gk = kt.gemm<T>();
  const simd::VectorKernels<T>& vk = kt.vec<T>();
  const std::int64_t dmr = gk.direct_blocking.mr, dnr = gk.direct_blocking.nr, lanes = gk.direct_blocking.lanes;
  const std::int64_t group = p.H / p.Hkv, D = p.D, Dv = p.Dv;
  const std::int64_t C = std::max<std::int64_t>(1, std::min(o.chunk, std::max(p.Sq, p.Sk)));
  const std::int64_t Cp = round_up(C, dnr), Dvp = round_up(Dv, dnr), npk = Cp / dnr, npv = Dvp / dnr;
  const std::int64_t al = 64 / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t G = lanes;  // keys per loaded slice
  // QA: rows [phi(q_r) (D) | A_r (Cp)], lq apart, so that one product [phi(Q_c) | A] [state; V_c]
  // gives a chunk's numerators | fk, ex [C, D] | KT: phi(K_c)^T as npk panels [D, dnr] | SV: npv
  // panels of D + C rows, dnr wide, ls apart: the state's columns (D rows) over V_c's (C rows,
  // zero past the chunk and Dv) | num [C, Dvp] | z [D] | den [C] | ones [C]
  const std::int64_t lq = D + Cp, ls = (D + C) * dnr;
  const std::int64_t s_qa = round_up(C * lq, al), s_f = round_up(C * D, al), s_kt = round_up(npk * D * dnr, al);
  const std::int64_t s_sv = round_up(npv * ls, al), s_num = round_up(C * Dvp, al);
  const std::size_t need =
      static_cast<std::size_t>(s_qa + 2 * s_f + s_kt + s_sv + s_num + round_up(D, al) + round_up(C, al) + C);
  const double flops_per_item = 4.0 * double(std::max(p.Sq, p.Sk)) * double(D) * double(Dv + 1);
  const auto min_items = static_cast<std::int64_t>(detail::kMinFlopsPerThread / std::max(1.0, flops_per_item)) + 1;

  // C[M, N] (beta: 0 or 1) += A[M, K] (rows lda apart) x B (panels pstride apart), prefetching
  // from `next` meanwhile; writes columns up to round_up(N, lanes) of C.
  auto mm = [&](std::int64_t M, std::int64_t N, std::int64_t K, const T* A, std::int64_t lda, const T* B,
                std::int64_t pstride, T* Cm, std::int64_t ldc, T beta, detail::NextRows& next) {
    for (std::int64_t c = 0; c * dnr < N; ++c) {
      const std::int64_t nv = (std::min(dnr, N - c * dnr) + lanes - 1) / lanes;
      for (std::int64_t r0 = 0; r0 < M; r0 += dmr) {
        const detail::NextRows::Run pf = next.take(K);
        gk.ukernel_direct_a_pf[nv][std::min(dmr, M - r0)](K, A + r0 * lda, lda, B + c * pstride, dnr,
                                                         Cm + r0 * ldc + c * dnr, ldc, T(1), beta, pf.at, pf.lines);
      }
    }
  };

  bool failed = false;
  // (b, h) items are large (a whole head's sequence) and few: claimed one at a time
  detail::parallel_for_each_claimed(p.B * p.H, p.threads, min_items, [&](std::int64_t it0, std::int64_t it1) {
    try {
      T* fq = detail::thread_buffer<T, detail::Scratch::linear>().get(need);
      T* A = fq + D;
      T* fk = fq + s_qa;
      T* ex = fk + s_f;
      T* KT = ex + s_f;
      T* SV = KT + s_kt;
      T* num = SV + s_sv;
      T* z = num + s_num;
      T* den = z + round_up(D, al);
      T* ones = den + round_up(C, al);  // for z's column sums as a matrix-vector product
      std::fill(ones, ones + C, T(1));
      const T eps = static_cast<T>(o.eps);
      for (std::int64_t it = it0; it < it1; ++it) {
        const std::int64_t b = it / p.H, h = it % p.H, hk = h / group;
        const T* q = static_cast<const T*>(p.q) + b * p.qs[0] + h * p.qs[1];
        const T* k = static_cast<const T*>(p.k) + b * p.ks[0] + hk * p.ks[1];
        const T* v = static_cast<const T*>(p.v) + b * p.vs[0] + hk * p.vs[1];
        T* out = static_cast<T*>(p.o) + b * p.os[0] + h * p.os[1];
        // fq rows r0.. = phi(Q rows i0 + r0..)
        auto load_q = [&](std::int64_t i0, std::int64_t r0, std::int64_t n) {
          phi_rows(o.feature_map, vk, q + (i0 + r0) * p.qs[2], p.qs[2], p.qs[3], n, D, fq + r0 * lq, lq, ex);
        };
        // Keys [g * G, g * G + G) of the chunk at j0 (n keys): fk rows = phi(K rows), their
        // columns of KT, their rows of SV's V part (zero past n and Dv). G divides dnr, so a slice
        // never straddles a panel.
        auto load_keys = [&](std::int64_t j0, std::int64_t n, std::int64_t g) {
          const std::int64_t f = g * G, rows = std::min(G, n - f);
          phi_rows(o.feature_map, vk, k + (j0 + f) * p.ks[2], p.ks[2], p.ks[3], rows, D, fk + f * D, D, ex);
          vk.pack_transpose(fk + f * D, D, rows, D, KT + (f / dnr) * D * dnr + f % dnr, dnr, G);
          detail::pack_row_panels(v + (j0 + f) * p.vs[2], p.vs[2], p.vs[3], rows, std::min(G, C - f), Dv, dnr, npv,
                                  SV + (D + f) * dnr, ls);
        };
        // The next chunk's rows, prefetched by the products of this one.
        detail::NextRows next;
        // Rows [r0, r0 + C) (those below S) of an input or the output, `cols` wide, queued in next.
        auto queue = [&](const T* base, const Shape4& st, std::int64_t r0, std::int64_t S, std::int64_t cols) {
          if (r0 < S) next.add(base + r0 * st[2], st[2], st[3], std::min(C, S - r0), cols);
        };
        // state += phi(K_c)^T V_c, key panel by key panel
        auto carry = [&](std::int64_t n) {
          for (std::int64_t c = 0; c < npv; ++c) {
            const std::int64_t nv = (std::min(dnr, Dv - c * dnr) + lanes - 1) / lanes;
            for (std::int64_t pk = 0; pk * dnr < n; ++pk) {
              const std::int64_t kk = std::min(dnr, n - pk * dnr);
              for (std::int64_t r0 = 0; r0 < D; r0 += dmr) {
                const detail::NextRows::Run pf = next.take(kk);
                gk.ukernel_direct_a_pf[nv][std::min(dmr, D - r0)](kk, KT + pk * D * dnr + r0 * dnr, dnr,
                                                                 SV + c * ls + (D + pk * dnr) * dnr, dnr,
                                                                 SV + c * ls + r0 * dnr, dnr, T(1), T(1), pf.at,
                                                                 pf.lines);
              }
            }
          }
        };
        auto den_from_z = [&](std::int64_t r0, std::int64_t n) {  // den[r] = phi(q_r) . z, rows r0..
          gk.gemv_t(n, D, T(1), z, fq + r0 * lq, lq, T(0), den + r0);
        };
        // out rows i0 + r0.. = num / (den + eps)
        auto write = [&](std::int64_t i0, std::int64_t r0, std::int64_t n) {
          for (std::int64_t r = r0; r < r0 + n; ++r) {
            const T inv = T(1) / (den[r] + eps);
            T* dst = out + (i0 + r) * p.os[2];
            if (p.os[3] == 1) vk.scale_to(num + r * Dvp, dst, Dv, inv);
            else
              for (std::int64_t e = 0; e < Dv; ++e) dst[e * p.os[3]] = num[r * Dvp + e] * inv;
          }
        };
        std::fill(z, z + D, T(0));
        std::fill(SV, SV + s_sv, T(0));
        if (!o.causal) {
          for (std::int64_t j0 = 0; j0 < p.Sk; j0 += C) {
            const std::int64_t n = std::min(C, p.Sk - j0);
            next.clear();
            queue(k, p.ks, j0 + n, p.Sk, D);
            queue(v, p.vs, j0 + n, p.Sk, Dv);
            for (std::int64_t g = 0; g * G < n; ++g) load_keys(j0, n, g);
            gk.gemv_n(D, n, T(1), ones, fk, D, T(1), z);  // z += column sums of phi(K_c)
            carry(n);
          }
          for (std::int64_t i0 = 0; i0 < p.Sq; i0 += C) {
            const std::int64_t n = std::min(C, p.Sq - i0);
            next.clear();
            queue(q, p.qs, i0 + n, p.Sq, D);
            queue(out, p.os, i0 + n, p.Sq, Dv);
            load_q(i0, 0, n);
            mm(n, Dv, D, fq, lq, SV, ls, num, Dvp, T(0), next);
            den_from_z(0, n);
            write(i0, 0, n);
          }
          continue;
        }
        // The causal form, chunk by chunk, a row block at a time: its Q rows and the keys it is
        // the first to see are loaded, then the masked product A = phi(Q) phi(K_c)^T over the
        // keys j < r0 + rows it can see, num = [phi(Q) | A] [state; V_c] in one product (the
        // state holds the earlier chunks; the first chunk uses A V_c alone), and its output rows
        // are written. Reading the inputs in small slices between products lets the hardware
        // prefetchers stream them while the FMA units work (loading a whole chunk up front
        // stalled on memory for ~30% of the time).
        for (std::int64_t c0 = 0; c0 < p.Sq; c0 += C) {
          const std::int64_t n = std::min(C, p.Sq - c0);
          std::int64_t keys = 0;  // keys of this chunk loaded so far
          next.clear();
          queue(q, p.qs, c0 + n, p.Sq, D);
          queue(k, p.ks, c0 + n, p.Sq, D);
          queue(v, p.vs, c0 + n, p.Sq, Dv);
          queue(out, p.os, c0 + n, p.Sq, Dv);
          for (std::int64_t r0 = 0; r0 < n; r0 += dmr) {
            const std::int64_t rows = std::min(dmr, n - r0), kmax = r0 + rows;
            for (; keys < kmax; keys += G) load_keys(c0, n, keys / G);
            load_q(c0, r0, rows);
            if (c0 > 0) den_from_z(r0, rows);  // the earlier chunks' key sums
            else std::fill(den + r0, den + r0 + rows, T(0));
            const T* fqr = fq + r0 * lq;
            T* a = A + r0 * lq;
            T* nr = num + r0 * Dvp;
            for (std::int64_t c = 0; c * dnr < kmax; ++c) {
              const std::int64_t nv = (std::min(dnr, kmax - c * dnr) + lanes - 1) / lanes;
              const detail::NextRows::Run pf = next.take(D);
              gk.ukernel_direct_a_pf[nv][rows](D, fqr, lq, KT + c * D * dnr, dnr, a + c * dnr, lq, T(1), T(0), pf.at,
                                               pf.lines);
            }
            for (std::int64_t i = 0; i < rows; ++i) {
              T* ai = a + i * lq;
              std::fill(ai + r0 + i + 1, ai + kmax, T(0));
              den[r0 + i] += vk.sum(ai, r0 + i + 1);
            }
            // the first chunk has no state: its product starts past phi(Q) and the state's rows
            const std::int64_t skip = c0 > 0 ? 0 : D;
            for (std::int64_t c = 0; c < npv; ++c) {
              const std::int64_t nv = (std::min(dnr, Dv - c * dnr) + lanes - 1) / lanes;
              const detail::NextRows::Run pf = next.take(D + kmax - skip);
              gk.ukernel_direct_a_pf[nv][rows](D + kmax - skip, fqr + skip, lq, SV + c * ls + skip * dnr, dnr,
                                               nr + c * dnr, Dvp, T(1), T(0), pf.at, pf.lines);
            }
            write(c0, r0, rows);
          }
          gk.gemv_n(D, n, T(1), ones, fk, D, T(1), z);  // z += column sums of phi(K_c)
          carry(n);
        }
      }
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
  });
  if (failed) throw std::bad_alloc();
}

}  // namespace

void linear_attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                      const TensorView& out, const LinearAttentionOptions& options) {
  AttentionOptions a;  // shapes, dtypes, strides, overlap, threads: the attention rules
  a.threads = options.threads;
  const Problem p = detail::make_problem(q, k, v, out, a);
  if (options.causal && p.Sq != p.Sk)
    throw Error("options.causal", "causal linear attention needs Sq == Sk, got Sq=" + std::to_string(p.Sq) +
                                      ", Sk=" + std::to_string(p.Sk));
  if (!(options.eps >= 0.0) || !std::isfinite(options.eps))
    throw Error("options.eps", "must be finite and >= 0, got " + std::to_string(options.eps));
  if (options.chunk < 1) throw Error("options.chunk", "must be >= 1, got " + std::to_string(options.chunk));
  if (options.feature_map != FeatureMap::elu1 && options.feature_map != FeatureMap::relu &&
      options.feature_map != FeatureMap::identity)
    throw Error("options.feature_map", "unknown value " + std::to_string(int(options.feature_map)));
  if (options.backend == Backend::onednn)
    throw Error("options.backend", "linear attention runs on the reference and native backends (oneDNN has no "
                                   "primitive for it)");
  if (options.backend != Backend::reference && options.backend != Backend::native)
    throw Error("options.backend", "unknown value " + std::to_string(int(options.backend)));
  if (p.B == 0 || p.H == 0 || p.Sq == 0 || p.Dv == 0) return;
  if (options.backend == Backend::reference) {
    if (p.dtype == DType::f32) reference<float>(p, options);
    else reference<double>(p, options);
  } else {
    if (p.dtype == DType::f32) native<float>(p, options);
    else native<double>(p, options);
  }
}

// ---- recurrent state --------------------------------------------------------------------------

LinearAttentionState::LinearAttentionState(DType dtype, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                                           std::int64_t head_dim, std::int64_t value_dim, FeatureMap feature_map,
                                           double eps)
    : dtype_(dtype), B_(batch), H_(heads), Hkv_(kv_heads), D_(head_dim), Dv_(value_dim), phi_(feature_map), eps_(eps) {
  detail::check_isa();
  if (dtype != DType::f32 && dtype != DType::f64)
    throw Error("dtype", "expected f32 or f64, got " + std::string(dtype_name(dtype)));
  if (batch < 1 || heads < 1 || kv_heads < 1 || head_dim < 1 || value_dim < 1)
    throw Error("shape", "batch, heads, kv_heads, head_dim and value_dim must be >= 1");
  if (heads % kv_heads != 0)
    throw Error("kv_heads", "expected a divisor of heads " + std::to_string(heads) + ", got " + std::to_string(kv_heads));
  if (!(eps >= 0.0) || !std::isfinite(eps)) throw Error("eps", "must be finite and >= 0");
  s_.assign(static_cast<std::size_t>(B_ * Hkv_ * D_ * (Dv_ + 1)), 0.0);
  fq_.assign(static_cast<std::size_t>(D_), 0.0);
}

void LinearAttentionState::reset() noexcept {
  std::fill(s_.begin(), s_.end(), 0.0);
  tokens_ = 0;
}

namespace {

void check_step_view(const char* name, const ConstTensorView& t, DType dtype, const Shape4& want) {
  if (t.dtype != dtype)
    throw Error(name, "dtype " + std::string(dtype_name(t.dtype)) + " differs from the state's " +
                          std::string(dtype_name(dtype)));
  if (t.shape != want)
    throw Error(name, "expected shape [" + std::to_string(want[0]) + ", " + std::to_string(want[1]) + ", 1, " +
                          std::to_string(want[3]) + "], got [" + std::to_string(t.shape[0]) + ", " +
                          std::to_string(t.shape[1]) + ", " + std::to_string(t.shape[2]) + ", " +
                          std::to_string(t.shape[3]) + "]");
  if (t.data == nullptr) throw Error(name, "null data");
  for (int d = 0; d < 4; ++d)
    if (t.strides[d] < 0) throw Error(name, "negative stride");
}

template <class T>
double at(const ConstTensorView& t, std::int64_t a, std::int64_t b, std::int64_t d) {
  return static_cast<double>(static_cast<const T*>(t.data)[a * t.strides[0] + b * t.strides[1] + d * t.strides[3]]);
}

}  // namespace

void LinearAttentionState::step(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                                const TensorView& out) {
  check_step_view("q", q, dtype_, {B_, H_, 1, D_});
  check_step_view("k", k, dtype_, {B_, Hkv_, 1, D_});
  check_step_view("v", v, dtype_, {B_, Hkv_, 1, Dv_});
  check_step_view("out", ConstTensorView(out.data, out.dtype, out.shape, out.strides), dtype_, {B_, H_, 1, Dv_});
  const bool f32 = dtype_ == DType::f32;
  const std::int64_t W = Dv_ + 1, group = H_ / Hkv_;
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t hk = 0; hk < Hkv_; ++hk) {
      double* s = s_.data() + (b * Hkv_ + hk) * D_ * W;
      for (std::int64_t d = 0; d < D_; ++d) {
        const double f = phi<double>(phi_, f32 ? at<float>(k, b, hk, d) : at<double>(k, b, hk, d));
        for (std::int64_t e = 0; e < Dv_; ++e) s[d * W + e] += f * (f32 ? at<float>(v, b, hk, e) : at<double>(v, b, hk, e));
        s[d * W + Dv_] += f;
      }
    }
  for (std::int64_t b = 0; b < B_; ++b)
    for (std::int64_t h = 0; h < H_; ++h) {
      const double* s = s_.data() + (b * Hkv_ + h / group) * D_ * W;
      for (std::int64_t d = 0; d < D_; ++d)
        fq_[static_cast<std::size_t>(d)] = phi<double>(phi_, f32 ? at<float>(q, b, h, d) : at<double>(q, b, h, d));
      double den = eps_;
      for (std::int64_t d = 0; d < D_; ++d) den += fq_[static_cast<std::size_t>(d)] * s[d * W + Dv_];
      for (std::int64_t e = 0; e < Dv_; ++e) {
        double num = 0.0;
        for (std::int64_t d = 0; d < D_; ++d) num += fq_[static_cast<std::size_t>(d)] * s[d * W + e];
        const std::int64_t off = b * out.strides[0] + h * out.strides[1] + e * out.strides[3];
        if (f32) static_cast<float*>(out.data)[off] = static_cast<float>(num / den);
        else static_cast<double*>(out.data)[off] = num / den;
      }
    }
  ++tokens_;
}

}  // namespace simdattn

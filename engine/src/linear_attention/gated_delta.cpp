// The gated delta rule (simdattn/linear.hpp): the recurrence (T = 1) and the chunked WY / UT form,
// each (batch, value head) on one thread (its checks: gated_delta_checks.cpp; its products on the
// bf16 pair kernels: gated_delta_pairs.cpp).
//
// Chunk form. Within a chunk of n steps from state S0, with gamma_t = g_0 + .. + g_t (the chunk's
// cumulative log decay), the recurrence unrolls to
//   S_t = e^gamma_t S0 + sum_{s <= t} e^(gamma_t - gamma_s) k_s u_s^T
//   u_t = beta_t (v_t - e^gamma_t S0^T k_t - sum_{s < t} e^(gamma_t - gamma_s) (k_t . k_s) u_s)
//   o_t = e^gamma_t S0^T q_t + sum_{s <= t} e^(gamma_t - gamma_s) (q_t . k_s) u_s
// so the u_t follow by one forward substitution over the chunk's lower-triangular (I + L) (the
// UT transform of the WY representation), and the chunk's end state is e^gamma_last S0 +
// sum_s e^(gamma_last - gamma_s) k_s u_s^T. Every exponent is <= 0 (g <= 0).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "core/element.hpp"
#include "core/fp_env.hpp"
#include "core/problem.hpp"
#include "core/validate/validate.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "linear_attention/gated_delta.hpp"
#include "linear_attention/gated_delta_pairs.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"
#include "simdattn/simd/isa.hpp"
#include "simdattn/simd/kernels.hpp"
#include "simdattn/error.hpp"
#include "simdattn/linear.hpp"

namespace simdattn {
namespace {

using Sizes = detail::GdrSizes;

// Tokens a chunk. The state's products cost the same at any chunk size while the within-chunk ones
// (the forward substitution, the masked (Q K^T) U, [K; Q] K^T) grow with it: 32 measured faster
// than 48 and 64 (flash-linear-attention's and SGLang's choice) on gdr-prefill8k, 16 no faster
// (docs/linear-attention.md).
constexpr std::int64_t kChunk = 32;

// The chunk's cumulative log decays are summed in double from each step's log decay raised to at
// least -kDecayFloor: every weight e^(gamma_t - gamma_s) or e^gamma_t whose span holds such a step
// is 0 in f32 either way (exp underflows below -150), and the sums stay small enough (32 x 1024)
// that each difference keeps a double's precision (in f32, a decay of -200 would leave the weak
// ones after it a few bits; one of -3e38 overflows the sum).
constexpr double kDecayFloor = 1024.0;

// Lines of the next work item's rows the chunk on the pair kernels prefetches after each of its
// products (NextRows::prefetch_now: the pair kernels do not prefetch as the f32 ones do): a work item of two value heads reads and writes 768 lines a chunk
// (bf16 q, k, v and out rows of 32 tokens), over 2 x 3 such calls.
constexpr std::int64_t kPrefetchLines = 128;

// C = A B + accumulate C (A M x Kd, row-major, rows lda apart; B columns b_col .. b_col + N - 1 of
// a pre-packed B) on the calling thread: a (batch, value head)'s products are one thread's work.
// The product prefetches `next`'s lines as it goes.
void product(std::int64_t M, std::int64_t N, std::int64_t Kd, const float* A, std::int64_t lda, const detail::PackedB<float>* B,
             std::int64_t b_col, float* C, std::int64_t ldc, float accumulate, detail::NextRows* next) {
  detail::GemmArgs<float> args;
  args.M = M, args.N = N, args.K = Kd, args.A = A, args.lda = lda, args.packed_b = B, args.b_col = b_col;
  args.beta = accumulate, args.C = C, args.ldc = ldc, args.next = next;
  detail::gemm(args, 1);
}

// One (batch, value head): its query and key rows (normalized, q scaled), values, decays and betas
// read into f32 rows, then the recurrence or the chunks over S [Dk, Dv].
struct HeadRun {
  const ConstTensorView &q, &k, &v, &g, &beta;
  const Sizes& z;
  bool l2;
  float scale;
  bool pairs;  // the chunks' products on the bf16 pair kernels (GdrProducts)

  void row(const ConstTensorView& x, std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t n, float* dst, bool norm,
           float mult) const {
    const std::int64_t at0 = b * x.strides[0] + t * x.strides[1] + h * x.strides[2];
    const simd::KernelTable& kt = simd::kernels();
    const float* src = dst;  // the row as f32: in place for f32 rows, else widened into dst
    if (x.dtype == DType::f32 && x.strides[3] == 1) {
      src = static_cast<const float*>(x.data) + at0;
    } else if (x.dtype == DType::f32) {  // (the common cases without the per-element dtype dispatch)
      const float* p = static_cast<const float*>(x.data) + at0;
      for (std::int64_t d = 0; d < n; ++d) dst[d] = p[d * x.strides[3]];
    } else if (x.strides[3] == 1) {  // bf16, f16: a row widened by the SIMD kernel
      (x.dtype == DType::bf16 ? kt.convert_bf16 : kt.convert_f16).widen(static_cast<const std::uint16_t*>(x.data) + at0, dst, n);
    } else {
      for (std::int64_t d = 0; d < n; ++d) dst[d] = detail::gdr_at(x, b, t, h, d);
    }
    if (norm || mult != 1.0f) kt.delta.scale_row(src, dst, n, mult, 1e-6f, norm);
    else if (src != dst) std::copy_n(src, n, dst);
  }

  // One token's u = beta (v - decay S^T k) and o = decay S^T q + (k . q) u, from a first pass's
  // sums sk = S^T k and sq = S^T q (o may be sq).
  static void one_token(std::int64_t Dk, std::int64_t Dv, const float* k, const float* q, const float* v, float decay,
                        float beta, const float* sk, const float* sq, float* u, float* o) {
    float kq = 0.0f;
    for (std::int64_t d = 0; d < Dk; ++d) kq += k[d] * q[d];
    for (std::int64_t e = 0; e < Dv; ++e) {
      u[e] = beta * (v[e] - decay * sk[e]);
      o[e] = decay * sq[e] + kq * u[e];
    }
  }

  // One chunk of n >= 2 steps from state S (updated in place; its queries follow K's n rows): the
  // products on the GEMM (KS = K S, QS = Q S, O += (masked, weighted QK) U, S = e^gamma_last S + K^T
  // (w U)), the weights e^(gamma_i - gamma_s) in one vector kernel, the forward substitution row by
  // row (each row's sums in registers). S and U live in the GEMM's packed layout for A read in
  // place (neither is ever packed: U is built there, S updated there a panel at a time). KKQK: [K;
  // Q] K^T, Kt: K^T (row-major, rows ldkt apart), both given (once for the value heads that share
  // the keys). V's rows ldv apart, O's ldo apart (the call's own arrays where they are f32 rows).
  // work: 2 n Dv + 2 n^2 + 2 n floats. The products prefetch `next`'s lines as they go.
  void chunk(std::int64_t n, const float* K, const float* KKQK, const float* Kt, std::int64_t ldkt, const float* V,
             std::int64_t ldv, const double* gam, const float* bet, detail::PackedB<float>& S, detail::PackedB<float>& U,
             float* O, std::int64_t ldo, float* work, detail::NextRows* next, detail::GdrPairs* b16, detail::Packed16* Sb) const {
    const std::int64_t Dk = z.Dk, Dv = z.Dv, nr = U.nr;
    const simd::DeltaKernels& del = simd::kernels().delta;
    float* KS = work;  // then QS
    float* QS = KS + n * Dv;
    float* QK = QS + n * Dv;  // masked and weighted
    float* A = QK + n * n;    // the substitution's
    float* eg = A + n * n;    // e^gamma_i
    float* last = eg + n;     // e^(gamma_last - gamma_s)
    U.K = n;  // (its panels n rows deep)
    // [K; Q] (Q right after K's n rows) times S: KS then QS
    if (b16 != nullptr) {
      detail::gdr_product16(2 * n, Dv, Dk, b16->KQ.data(), Dk, b16->KQp, Sb, 0, KS, Dv, 0.0f);
      if (next != nullptr) next->prefetch_now(kPrefetchLines);
    } else {
      product(2 * n, Dv, Dk, K, Dk, &S, 0, KS, Dv, 0.0f, next);
    }
    // u_i = beta_i (v_i - e^gamma_i (S^T k_i)) - sum_{s < i} A[i, s] u_s with A[i, s] = beta_i e^(gamma_i -
    // gamma_s) (k_i . k_s): the right sides (U's panels nr wide, zeros past Dv), then the forward
    // substitution panel by panel (each row's sums in registers)
    del.chunk_weights(n, gam, bet, KKQK, n, KKQK + n * n, n, A, n, QK, n, eg, last);
    for (std::int64_t j = 0; j < Dv; j += nr) {
      float* Uj = U.data.data() + j * n;
      del.right_sides(n, std::min(nr, Dv - j), nr, V + j, ldv, KS + j, Dv, bet, eg, Uj, nr);
      del.forward_substitute(Uj, nr, n, nr, A, n);
    }
    // O = diag(e^gamma) QS + (QK .* e^(gamma_i - gamma_s) on s <= i) U
    del.scale_rows(QS, Dv, n, Dv, eg, O, ldo);
    product(n, Dv, n, QK, n, &U, 0, O, ldo, 1.0f, next);
    // S = e^gamma_last S + K^T (e^(gamma_last - gamma_s) u_s), U's rows weighted in place, S's
    // panels one product each
    for (std::int64_t j = 0; j < Dv; j += nr) del.scale_rows(U.data.data() + j * n, nr, n, nr, last, U.data.data() + j * n, nr);
    if (b16 != nullptr) {
      b16->U.K = n;
      detail::gdr_narrow_to_pairs(U, b16->U, n, 0, Dv);
      // the new state narrowed into its pair panels (the next chunk's B) a panel at a time as it
      // is written, from L1 (or whole, after, with several depth blocks)
      for (std::int64_t p = 0; p < Dk; p += S.kc)
        for (std::int64_t j = 0; j < Dv; j += nr) {
          detail::gdr_product16(std::min<std::int64_t>(S.kc, Dk - p), std::min(nr, Dv - j), n, b16->Kt.data() + p * ldkt, ldkt, b16->Ktp,
                    &b16->U, j, const_cast<float*>(S.panel(j, p)), nr, eg[n - 1]);
          if (Dk <= S.kc) detail::gdr_narrow_to_pairs(S, *Sb, Dk, j, std::min(j + nr, Dv));
          if (next != nullptr) next->prefetch_now(kPrefetchLines);
        }
      if (Dk > S.kc) detail::gdr_narrow_to_pairs(S, *Sb, Dk, 0, Dv);
      return;
    }
    for (std::int64_t p = 0; p < Dk; p += S.kc)
      for (std::int64_t j = 0; j < Dv; j += nr)
        product(std::min<std::int64_t>(S.kc, Dk - p), std::min(nr, Dv - j), n, Kt + p * ldkt, ldkt, &U, j,
                const_cast<float*>(S.panel(j, p)), nr, eg[n - 1], next);
  }

  // One token from state S (packed as chunk()'s): the recurrence in two passes over S, S^T k and
  // S^T q first; then u = beta (v - e^g S^T k), o = e^g S^T q + (k . q) u, and S = e^g S + k u^T
  // written in the second. sk, sq, u: Dv floats each, and 2 nr of scratch.
  void token(const float* kr, const float* qr, const float* vr, float gt, float bt, detail::PackedB<float>& S, float* o,
             float* sk, float* u, float* part) const {
    const std::int64_t Dk = z.Dk, Dv = z.Dv, nr = S.nr;
    const simd::DeltaKernels& del = simd::kernels().delta;
    float* sq = o;
    for (std::int64_t p = 0; p < Dk; p += S.kc)
      for (std::int64_t j = 0; j < Dv; j += nr) {
        const std::int64_t rows = std::min<std::int64_t>(S.kc, Dk - p), w = std::min(nr, Dv - j);
        if (p == 0) {
          del.state_dots(S.panel(j, p), rows, w, nr, kr + p, qr + p, sk + j, sq + j);
          continue;
        }
        del.state_dots(S.panel(j, p), rows, w, nr, kr + p, qr + p, part, part + nr);
        for (std::int64_t e = 0; e < w; ++e) sk[j + e] += part[e], sq[j + e] += part[nr + e];
      }
    const float decay = std::exp(gt);
    one_token(Dk, Dv, kr, qr, vr, decay, bt, sk, sq, u, o);
    for (std::int64_t p = 0; p < Dk; p += S.kc)
      for (std::int64_t j = 0; j < Dv; j += nr) {
        float* P = const_cast<float*>(S.panel(j, p));
        del.state_update(P, nr, P, nr, std::min<std::int64_t>(S.kc, Dk - p), std::min(nr, Dv - j), decay, kr + p, u + j);
      }
  }

  // A thread's buffers for run(), sized once for its whole range of (batch, key head) groups.
  struct Buffers {
    std::vector<float> K, KKQK, V, O;  // K: a chunk's keys, then its queries
    std::vector<double> gam;           // the cumulative log decays (chunk_weights)
    std::vector<float> bet, tmp, work;
    std::vector<float> Kw;      // K^T row-major, where Kt's panels are not (run())
    detail::PackedB<float> U;   // a chunk's U (chunk())
    detail::PackedB<float> Kt;  // K^T, the B of [K; Q] K^T
    std::optional<detail::GdrPairs> b16;  // on the bf16 pair kernels
    Buffers(const Sizes& z, bool pairs)
        : K(static_cast<std::size_t>(2 * kChunk * z.Dk)), KKQK(static_cast<std::size_t>(2 * kChunk * kChunk)),
          V(static_cast<std::size_t>(z.Hv / z.H * kChunk * z.Dv)), O(static_cast<std::size_t>(kChunk * z.Dv)),
          gam(static_cast<std::size_t>(z.Hv / z.H * kChunk)), bet(gam.size()),
          work(static_cast<std::size_t>(2 * kChunk * z.Dv + 2 * kChunk * kChunk + 2 * kChunk)),
          U(detail::packed_b_zeros<float>(kChunk, z.Dv, nullptr, true)),
          Kt(detail::packed_b_zeros<float>(z.Dk, kChunk, nullptr, true)) {
      tmp.resize(static_cast<std::size_t>(2 * z.Dv + 2 * U.nr));
      if (kChunk > Kt.nr || z.Dk > Kt.kc) Kw.resize(static_cast<std::size_t>(kChunk * z.Dk));
      if (pairs) b16.emplace(z, kChunk, Kw.empty() ? std::int64_t{Kt.nr} : kChunk);
    }
  };

  // The rows of q, k, v and out that run(b, hk, j0, jn, .., c0, ..) reads and writes, to prefetch.
  void rows_of(detail::NextRows& nx, std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t jn, std::int64_t c0,
               const TensorView& out) const {
    const std::int64_t n = std::min(kChunk, z.T - c0), r = z.Hv / z.H;
    auto add = [&](const void* data, DType t, const std::int64_t* st, std::int64_t h, std::int64_t cols) {
      const std::int64_t at0 = b * st[0] + c0 * st[1] + h * st[2];
      if (t == DType::f32) nx.add(static_cast<const float*>(data) + at0, st[1], st[3], n, cols);
      else nx.add(static_cast<const std::uint16_t*>(data) + at0, st[1], st[3], n, cols);
    };
    add(q.data, q.dtype, q.strides.data(), hk, z.Dk);
    add(k.data, k.dtype, k.strides.data(), hk, z.Dk);
    for (std::int64_t j = 0; j < jn; ++j) {
      add(v.data, v.dtype, v.strides.data(), hk * r + j0 + j, z.Dv);
      add(out.data, out.dtype, out.strides.data(), hk * r + j0 + j, z.Dv);
    }
  }

  // The chunk from token c0 of value heads hk r + j0 .. + jn - 1 of one (batch, key head) group (r =
  // Hv / H), states S (jn of them, packed as chunk()'s; on the pair kernels each also in Sb's pair
  // panels). The chunk's query and key rows are read, normalized and multiplied ([K; Q] K^T) once
  // for the jn heads. The products prefetch `next`'s lines (the next chunk's rows) as they go.
  void run(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t jn, detail::PackedB<float>* S, detail::Packed16* Sb,
           std::int64_t c0, const TensorView& out, Buffers& buf, detail::NextRows* next) const {
    const std::int64_t Dk = z.Dk, Dv = z.Dv, r = z.Hv / z.H;
    float* const O = buf.O.data();
    const std::int64_t n = std::min(kChunk, z.T - c0);
    float* Kp = buf.K.data();  // the chunk's keys, then its queries (one operand for the products with S and K^T)
    float* Qp = Kp + n * Dk;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = c0 + i;
      row(q, b, t, hk, Dk, Qp + i * Dk, l2, scale);
      row(k, b, t, hk, Dk, Kp + i * Dk, l2, 1.0f);
    }
    // f32 rows of v are read and out's written where they lie (no copy through a buffer)
    const bool v_rows = v.dtype == DType::f32 && v.strides[3] == 1 && n > 1;
    const bool out_rows = out.dtype == DType::f32 && out.strides[3] == 1 && n > 1;
    for (std::int64_t j = 0; j < jn; ++j) {
      const std::int64_t h = hk * r + j0 + j;
      double acc = 0.0;  // (kDecayFloor)
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t t = c0 + i;
        if (!v_rows) row(v, b, t, h, Dv, buf.V.data() + (j * kChunk + i) * Dv, false, 1.0f);
        acc += std::max<double>(detail::gdr_at(g, b, t, h, 0), -kDecayFloor);
        buf.gam[static_cast<std::size_t>(j * kChunk + i)] = acc;
        buf.bet[static_cast<std::size_t>(j * kChunk + i)] = detail::gdr_at(beta, b, t, h, 0);
      }
    }
    // K^T, as [K; Q] K^T's packed B (KK then QK) and, where that is one panel and one depth block
    // (n <= nr, Dk <= kc), row-major (rows nr apart) for the state's update
    const float* Kt = buf.Kw.data();
    std::int64_t ldkt = n;
    if (pairs && n > 1 && buf.b16->direct(n, Dk, buf.U.kc)) {  // (no f32 K^T)
      buf.b16->set(Kp, nullptr, n, Dk, 0, buf.U.kc);
      buf.b16->keys_product(n, Dk, buf.KKQK.data());
    } else if (n > 1) {
      detail::PackedB<float>& P = buf.Kt;
      P.N = n, P.Np = (n + P.nr - 1) / P.nr * P.nr;
      const simd::VectorKernels<float>& vec = simd::kernels().vec_f32;
      for (std::int64_t p = 0; p < Dk; p += P.kc)
        for (std::int64_t j = 0; j < n; j += P.nr)
          vec.pack_transpose(Kp + j * Dk + p, Dk, std::min<std::int64_t>(P.nr, n - j), std::min<std::int64_t>(P.kc, Dk - p),
                             const_cast<float*>(P.panel(j, p)), P.nr, P.nr);
      if (buf.Kw.empty()) Kt = P.data.data(), ldkt = P.nr;
      else vec.pack_transpose(Kp, Dk, n, Dk, buf.Kw.data(), n, n);
      if (pairs) buf.b16->set(Kp, Kt, n, Dk, ldkt, buf.U.kc);  // (K^T's rows contiguous: one panel and depth block of P, or Kw)
      if (!pairs || !buf.b16->keys_product(n, Dk, buf.KKQK.data())) product(2 * n, n, Dk, Kp, Dk, &P, 0, buf.KKQK.data(), n, 0.0f, nullptr);
    }
    for (std::int64_t j = 0; j < jn; ++j) {
      const std::int64_t h = hk * r + j0 + j;
      detail::PackedB<float>& Sj = S[j];
      const std::int64_t ldv = v_rows ? v.strides[1] : Dv, ldo = out_rows ? out.strides[1] : Dv;
      const float* V = v_rows ? static_cast<const float*>(v.data) + b * v.strides[0] + c0 * v.strides[1] + h * v.strides[2]
                              : buf.V.data() + j * kChunk * Dv;
      float* const Oh = out_rows ? static_cast<float*>(out.data) + b * out.strides[0] + c0 * out.strides[1] + h * out.strides[2] : O;
      const double* gam = buf.gam.data() + j * kChunk;
      const float* bet = buf.bet.data() + j * kChunk;
      if (n == 1) {
        float* t = buf.tmp.data();
        token(Kp, Qp, V, static_cast<float>(gam[0]), bet[0], Sj, O, t, t + Dv, t + 2 * Dv);
      } else {
        chunk(n, Kp, buf.KKQK.data(), Kt, ldkt, V, ldv, gam, bet, Sj, buf.U, Oh, ldo, buf.work.data(), next,
              pairs ? &*buf.b16 : nullptr, pairs ? Sb + j : nullptr);
      }
      for (std::int64_t i = 0; i < n && !out_rows; ++i) {
        const std::int64_t at0 = b * out.strides[0] + (c0 + i) * out.strides[1] + h * out.strides[2];
        const float* o = O + i * Dv;
        if (out.dtype == DType::f32 && out.strides[3] == 1) {
          std::copy_n(o, Dv, static_cast<float*>(out.data) + at0);
        } else if (out.dtype == DType::f32) {
          float* p = static_cast<float*>(out.data) + at0;
          for (std::int64_t e = 0; e < Dv; ++e) p[e * out.strides[3]] = o[e];
        } else if (out.strides[3] == 1) {  // bf16, f16: rounded by the SIMD kernel
          const simd::KernelTable& kt = simd::kernels();
          (out.dtype == DType::bf16 ? kt.convert_bf16 : kt.convert_f16).narrow(o, static_cast<std::uint16_t*>(out.data) + at0, Dv);
        } else {
          for (std::int64_t e = 0; e < Dv; ++e) detail::store_at(out.data, out.dtype, at0 + e * out.strides[3], static_cast<double>(o[e]));
        }
      }
    }
  }
};

// A decode step (T = 1) straight from the initial state to the final one, each read twice (the
// second time from cache) and written once: pass 1 gives S^T k and S^T q; then u = beta (v - e^g
// S^T k), out = e^g S^T q + (k . q) u; pass 2 writes e^g S + k u^T (only when the final state is
// asked for). The initial and final state may be the same array.
void decode_step(const HeadRun& run, const Sizes& z, const GatedDeltaRuleOptions& o, const TensorView& out) {
  const bool init = detail::view_given(o.initial_state), fin = detail::view_given(o.final_state);
  const ConstTensorView& is = o.initial_state;
  const TensorView& f = o.final_state;
  const std::int64_t Dk = z.Dk, Dv = z.Dv;
  const simd::DeltaKernels& kern = simd::kernels().delta;
  detail::parallel_for(z.B * z.Hv, o.threads, 1, [&](std::int64_t i0, std::int64_t i1) {
    const detail::FlushDenormals ftz;  // (as the chunks: a decayed state's denormals)
    std::vector<float> q(static_cast<std::size_t>(Dk)), k(q.size()), v(static_cast<std::size_t>(Dv)), sk(v.size()),
        sq(v.size()), u(v.size());
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t b = i / z.Hv, h = i % z.Hv, hq = h / (z.Hv / z.H);
      run.row(run.q, b, 0, hq, Dk, q.data(), run.l2, run.scale);
      run.row(run.k, b, 0, hq, Dk, k.data(), run.l2, 1.0f);
      run.row(run.v, b, 0, h, Dv, v.data(), false, 1.0f);
      const float decay = std::exp(detail::gdr_at(run.g, b, 0, h, 0)), beta = detail::gdr_at(run.beta, b, 0, h, 0);
      std::fill(sk.begin(), sk.end(), 0.0f);
      std::fill(sq.begin(), sq.end(), 0.0f);
      const float* s0 = init ? static_cast<const float*>(is.data) + b * is.strides[0] + h * is.strides[1] : nullptr;
      if (init && is.strides[3] == 1)
        kern.state_dots(s0, Dk, Dv, is.strides[2], k.data(), q.data(), sk.data(), sq.data());
      else if (init)  // (a strided state's rows)
        for (std::int64_t d = 0; d < Dk; ++d) {
          const float* row = s0 + d * is.strides[2];
          const float kd = k[static_cast<std::size_t>(d)], qd = q[static_cast<std::size_t>(d)];
          for (std::int64_t j = 0; j < Dv; ++j) {
            const float x = row[j * is.strides[3]];
            sk[static_cast<std::size_t>(j)] += x * kd, sq[static_cast<std::size_t>(j)] += x * qd;
          }
        }
      HeadRun::one_token(Dk, Dv, k.data(), q.data(), v.data(), decay, beta, sk.data(), sq.data(), u.data(), sq.data());
      for (std::int64_t j = 0; j < Dv; ++j) {
        const float oj = sq[static_cast<std::size_t>(j)];
        const std::int64_t at0 = b * out.strides[0] + h * out.strides[2] + j * out.strides[3];
        if (out.dtype == DType::f32) static_cast<float*>(out.data)[at0] = oj;
        else detail::store_at(out.data, out.dtype, at0, static_cast<double>(oj));
      }
      if (!fin) continue;
      float* s1 = static_cast<float*>(f.data) + b * f.strides[0] + h * f.strides[1];
      const float* uu = u.data();
      if (init && f.strides[3] == 1 && is.strides[3] == 1) {  // (in place allowed: each element read, then written)
        kern.state_update(s0, is.strides[2], s1, f.strides[2], Dk, Dv, decay, k.data(), uu);
        continue;
      }
      for (std::int64_t d = 0; d < Dk; ++d) {  // (strided, or no initial state; in place element by element)
        const float kd = k[static_cast<std::size_t>(d)];
        float* dst = s1 + d * f.strides[2];
        const float* src = init ? s0 + d * is.strides[2] : nullptr;
        for (std::int64_t j = 0; j < Dv; ++j) dst[j * f.strides[3]] = (init ? decay * src[j * is.strides[3]] : 0.0f) + kd * uu[j];
      }
    }
  });
}

}  // namespace

void gated_delta_rule(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const ConstTensorView& g,
                      const ConstTensorView& beta, const TensorView& out, const GatedDeltaRuleOptions& options) {
  detail::gated_delta_rule_on(detail::GdrProducts::automatic, q, k, v, g, beta, out, options);
}

void detail::gated_delta_rule_on(GdrProducts products, const ConstTensorView& q, const ConstTensorView& k,
                                 const ConstTensorView& v, const ConstTensorView& g, const ConstTensorView& beta,
                                 const TensorView& out, const GatedDeltaRuleOptions& options) {
  const detail::CallScope in_use;
  const Sizes z = detail::check_gated_delta(q, k, v, g, beta, out, options);
  const float scale = static_cast<float>(options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(z.Dk)));
  if (products == GdrProducts::bf16_pairs && !detail::gdr_pairs_fit(z))
    throw std::logic_error("gated_delta_rule: no bf16 pair kernels fit this CPU and shape");
  const bool bf16_in = q.dtype == DType::bf16 && k.dtype == DType::bf16 && v.dtype == DType::bf16;
  const bool pairs = products == GdrProducts::bf16_pairs ||
                     (products == GdrProducts::automatic && bf16_in && simd::bf16_pairs_preferred() && detail::gdr_pairs_fit(z));
  const HeadRun run{q, k, v, g, beta, z, options.use_qk_l2norm, scale, pairs};
  const bool init = detail::view_given(options.initial_state), fin = detail::view_given(options.final_state);
  if (z.T == 1) return decode_step(run, z, options, out);
  // A work item: the value heads of one (batch, key head) group, which share the chunks' keys and
  // queries; or, with too few groups to keep the threads busy (two items a thread), a part of one
  // (the same arithmetic either way: the same result at any thread count).
  const std::int64_t r = z.Hv / z.H;
  const std::int64_t want = 2 * detail::resolve_threads(options.threads);
  std::int64_t parts = 1;
  while (parts < r && z.B * z.H * parts < want) {
    ++parts;
    while (r % parts != 0) ++parts;
  }
  const std::int64_t per = r / parts;
  // A thread's items go chunk by chunk, all of them at each chunk: their rows of a token lie side
  // by side (one stream through q, k, v and out where one item at a time strides a row per token:
  // gdr-prefill8k 1.2x faster), their states held at once.
  detail::parallel_for(z.B * z.H * parts, options.threads, 1, [&](std::int64_t i0, std::int64_t i1) {
    // strong decays make e^(gamma_i - gamma_s) and the state denormal, each a microcode assist
    // (Qwen3-Next's layer at 4096 tokens: the rule took 8x its time with random weights' g ~ -2)
    const detail::FlushDenormals ftz;
    std::vector<detail::PackedB<float>> S;  // the items' states, in the layout of chunk()
    S.reserve(static_cast<std::size_t>((i1 - i0) * per));
    for (std::int64_t i = 0; i < (i1 - i0) * per; ++i) S.push_back(detail::packed_b_zeros<float>(z.Dk, z.Dv, nullptr, true));
    std::vector<detail::Packed16> Sb;  // on the pair kernels: each state's pair panels (the chunks' B)
    for (std::int64_t i = 0; i < (i1 - i0) * per && pairs; ++i) Sb.push_back(detail::packed16_zeros(z.Dk, z.Dv, true, nullptr, true));
    HeadRun::Buffers buf(z, pairs);
    const ConstTensorView& is = options.initial_state;
    const TensorView& f = options.final_state;
    auto item = [&](std::int64_t i) {
      return std::tuple{i / (z.H * parts), i / parts % z.H, i % parts * per, S.data() + (i - i0) * per,
                        pairs ? Sb.data() + (i - i0) * per : nullptr};
    };
    // element (d, e) of a packed state
    auto at_de = [](detail::PackedB<float>& P, std::int64_t d, std::int64_t e) -> float& {
      return const_cast<float*>(P.panel(e - e % P.nr, d - d % P.kc))[d % P.kc * P.nr + e % P.nr];
    };
    for (std::int64_t i = i0; i < i1 && init; ++i) {
      const auto [b, hk, j0, Si, Sbi] = item(i);
      for (std::int64_t j = 0; j < per; ++j) {  // (f32, checked)
        const float* p = static_cast<const float*>(is.data) + b * is.strides[0] + (hk * r + j0 + j) * is.strides[1];
        for (std::int64_t d = 0; d < z.Dk; ++d)
          for (std::int64_t e = 0; e < z.Dv; ++e) at_de(Si[j], d, e) = p[d * is.strides[2] + e * is.strides[3]];
        if (pairs) detail::gdr_narrow_to_pairs(Si[j], Sbi[j], z.Dk, 0, z.Dv);
      }
    }
    detail::NextRows next;  // the rows of the item after the one running
    for (std::int64_t c0 = 0; c0 < z.T; c0 += kChunk)
      for (std::int64_t i = i0; i < i1; ++i) {
        next.clear();
        if (const std::int64_t c1 = i + 1 < i1 ? c0 : c0 + kChunk; c1 < z.T) {
          const auto [b1, hk1, j1, S1, Sb1] = item(i + 1 < i1 ? i + 1 : i0);
          run.rows_of(next, b1, hk1, j1, per, c1, out);
        }
        const auto [b, hk, j0, Si, Sbi] = item(i);
        run.run(b, hk, j0, per, Si, Sbi, c0, out, buf, &next);
      }
    for (std::int64_t i = i0; i < i1 && fin; ++i) {
      const auto [b, hk, j0, Si, Sbi] = item(i);
      for (std::int64_t j = 0; j < per; ++j) {
        float* p = static_cast<float*>(f.data) + b * f.strides[0] + (hk * r + j0 + j) * f.strides[1];
        for (std::int64_t d = 0; d < z.Dk; ++d)
          for (std::int64_t e = 0; e < z.Dv; ++e) p[d * f.strides[2] + e * f.strides[3]] = at_de(Si[j], d, e);
      }
    }
  });
}

}  // namespace simdattn

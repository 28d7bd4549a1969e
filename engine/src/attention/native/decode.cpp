// The native backend's decode path: few query rows per kv head (Sq * H / Hkv <= kDecodeMaxRows),
// e.g. one new token against a KV cache. The work is a few matrix-vector products per head,
// bound by reading K and V: with one row per kv head nothing is packed and the GEMV kernels
// stream K (scores) and then V (weighted sum) exactly once; 2-8 rows take the GEMM driver's
// small-M path. Per (batch, kv head), the group's query rows are gathered into one small
// matrix Qg, then
//   S = Qg K^T          [rows, L]   (keys past the batch's key length L are never read)
//   P = softmax(S)      per row, with the scale, mask and visibility rule of scale_mask_row
//   O = P V / l         [rows, Dv]
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention/native/paths.hpp"
#include "attention/native/rows.hpp"
#include "core/element.hpp"
#include "core/modifiers.hpp"
#include "core/position_rule.hpp"
#include "linalg/gemm.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

constexpr std::int64_t kDecodeMaxRows = 8;

// One (batch b, kv head hk) item: Qg, S and O are this thread's scratch.
template <class T>
void decode_item(const Problem& p, const simd::KernelTable& kt, std::int64_t b, std::int64_t hk, T* qg, T* s,
                 T* og) {
  const simd::VectorKernels<T>& vk = kt.vec<T>();
  const std::int64_t group = p.H / p.Hkv, rows = group * p.Sq;
  // Qg: row r = (head hk * group + r / Sq, query r % Sq)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src =
        static_cast<const T*>(p.q) + b * p.q_strides[0] + (hk * group + r / p.Sq) * p.q_strides[1] + (r % p.Sq) * p.q_strides[2];
    std::memcpy(qg + r * p.D, src, sizeof(T) * static_cast<std::size_t>(p.D));
  }
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides[0] + hk * p.k_strides[1];
  const T* v = static_cast<const T*>(p.v) + b * p.v_strides[0] + hk * p.v_strides[1];
  const std::int64_t L = p.key_len(b);
  GemmArgs<T> qk;  // S = Qg K^T
  qk.trans_b = Trans::T;
  qk.M = rows, qk.N = L, qk.K = p.D;
  qk.A = qg, qk.lda = p.D, qk.B = k, qk.ldb = p.k_strides[2], qk.C = s, qk.ldc = p.Sk;
  gemm(qk, 1, &kt);  // L == 0: nothing
  std::int64_t visible_rows = 0;
  T l[kDecodeMaxRows];
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t h = hk * group + r / p.Sq, i = r % p.Sq;
    T* row = s + r * p.Sk;
    const bool full = classify(p, b, i, i + 1, 0, L) == Cover::full;
    const T m = scale_mask_row(p, vk, row, b, h, i, 0, L, full);
    l[r] = vk.exp_sub_max_sum(row, L, m);
    visible_rows += l[r] != T(0);
    finish_row(p, b, h, i, m, l[r]);  // the sink joins l; lse written
  }
  if (visible_rows > 0) {
    GemmArgs<T> pv;  // O = P V
    pv.M = rows, pv.N = p.Dv, pv.K = L;
    pv.A = s, pv.lda = p.Sk, pv.B = v, pv.ldb = p.v_strides[2], pv.C = og, pv.ldc = p.Dv;
    gemm(pv, 1, &kt);
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t h = hk * group + r / p.Sq, i = r % p.Sq;
    T* dst = static_cast<T*>(p.o) + b * p.o_strides[0] + h * p.o_strides[1] + i * p.o_strides[2];
    write_output_row(p, vk, og + r * p.Dv, l[r], dst);
  }
}

template <class T>
void decode(const Problem& p) {
  const simd::KernelTable& kt = simd::kernels();
  const std::int64_t rows = (p.H / p.Hkv) * p.Sq;
  const std::int64_t q_size = round_up(rows * p.D, kLineElems<T>), s_size = round_up(rows * p.Sk, kLineElems<T>);
  const std::int64_t o_size = round_up(rows * p.Dv, kLineElems<T>);
  const double bytes = double(p.Sk) * double(p.D + p.Dv) * sizeof(T);  // per item
  const auto min_items = static_cast<std::int64_t>(kMinFlopsPerThread / (2.0 * bytes)) + 1;

  RegionFailure failure;
  parallel_for(p.B * p.Hkv, p.threads, min_items, [&](std::int64_t it0, std::int64_t it1) {
    failure.guard([&] {
      T* qg = thread_buffer<T, scratch::NativeAttention>().get(static_cast<std::size_t>(q_size + s_size + o_size));
      // The GEMM's packing buffers for the largest key length this problem allows (Sk): a KV
      // cache passes its capacity as Sk, so decode steps whose lengths grow allocate nothing.
      GemmArgs<T> bound;
      bound.trans_b = Trans::T;
      bound.M = rows, bound.N = std::max(p.Sk, p.Dv), bound.K = std::max(p.D, p.Sk);
      gemm_reserve(bound, &kt);
      for (std::int64_t it = it0; it < it1; ++it) decode_item(p, kt, it / p.Hkv, it % p.Hkv, qg, qg + q_size,
                                                             qg + q_size + s_size);
    });
  });
  failure.rethrow();
}

// The decode paths that read K and V in place (bf16/f16 rows, 8-bit codes): per (batch, kv
// head), each query row of the group widened to f32, its scores from reader.scores (K's rows
// dotted with it), the f32 softmax of scale_mask_row, and its output from reader.values (V's rows
// weighted by the weights), rounded to the output's dtype S at the end. bytes_per_key: what one
// key of an item reads (K and V), for the work split.
template <class S, class Reader>
void decode_in_place(const Problem& p, double bytes_per_key, const Reader& reader) {
  const simd::VectorKernels<float>& vk = simd::kernels().vec<float>();
  const std::int64_t group = p.H / p.Hkv;
  const std::int64_t q_size = round_up(p.D, kLineElems<float>), s_size = round_up(p.Sk, kLineElems<float>);
  const double bytes = double(p.Sk) * bytes_per_key;  // per item
  const auto min_items = static_cast<std::int64_t>(kMinFlopsPerThread / (2.0 * bytes)) + 1;
  RegionFailure failure;
  parallel_for(p.B * p.Hkv, p.threads, min_items, [&](std::int64_t it0, std::int64_t it1) {
    failure.guard([&] {
      float* q = thread_buffer<float, scratch::NativeAttention>().get(static_cast<std::size_t>(q_size + s_size + p.Dv));
      float* s = q + q_size;
      float* o = s + s_size;
      for (std::int64_t it = it0; it < it1; ++it) {
        const std::int64_t b = it / p.Hkv, hk = it % p.Hkv, L = p.key_len(b);
        for (std::int64_t r = 0; r < group * p.Sq; ++r) {
          const std::int64_t h = hk * group + r / p.Sq, i = r % p.Sq;
          const S* qi = static_cast<const S*>(p.q) + b * p.q_strides[0] + h * p.q_strides[1] + i * p.q_strides[2];
          for (std::int64_t d = 0; d < p.D; ++d) q[d] = static_cast<float>(widen(qi[d * p.q_strides[3]]));
          reader.scores(b, hk, L, q, s);
          const bool full = classify(p, b, i, i + 1, 0, L) == Cover::full;
          const float m = scale_mask_row(p, vk, s, b, h, i, 0, L, full);
          float l = vk.exp_sub_max_sum(s, L, m);
          finish_row(p, b, h, i, m, l);  // the sink joins l; lse written
          S* dst = static_cast<S*>(p.o) + b * p.o_strides[0] + h * p.o_strides[1] + i * p.o_strides[2];
          if (l == 0.0f) {  // no visible key: zeros
            for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.o_strides[3]] = S{};
            continue;
          }
          reader.values(b, hk, L, 1.0f / l, s, o);
          for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.o_strides[3]] = narrow<S>(o[d]);
        }
      }
    });
  });
  failure.rethrow();
}

// bf16/f16 K and V rows (half the bytes of f32) on the 16-bit GEMV kernels.
template <class H>
struct Rows16 {
  const Problem& p;
  const simd::Gemv16Kernels& g;
  const std::uint16_t* head(const void* base, const Shape4& st, std::int64_t b, std::int64_t hk) const {
    return reinterpret_cast<const std::uint16_t*>(static_cast<const H*>(base) + b * st[0] + hk * st[1]);
  }
  void scores(std::int64_t b, std::int64_t hk, std::int64_t L, const float* q, float* s) const {
    g.gemv_t(L, p.D, 1.0f, q, head(p.k, p.k_strides, b, hk), p.k_strides[2], 0.0f, s);
  }
  void values(std::int64_t b, std::int64_t hk, std::int64_t L, float alpha, const float* w, float* o) const {
    g.gemv_n(p.Dv, L, alpha, w, head(p.v, p.v_strides, b, hk), p.v_strides[2], 0.0f, o);
  }
};

// 8-bit K and V codes (a quarter of f32's bytes) on the code GEMV: K's scale on each key's score,
// V's on each key's weight.
struct Rows8 {
  const Problem& p;
  const simd::Quant8Kernels& g;
  void scores(std::int64_t b, std::int64_t hk, std::int64_t L, const float* q, float* s) const {
    g.gemv_t(L, p.D, 1.0f, q, static_cast<const std::uint8_t*>(p.k) + b * p.k_strides[0] + hk * p.k_strides[1],
             p.k_strides[2], p.k_scale + b * p.k_scale_strides[0] + hk * p.k_scale_strides[1], p.k_scale_strides[2], s);
  }
  void values(std::int64_t b, std::int64_t hk, std::int64_t L, float alpha, const float* w, float* o) const {
    g.gemv_n(p.Dv, L, alpha, w, static_cast<const std::uint8_t*>(p.v) + b * p.v_strides[0] + hk * p.v_strides[1],
             p.v_strides[2], p.v_scale + b * p.v_scale_strides[0] + hk * p.v_scale_strides[1], p.v_scale_strides[2],
             0.0f, o);
  }
};

template <class H>
void decode16(const Problem& p) {
  const simd::KernelTable& kt = simd::kernels();
  decode_in_place<H>(p, double(p.D + p.Dv) * sizeof(H),
                     Rows16<H>{p, std::is_same_v<H, bfloat16> ? kt.gemv_bf16 : kt.gemv_f16});
}

template <class S>
void decode8(const Problem& p) {
  decode_in_place<S>(p, double(p.D + p.Dv + 8), Rows8{p, simd::kernels().code8(code8_of(p.kv_dtype))});
}

}  // namespace

namespace {

// The checks the decode paths make: unmodified scores, at least one key, few rows per kv head.
Refusal decode_shape_why_not(const Problem& p) {
  if (Refusal r = needs_modified_scores(p)) return r;
  if (p.Sk == 0) return {"no keys"};
  const std::int64_t rows = (p.H / p.Hkv) * p.Sq;
  if (rows > kDecodeMaxRows) return {"{} query rows per kv head > {}", rows, kDecodeMaxRows};
  return {};
}

}  // namespace

Refusal decode8_why_not(const Problem& p) {
  if (!p.kv_codes()) return {"K and V of dtype {w} (8-bit codes only)", dtype_name(p.kv_dtype)};
  if (Refusal r = decode_shape_why_not(p)) return r;
  if (p.k_strides[3] != 1 || p.v_strides[3] != 1)
    return {"K or V strided along D (inner strides {} and {})", p.k_strides[3], p.v_strides[3]};
  return {};
}

void decode8_attention(const Problem& p) {
  if (p.dtype == DType::bf16) decode8<bfloat16>(p);
  else if (p.dtype == DType::f16) decode8<float16>(p);
  else decode8<float>(p);
}

Refusal decode16_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (!is_16bit(p.dtype)) return {"dtype {w} (bf16 and f16 only)", dtype_name(p.dtype)};
  if (Refusal r = decode_shape_why_not(p)) return r;
  if (p.k_strides[3] != 1 || p.v_strides[3] != 1)
    return {"K or V strided along D (inner strides {} and {})", p.k_strides[3], p.v_strides[3]};
  return {};
}

void decode16_attention(const Problem& p) {
  if (p.dtype == DType::bf16) decode16<bfloat16>(p);
  else decode16<float16>(p);
}

Refusal decode_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (is_16bit(p.dtype)) return {"dtype {w} (the 16-bit decode paths take it)", dtype_name(p.dtype)};
  if (Refusal r = decode_shape_why_not(p)) return r;
  if (p.q_strides[3] != 1 || p.k_strides[3] != 1 || p.v_strides[3] != 1)
    return {"q, K or V strided along D"};
  return {};
}

void decode_attention(const Problem& p) {
  if (p.dtype == DType::f32) decode<float>(p);
  else decode<double>(p);
}

}  // namespace simdattn::detail

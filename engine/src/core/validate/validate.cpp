// Argument validation for attention(): everything is checked here, before any backend runs,
// so an invalid call throws without writing anything.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <xmmintrin.h>

#include "core/problem.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/isa.hpp"

namespace simdattn::detail {
namespace {

bool any_zero(const Shape4& s) { return s[0] == 0 || s[1] == 0 || s[2] == 0 || s[3] == 0; }

}  // namespace

Span byte_span(const std::string& name, const void* data, DType dtype, const Shape4& shape,
               const Shape4& strides) {
  for (int d = 0; d < 4; ++d) {
    if (shape[d] < 0)
      throw Error(name, "negative size in shape " + shape_str(shape));
    if (strides[d] < 0)
      throw Error(name, "negative stride in strides " + shape_str(strides) +
                            " (strides must be >= 0)");
  }
  if (any_zero(shape)) return {};
  if (data == nullptr) throw Error(name, "null data pointer for shape " + shape_str(shape));
  std::int64_t last = 0;  // element offset of the last element
  for (int d = 0; d < 4; ++d) {
    std::int64_t term = 0;
    if (__builtin_mul_overflow(shape[d] - 1, strides[d], &term) ||
        __builtin_add_overflow(last, term, &last))
      throw Error(name, "size overflow: shape " + shape_str(shape) + " with strides " +
                            shape_str(strides));
  }
  std::int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<std::int64_t>(dtype_size(dtype)), &bytes))
    throw Error(name, "size overflow: shape " + shape_str(shape));
  Span s;
  s.lo = reinterpret_cast<std::uintptr_t>(data);
  if (__builtin_add_overflow(s.lo, static_cast<std::uintptr_t>(bytes), &s.hi))
    throw Error(name, "address range overflows for shape " + shape_str(shape));
  return s;
}

void check_no_self_overlap(const std::string& name, const Shape4& shape, const Shape4& strides) {
  if (any_zero(shape)) return;
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return strides[a] < strides[b]; });
  std::int64_t extent = 0;  // max element offset reachable with the dims seen so far
  for (int d : order) {
    if (shape[d] == 1) continue;
    if (strides[d] <= extent)
      throw Error(name, "strides " + shape_str(strides) + " make elements of shape " +
                            shape_str(shape) + " overlap (an output needs distinct elements)");
    extent += (shape[d] - 1) * strides[d];
  }
}

const float* check_scale_view(const std::string& name, const ConstTensorView& view, const Shape4& want,
                              const char* shape_name, DType kv_dtype, const Span& so) {
  const std::string kv(dtype_name(kv_dtype));
  if (!is_kv_code(kv_dtype)) {
    if (view_given(view)) throw Error(name, "given for K and V of dtype " + kv + " (only 8-bit K and V codes take scales)");
    return nullptr;
  }
  if (!view_given(view)) throw Error(name, "required with 8-bit K and V (" + kv + "): f32 of shape " + shape_str(want));
  if (view.dtype != DType::f32) throw Error(name, "expected dtype f32, got " + std::string(dtype_name(view.dtype)));
  if (view.shape != want)
    throw Error(name, "expected shape " + std::string(shape_name) + " = " + shape_str(want) + ", got " + shape_str(view.shape));
  if (overlaps(byte_span(name, view), so)) throw Error(name, "memory overlaps out");
  return static_cast<const float*>(view.data);
}

std::int64_t first_bad_scale(const float* s, std::int64_t n, std::int64_t stride) {
  constexpr float kMax = std::numeric_limits<float>::max();
  if (stride == 1) {  // four at a time (SSE2, every x86-64): a NaN fails both comparisons
    const __m128 zero = _mm_setzero_ps(), max = _mm_set1_ps(kMax);
    std::int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const __m128 x = _mm_loadu_ps(s + j);
      if (_mm_movemask_ps(_mm_and_ps(_mm_cmpge_ps(x, zero), _mm_cmple_ps(x, max))) != 0xf) break;
    }
    for (; j < n; ++j)
      if (!(s[j] >= 0.0f && s[j] <= kMax)) return j;
    return -1;
  }
  for (std::int64_t j = 0; j < n; ++j)
    if (!(s[j * stride] >= 0.0f && s[j * stride] <= kMax)) return j;
  return -1;
}

bool overlaps(const Span& a, const Span& b) {
  return !a.empty() && !b.empty() && a.lo < b.hi && b.lo < a.hi;
}

namespace {

void check_float(const std::string& name, DType t) {
  if (t != DType::f32 && t != DType::f64 && t != DType::bf16 && t != DType::f16)
    throw Error(name, "dtype must be f32, f64, bf16 or f16, got " + std::string(dtype_name(t)));
}

// q a float dtype, k and v the same, or k and v 8-bit codes of one dtype (q then f32, bf16 or f16).
void check_qkv_dtypes(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v) {
  check_float("q", q.dtype);
  if (is_kv_code(k.dtype) || is_kv_code(v.dtype)) {
    if (v.dtype != k.dtype)
      throw Error("v", "dtype " + std::string(dtype_name(v.dtype)) + " differs from k's " +
                           std::string(dtype_name(k.dtype)) + " (8-bit K and V take one code dtype)");
    if (q.dtype == DType::f64)
      throw Error("q", "dtype f64 with 8-bit K and V (" + std::string(dtype_name(k.dtype)) +
                           "): q must be f32, bf16 or f16");
    return;
  }
  if (k.dtype != q.dtype)
    throw Error("k", "dtype " + std::string(dtype_name(k.dtype)) + " differs from q's " +
                         std::string(dtype_name(q.dtype)));
  if (v.dtype != q.dtype)
    throw Error("v", "dtype " + std::string(dtype_name(v.dtype)) + " differs from q's " +
                         std::string(dtype_name(q.dtype)));
}

// options.k_scale / v_scale: [B, Hkv, Sk, 1] f32, clear of out, given exactly when k and v hold
// 8-bit codes; the scales of the keys read (j < L[b]) finite and >= 0.
void set_kv_scales(Problem& p, const AttentionOptions& opt, const Span& so) {
  for (const auto& [name, view, dst, strides] :
       {std::tuple<const char*, const ConstTensorView&, const float**, std::int64_t*>{
            "options.k_scale", opt.k_scale, &p.k_scale, p.k_scale_strides},
        {"options.v_scale", opt.v_scale, &p.v_scale, p.v_scale_strides}}) {
    const float* f = check_scale_view(name, view, {p.B, p.Hkv, p.Sk, 1}, "[B, Hkv, Sk, 1]", p.kv_dtype, so);
    if (f == nullptr) continue;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.Hkv; ++h) {
        const float* row = f + b * view.strides[0] + h * view.strides[1];
        const std::int64_t j = first_bad_scale(row, p.key_len(b), view.strides[2]);
        if (j >= 0)
          throw Error(name, "scale [" + std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(j) +
                                "] must be finite and >= 0, got " + std::to_string(row[j * view.strides[2]]));
      }
    *dst = f;
    strides[0] = view.strides[0], strides[1] = view.strides[1], strides[2] = view.strides[2];
  }
}

// The [B, H, Sq, Dv] output of inputs of these shapes; throws Error for shapes attention rejects.
Shape4 output_shape(const Shape4& qs, const Shape4& ks, const Shape4& vs) {
  for (const auto& [name, s] : {std::pair<const char*, const Shape4&>{"q", qs}, {"k", ks}, {"v", vs}})
    for (int d = 0; d < 4; ++d)
      if (s[d] < 0) throw Error(name, "negative size in shape " + shape_str(s));
  const std::int64_t B = qs[0], H = qs[1], D = qs[3], Hkv = ks[1], Sk = ks[2], Dv = vs[3];
  if (H < 1) throw Error("q", "shape " + shape_str(qs) + " needs H >= 1 heads (dim 1)");
  if (D < 1) throw Error("q", "shape " + shape_str(qs) + " needs head size D >= 1 (dim 3)");
  if (ks[0] != B || ks[3] != D)
    throw Error("k", "expected shape [B=" + std::to_string(B) + ", Hkv, Sk, D=" + std::to_string(D) +
                         "] (q is " + shape_str(qs) + "), got " + shape_str(ks));
  if (Hkv < 1)
    throw Error("k", "shape " + shape_str(ks) + " needs Hkv >= 1 heads (dim 1)");
  if (H % Hkv != 0)
    throw Error("k", "q's H=" + std::to_string(H) + " heads are not a multiple of k's Hkv=" +
                         std::to_string(Hkv) + " (q " + shape_str(qs) + ", k " +
                         shape_str(ks) + ")");
  if (vs[0] != B || vs[1] != Hkv || vs[2] != Sk)
    throw Error("v", "expected shape [B=" + std::to_string(B) + ", Hkv=" + std::to_string(Hkv) +
                         ", Sk=" + std::to_string(Sk) + ", Dv] (k is " + shape_str(ks) +
                         "), got " + shape_str(vs));
  if (Dv < 1) throw Error("v", "shape " + shape_str(vs) + " needs Dv >= 1 (dim 3)");
  return {B, H, qs[2], Dv};
}

// q, k, v and out: dtypes, byte spans (sizes, strides, null pointers, overflow), shapes, and
// that out aliases nothing. Returns out's byte span.
Span set_tensors(Problem& p, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                 const TensorView& out) {
  check_qkv_dtypes(q, k, v);
  if (out.dtype != q.dtype)
    throw Error("out", "dtype " + std::string(dtype_name(out.dtype)) + " differs from q's " +
                           std::string(dtype_name(q.dtype)));
  p.dtype = q.dtype;
  p.kv_dtype = k.dtype;

  // byte spans (also checks sizes, strides, null pointers and overflow)
  const Span sq = byte_span("q", q.data, q.dtype, q.shape, q.strides);
  const Span sk = byte_span("k", k.data, k.dtype, k.shape, k.strides);
  const Span sv = byte_span("v", v.data, v.dtype, v.shape, v.strides);
  const Span so = byte_span("out", out.data, out.dtype, out.shape, out.strides);

  // shapes
  p.B = q.shape[0];
  p.H = q.shape[1];
  p.Sq = q.shape[2];
  p.D = q.shape[3];
  p.Hkv = k.shape[1];
  p.Sk = k.shape[2];
  p.Dv = v.shape[3];
  const Shape4 want_o = output_shape(q.shape, k.shape, v.shape);
  if (out.shape != want_o)
    throw Error("out", "expected shape [B, H, Sq, Dv] = " + shape_str(want_o) + ", got " +
                           shape_str(out.shape));
  // B*H*Sq*Sk pairs must be countable.
  std::int64_t pairs = 0;
  if (__builtin_mul_overflow(p.B, p.H, &pairs) || __builtin_mul_overflow(pairs, p.Sq, &pairs) ||
      __builtin_mul_overflow(pairs, p.Sk, &pairs))
    throw Error("q", "problem too large: B*H*Sq*Sk overflows 64 bits");

  // the output must be writable element by element and must not alias any input
  check_no_self_overlap("out", out.shape, out.strides);
  if (overlaps(so, sq)) throw Error("out", "memory overlaps q");
  if (overlaps(so, sk)) throw Error("out", "memory overlaps k");
  if (overlaps(so, sv)) throw Error("out", "memory overlaps v");

  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.q_strides = q.strides;
  p.k_strides = k.strides;
  p.v_strides = v.strides;
  p.o_strides = out.strides;
  return so;
}

// The mask: its dtype says boolean (u8) or additive (f32/f64); broadcastable to [B, H, Sq, Sk].
void set_mask(Problem& p, const AttentionOptions& opt, const Span& so) {
  if (view_given(opt.mask)) {
    const ConstTensorView& m = opt.mask;
    if (m.dtype == DType::u8) p.mask_kind = MaskKind::boolean;
    else if (m.dtype == DType::f32 || m.dtype == DType::f64 || m.dtype == DType::bf16 || m.dtype == DType::f16)
      p.mask_kind = MaskKind::additive;
    else
      throw Error("options.mask", "dtype must be u8 (boolean: nonzero = attend) or f32, f64, bf16 or f16 "
                                  "(additive), got " + std::string(dtype_name(m.dtype)));
    const Shape4 target{p.B, p.H, p.Sq, p.Sk};
    for (int d = 0; d < 4; ++d)
      if (m.shape[d] != 1 && m.shape[d] != target[d])
        throw Error("options.mask", "shape " + shape_str(m.shape) +
                                        " is not broadcastable to [B, H, Sq, Sk] = " +
                                        shape_str(target) + " (each dimension must be 1 or equal)");
    const Span sm = byte_span("options.mask", m.data, m.dtype, m.shape, m.strides);
    if (overlaps(so, sm)) throw Error("out", "memory overlaps options.mask");
    p.mask = m.data;
    p.mask_dtype = m.dtype;
    for (int d = 0; d < 4; ++d) p.mask_strides[d] = m.shape[d] == 1 ? 0 : m.strides[d];
  }
}

void set_key_lengths(Problem& p, const AttentionOptions& opt, const Span& so) {
  if (!opt.key_lengths.empty()) {
    if (static_cast<std::int64_t>(opt.key_lengths.size()) != p.B)
      throw Error("options.key_lengths", "expected " + std::to_string(p.B) +
                                             " entries (one per batch), got " +
                                             std::to_string(opt.key_lengths.size()));
    for (std::size_t b = 0; b < opt.key_lengths.size(); ++b) {
      const std::int64_t L = opt.key_lengths[b];
      if (L < 0 || L > p.Sk)
        throw Error("options.key_lengths", "entry " + std::to_string(b) + " is " +
                                               std::to_string(L) + ", expected 0 <= L <= Sk=" +
                                               std::to_string(p.Sk));
    }
    if (overlaps(so, span_of(opt.key_lengths.data(), opt.key_lengths.size_bytes())))
      throw Error("out", "memory overlaps options.key_lengths");
    p.key_lengths = opt.key_lengths.data();
  }
}

// Causal and window. Positions are within Sq + Sk of the keys, or, with query offsets
// (|offset| <= 2^40), within Sq + Sk + 2^40.
void set_structure(Problem& p, const AttentionOptions& opt) {
  if (opt.causal != Causal::none && opt.causal != Causal::top_left &&
      opt.causal != Causal::bottom_right)
    throw Error("options.causal", "unknown value " + std::to_string(int(opt.causal)));
  p.causal = opt.causal;
  set_window(p, opt.window, opt.query_offsets.empty() ? 0 : std::int64_t{1} << 40);
}

// Global tokens and the block mask.
void set_sparse(Problem& p, const AttentionOptions& opt, const Span& so) {
  if (opt.global_tokens < 0)
    throw Error("options.global_tokens", "must be >= 0, got " + std::to_string(opt.global_tokens));
  p.global_tokens = std::min(opt.global_tokens, p.Sq + p.Sk);  // beyond every position: saturate
  if (view_given(opt.block_mask)) {
    const ConstTensorView& bm = opt.block_mask;
    if (opt.block_size < 1)
      throw Error("options.block_size", "must be >= 1, got " + std::to_string(opt.block_size));
    const std::int64_t nbq = (p.Sq + opt.block_size - 1) / opt.block_size;
    const std::int64_t nbk = (p.Sk + opt.block_size - 1) / opt.block_size;
    if (bm.dtype != DType::u8)
      throw Error("options.block_mask", "expected dtype u8 (nonzero = computed), got " +
                                            std::string(dtype_name(bm.dtype)));
    const Shape4 want{1, 1, nbq, nbk};
    if (bm.shape != want)
      throw Error("options.block_mask", "expected shape [1, 1, ceil(Sq/bs), ceil(Sk/bs)] = " + shape_str(want) +
                                            " for Sq=" + std::to_string(p.Sq) + ", Sk=" + std::to_string(p.Sk) +
                                            ", bs=" + std::to_string(opt.block_size) + ", got " + shape_str(bm.shape));
    const Span sb = byte_span("options.block_mask", bm.data, bm.dtype, bm.shape, bm.strides);
    if (overlaps(so, sb)) throw Error("out", "memory overlaps options.block_mask");
    p.block_mask = static_cast<const std::uint8_t*>(bm.data);
    p.block_size = opt.block_size;
    p.block_mask_strides[0] = bm.strides[2];
    p.block_mask_strides[1] = bm.strides[3];
  }
}

}  // namespace

void set_window(Problem& p, const std::optional<Window>& window, std::int64_t offsets_reach) {
  if (!window) return;
  if (window->left < -1 || window->right < -1)
    throw Error("options.window", "(" + std::to_string(window->left) + ", " + std::to_string(window->right) +
                                      "): each side must be >= 0, or -1 for unbounded");
  p.has_window = true;
  // A side longer than any distance between a query's position and a key reaches every key
  // either way: saturate so that position arithmetic cannot overflow.
  const std::int64_t reach = p.Sq + p.Sk + offsets_reach;
  p.window_left = std::min(window->left, reach);
  p.window_right = std::min(window->right, reach);
}

void set_scale_threads(Problem& p, const ScoreOptions& opt) {
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  if (!std::isfinite(p.scale)) throw Error("options.scale", "must be finite, got " + std::to_string(p.scale));
  if (opt.threads < 0)
    throw Error("options.threads", "must be >= 0 (0 = default), got " + std::to_string(opt.threads));
  p.threads = opt.threads;
}

void set_relative_bias(Problem& p, const RelativePositionBias& rb, const Span& so) {
  const ConstTensorView& t = rb.table;
  check_float("options.relative_bias.table", t.dtype);
  if (t.shape[0] != 1 || t.shape[1] != 1 || t.shape[3] != p.H || t.shape[2] < (rb.bidirectional ? 4 : 2))
    throw Error("options.relative_bias.table",
                "expected shape [1, 1, num_buckets, H=" + std::to_string(p.H) + "] with num_buckets >= " +
                    (rb.bidirectional ? "4 (bidirectional)" : "2") + ", got " + shape_str(t.shape));
  const std::int64_t exact = rb.bidirectional ? t.shape[2] / 4 : t.shape[2] / 2;
  if (rb.max_distance <= exact)
    throw Error("options.relative_bias.max_distance", "must exceed the exact buckets (" + std::to_string(exact) +
                                                          "), got " + std::to_string(rb.max_distance));
  const Span st = byte_span("options.relative_bias.table", t.data, t.dtype, t.shape, t.strides);
  if (overlaps(so, st)) throw Error("out", "memory overlaps options.relative_bias.table");
  p.t5_table = t.data;
  p.t5_dtype = t.dtype;
  p.t5_buckets = t.shape[2];
  p.t5_strides[0] = t.strides[2];
  p.t5_strides[1] = t.strides[3];
  p.t5_bidirectional = rb.bidirectional;
  p.t5_max_distance = rb.max_distance;
}

void check_per_head(const std::string& name, std::span<const float> values, std::int64_t want, const char* per,
                    const Span& so) {
  if (static_cast<std::int64_t>(values.size()) != want)
    throw Error(name, "expected " + std::to_string(want) + " entries (one per " + per + "), got " +
                          std::to_string(values.size()));
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw Error(name, "entry " + std::to_string(i) + " is " + std::to_string(values[i]) + ", expected a finite value");
  if (overlaps(so, span_of(values.data(), values.size_bytes()))) throw Error("out", "memory overlaps " + name);
}

namespace {

// An extra output view (lse, scores): its elements distinct, and its memory clear of every input,
// out and every other option (the other extra output included).
void check_output_option(const std::string& name, const TensorView& view, const AttentionOptions& opt,
                         const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const Span& so) {
  const Span s = byte_span(name, view.data, view.dtype, view.shape, view.strides);
  check_no_self_overlap(name, view.shape, view.strides);
  const std::pair<const char*, const ConstTensorView*> views[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (const auto& [what, t] : views)
    if (overlaps(s, byte_span(what, t->data, t->dtype, t->shape, t->strides)))
      throw Error(name, std::string("memory overlaps ") + what);
  if (overlaps(s, so)) throw Error(name, "memory overlaps out");
  if (view_given(opt.mask) && overlaps(s, byte_span("options.mask", opt.mask.data, opt.mask.dtype, opt.mask.shape, opt.mask.strides)))
    throw Error(name, "memory overlaps options.mask");
  for (const TensorView* other : {&opt.lse, &opt.scores})
    if (&view != other && view_given(*other) &&
        overlaps(s, byte_span(name, other->data, other->dtype, other->shape, other->strides)))
      throw Error(name, std::string("memory overlaps ") + (other == &opt.lse ? "options.lse" : "options.scores"));
  if (overlaps(s, span_of(opt.alibi_slopes.data(), opt.alibi_slopes.size_bytes())) ||
      overlaps(s, span_of(opt.sinks.data(), opt.sinks.size_bytes())) ||
      overlaps(s, span_of(opt.key_lengths.data(), opt.key_lengths.size_bytes())) ||
      overlaps(s, span_of(opt.query_offsets.data(), opt.query_offsets.size_bytes())) ||
      (opt.relative_bias && overlaps(s, byte_span("options.relative_bias.table", opt.relative_bias->table.data,
                                                  opt.relative_bias->table.dtype, opt.relative_bias->table.shape,
                                                  opt.relative_bias->table.strides))))
    throw Error(name, "memory overlaps another option");
}

// Softcap, ALiBi, T5's bias, sinks, query offsets and the lse output.
void set_modifiers(Problem& p, const AttentionOptions& opt, const ConstTensorView& q, const ConstTensorView& k,
                   const ConstTensorView& v, const Span& so) {
  set_softcap_alibi_sinks(p, opt, so);
  if (opt.relative_bias) set_relative_bias(p, *opt.relative_bias, so);
  if (!opt.query_offsets.empty()) {
    if (static_cast<std::int64_t>(opt.query_offsets.size()) != p.B)
      throw Error("options.query_offsets", "expected " + std::to_string(p.B) + " entries (one per batch), got " +
                                               std::to_string(opt.query_offsets.size()));
    constexpr std::int64_t kMaxOffset = std::int64_t{1} << 40;
    for (std::size_t b = 0; b < opt.query_offsets.size(); ++b)
      if (opt.query_offsets[b] < -kMaxOffset || opt.query_offsets[b] > kMaxOffset)
        throw Error("options.query_offsets", "entry " + std::to_string(b) + " is " +
                                                 std::to_string(opt.query_offsets[b]) + ", expected |offset| <= 2^40");
    if (overlaps(so, span_of(opt.query_offsets.data(), opt.query_offsets.size_bytes())))
      throw Error("out", "memory overlaps options.query_offsets");
    p.query_offsets = opt.query_offsets.data();
  }
  if (view_given(opt.lse)) {
    const TensorView& l = opt.lse;
    if (l.dtype != DType::f32) throw Error("options.lse", "dtype must be f32, got " + std::string(dtype_name(l.dtype)));
    const Shape4 want{p.B, p.H, p.Sq, 1};
    if (l.shape != want)
      throw Error("options.lse", "expected shape [B, H, Sq, 1] = " + shape_str(want) + ", got " + shape_str(l.shape));
    check_output_option("options.lse", l, opt, q, k, v, so);
    p.lse = static_cast<float*>(l.data);
    p.lse_strides[0] = l.strides[0], p.lse_strides[1] = l.strides[1], p.lse_strides[2] = l.strides[2];
  }
  if (view_given(opt.scores)) {
    const TensorView& sc = opt.scores;
    check_float("options.scores", sc.dtype);
    const Shape4 want{p.B, p.H, p.Sq, p.Sk};
    if (sc.shape != want)
      throw Error("options.scores", "expected shape [B, H, Sq, Sk] = " + shape_str(want) + ", got " + shape_str(sc.shape));
    if (opt.scores_stage != ScoreStage::scaled && opt.scores_stage != ScoreStage::capped &&
        opt.scores_stage != ScoreStage::biased && opt.scores_stage != ScoreStage::softmax)
      throw Error("options.scores_stage", "unknown value " + std::to_string(int(opt.scores_stage)));
    check_output_option("options.scores", sc, opt, q, k, v, so);
    p.scores = sc.data;
    p.scores_dtype = sc.dtype;
    p.scores_strides = sc.strides;
    p.scores_stage = opt.scores_stage;
  }
}

}  // namespace

Problem make_problem(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     const TensorView& out, const AttentionOptions& opt) {
  check_isa();
  Problem p;
  const Span so = set_tensors(p, q, k, v, out);
  set_mask(p, opt, so);
  set_key_lengths(p, opt, so);
  set_kv_scales(p, opt, so);
  set_structure(p, opt);
  set_sparse(p, opt, so);
  set_modifiers(p, opt, q, k, v, so);
  set_scale_threads(p, opt);
  return p;
}

void check_isa() {
  try {
    simd::selected_isa();
  } catch (const std::runtime_error& e) {
    throw Error("SIMDATTN_ISA", e.what());
  }
  env_thread_runtime();
}

std::optional<ThreadRuntime> env_thread_runtime() {
  static const std::string value = [] {
    const char* v = std::getenv("SIMDATTN_THREAD_RUNTIME");
    return std::string(v == nullptr ? "" : v);
  }();
  if (value.empty()) return std::nullopt;
  if (value == "team") return ThreadRuntime::team;
  if (value == "openmp") return ThreadRuntime::openmp;
  throw Error("SIMDATTN_THREAD_RUNTIME", "expected team or openmp, got '" + value + "'");
}

}  // namespace simdattn::detail

namespace simdattn {

Shape4 attention_output_shape(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v) {
  detail::check_qkv_dtypes(q, k, v);
  return detail::output_shape(q.shape, k.shape, v.shape);
}

}  // namespace simdattn

// merge_attention_states (simdattn/paged.hpp): two attention states (output rows and their lse)
// of the same query rows over two key sets merged into the state over their union, with the
// partial-result rule's merge_states (core/partial.hpp), in double and rounded once (the rows on the
// SIMD kernel StateKernels::merge_rows: the same bits on every ISA).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>

#include "attention/states.hpp"
#include "core/element.hpp"
#include "core/partial.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/paged.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn {
namespace {

using detail::byte_span;
using detail::widen;
using detail::num;
using detail::overlaps;
using detail::shape_str;
using detail::Span;

bool same_view(const void* data, const Shape4& strides, const ConstTensorView& v) {
  return data == v.data && strides == v.strides;
}

// out_a's shape [1, T, H, Dv] and dtype, which the others follow.
void check_states(const ConstTensorView& out_a, const ConstTensorView& lse_a, const ConstTensorView& out_b,
                  const ConstTensorView& lse_b, const TensorView& out, const TensorView& lse) {
  detail::check_isa();
  if (out_a.dtype != DType::f32 && out_a.dtype != DType::bf16 && out_a.dtype != DType::f16)
    throw Error("out_a", "dtype must be f32, bf16 or f16, got " + std::string(dtype_name(out_a.dtype)));
  const Shape4& s = out_a.shape;
  if (s[0] != 1 || s[1] < 0 || s[2] < 1 || s[3] < 1)
    throw Error("out_a", "expected shape [1, T, H >= 1, Dv >= 1], got " + shape_str(s));
  const Shape4 lse_shape{1, s[1], s[2], 1};
  for (const auto& [name, dtype, shape] : {std::tuple{"out_b", out_b.dtype, out_b.shape}, std::tuple{"out", out.dtype, out.shape}}) {
    if (dtype != out_a.dtype)
      throw Error(name, "dtype " + std::string(dtype_name(dtype)) + " differs from out_a's " + std::string(dtype_name(out_a.dtype)));
    if (shape != s) throw Error(name, "expected out_a's shape " + shape_str(s) + ", got " + shape_str(shape));
  }
  const std::pair<const char*, const ConstTensorView*> lses[] = {{"lse_a", &lse_a}, {"lse_b", &lse_b}};
  for (const auto& [name, v] : lses) {
    if (v->dtype != DType::f32) throw Error(name, "dtype must be f32, got " + std::string(dtype_name(v->dtype)));
    if (v->shape != lse_shape)
      throw Error(name, "expected shape [1, T, H, 1] = " + shape_str(lse_shape) + ", got " + shape_str(v->shape));
  }
  if (lse.dtype != DType::f32) throw Error("lse", "dtype must be f32, got " + std::string(dtype_name(lse.dtype)));
  if (lse.shape != lse_shape)
    throw Error("lse", "expected shape [1, T, H, 1] = " + shape_str(lse_shape) + ", got " + shape_str(lse.shape));
  // every view's bytes (a null pointer under a non-empty shape refused), the outputs' elements
  // distinct; an output is one of its inputs' views exactly (in place) or clear of every input
  const Span sa = byte_span("out_a", out_a), sla = byte_span("lse_a", lse_a), sb = byte_span("out_b", out_b),
             slb = byte_span("lse_b", lse_b);
  const Span so = byte_span("out", out.data, out.dtype, out.shape, out.strides);
  const Span sl = byte_span("lse", lse.data, lse.dtype, lse.shape, lse.strides);
  detail::check_no_self_overlap("out", out.shape, out.strides);
  detail::check_no_self_overlap("lse", lse.shape, lse.strides);
  // out may be out_a's or out_b's very view (each element read before it is written), lse lse_a's
  // or lse_b's; any other overlap is refused
  const std::tuple<const char*, const ConstTensorView*, Span, bool> inputs[] = {
      {"out_a", &out_a, sa, true}, {"lse_a", &lse_a, sla, false}, {"out_b", &out_b, sb, true}, {"lse_b", &lse_b, slb, false}};
  for (const auto& [name, view, span, is_out] : inputs) {
    if (!(is_out && same_view(out.data, out.strides, *view)) && overlaps(so, span))
      throw Error("out", std::string("memory overlaps ") + name + " (only out_a's or out_b's very view merges in place)");
    if (!(!is_out && same_view(lse.data, lse.strides, *view)) && overlaps(sl, span))
      throw Error("lse", std::string("memory overlaps ") + name + " (only lse_a's or lse_b's very view merges in place)");
  }
  if (overlaps(so, sl)) throw Error("lse", "memory overlaps out");
}

template <class S>
void merge_impl(const ConstTensorView& out_a, const ConstTensorView& lse_a, const ConstTensorView& out_b,
                const ConstTensorView& lse_b, const TensorView& out, const TensorView& lse) {
  const std::int64_t T = out_a.shape[1], H = out_a.shape[2], Dv = out_a.shape[3];
  const auto* a = static_cast<const S*>(out_a.data);
  const auto* b = static_cast<const S*>(out_b.data);
  auto* o = static_cast<S*>(out.data);
  const auto* la = static_cast<const float*>(lse_a.data);
  const auto* lb = static_cast<const float*>(lse_b.data);
  auto* lo = static_cast<float*>(lse.data);
  const double inf = std::numeric_limits<double>::infinity();
  const simd::KernelTable& kt = simd::kernels();
  constexpr bool k16 = std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>;
  const simd::Convert16Kernels* conv = std::is_same_v<S, bfloat16> ? &kt.convert_bf16 : &kt.convert_f16;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      double s = la[t * lse_a.strides[1] + h * lse_a.strides[2]];
      const double sb = lb[t * lse_b.strides[1] + h * lse_b.strides[2]];
      const std::int64_t ra = t * out_a.strides[1] + h * out_a.strides[2], rb = t * out_b.strides[1] + h * out_b.strides[2],
                         ro = t * out.strides[1] + h * out.strides[2];
      // neither part saw a key (both -inf): zeros and -inf
      const detail::StateWeights w = s == -inf && sb == -inf ? detail::StateWeights{0.0, 0.0} : detail::merge_states(s, sb);
      lo[t * lse.strides[1] + h * lse.strides[2]] = static_cast<float>(s);
      const S* pa = a + ra;
      const S* pb = b + rb;
      S* po = o + ro;
      const std::int64_t sa = out_a.strides[3], sb2 = out_b.strides[3], so = out.strides[3];
      if (!std::is_same_v<S, double> && !w.nan && w.a != 0.0 && w.b != 0.0 && sa == 1 && sb2 == 1 && so == 1) {
        // the common case: the SIMD kernel
        if constexpr (std::is_same_v<S, float>) {
          kt.states.merge_rows(pa, pb, po, Dv, w.a, w.b, false);
        } else if constexpr (k16) {  // widened a piece at a time on the stack, the sum into fb
          constexpr std::int64_t kPiece = 256;
          float fa[kPiece], fb[kPiece];
          for (std::int64_t d0 = 0; d0 < Dv; d0 += kPiece) {
            const std::int64_t m = std::min(kPiece, Dv - d0);
            conv->widen(reinterpret_cast<const std::uint16_t*>(pa + d0), fa, m);
            conv->widen(reinterpret_cast<const std::uint16_t*>(pb + d0), fb, m);
            kt.states.merge_rows(fa, fb, fb, m, w.a, w.b, true);  // rounded to odd, then to 16 bits once
            conv->narrow(fb, reinterpret_cast<std::uint16_t*>(po + d0), m);
          }
        }
        continue;
      }
      // the kernel's sum fma(w_b, b, 0 + w_a a); a part of weight 0 (lse -inf) is not read: its row
      // may hold anything
      for (std::int64_t d = 0; d < Dv; ++d) {
        double x = 0.0;
        if (w.nan) x = std::numeric_limits<double>::quiet_NaN();
        else if (w.a != 0.0 && w.b != 0.0) x = std::fma(w.b, widen(pb[d * sb2]), 0.0 + w.a * widen(pa[d * sa]));
        else if (w.a != 0.0) x += w.a * widen(pa[d * sa]);
        else if (w.b != 0.0) x += w.b * widen(pb[d * sb2]);
        po[d * so] = detail::narrow<S>(x);
      }
    }
}

}  // namespace

namespace detail {

void merge_states_into(const ConstTensorView& out_a, const ConstTensorView& lse_a, const ConstTensorView& out_b,
                       const ConstTensorView& lse_b, const TensorView& out, const TensorView& lse) {
  visit_dtype(out_a.dtype, [&](auto t) { merge_impl<decltype(t)>(out_a, lse_a, out_b, lse_b, out, lse); });
}

}  // namespace detail

void merge_attention_states(const ConstTensorView& out_a, const ConstTensorView& lse_a, const ConstTensorView& out_b,
                            const ConstTensorView& lse_b, const TensorView& out, const TensorView& lse) {
  check_states(out_a, lse_a, out_b, lse_b, out, lse);
  detail::merge_states_into(out_a, lse_a, out_b, lse_b, out, lse);
}

}  // namespace simdattn

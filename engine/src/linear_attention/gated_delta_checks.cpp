// The gated delta rule's checks (gated_delta.hpp): every argument before anything is written.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/problem.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "linear_attention/gated_delta.hpp"
#include "runtime/threading.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

bool float_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Every element of v finite, else Error(name) naming the first that is not: a vectorized test of
// each contiguous f32 row (of each whole [c, d] block when it is contiguous) over the threads,
// then, only when one failed, a scan for the first.
void check_finite(const ConstTensorView& v, const char* name, int threads) {
  const Shape4& s = v.shape;
  const std::int64_t n01 = s[0] * s[1];
  if (n01 == 0 || s[2] == 0 || s[3] == 0) return;
  const simd::DeltaKernels& kern = simd::kernels().delta;
  auto block_ok = [&](std::int64_t a, std::int64_t b) {
    if ((v.dtype == DType::bf16 || v.dtype == DType::f16) && v.strides[3] == 1) {  // all-ones exponents
      const std::uint16_t mask = v.dtype == DType::bf16 ? 0x7f80 : 0x7c00;
      const auto* base = static_cast<const std::uint16_t*>(v.data) + a * v.strides[0] + b * v.strides[1];
      if (v.strides[2] == s[3]) return kern.all_finite16(base, s[2] * s[3], mask);
      for (std::int64_t c = 0; c < s[2]; ++c)
        if (!kern.all_finite16(base + c * v.strides[2], s[3], mask)) return false;
      return true;
    }
    const bool f32_rows = v.dtype == DType::f32 && v.strides[3] == 1;
    if (f32_rows) {
      const float* base = static_cast<const float*>(v.data) + a * v.strides[0] + b * v.strides[1];
      if (v.strides[2] == s[3]) return kern.all_finite(base, s[2] * s[3]);
      for (std::int64_t c = 0; c < s[2]; ++c)
        if (!kern.all_finite(base + c * v.strides[2], s[3])) return false;
      return true;
    }
    for (std::int64_t c = 0; c < s[2]; ++c)
      for (std::int64_t d = 0; d < s[3]; ++d)
        if (!std::isfinite(gdr_at(v, a, b, c, d))) return false;
    return true;
  };
  std::atomic<bool> bad{false};
  parallel_for(n01, threads, std::max<std::int64_t>(1, 32768 / (s[2] * s[3])), [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1 && !bad.load(std::memory_order_relaxed); ++i)
      if (!block_ok(i / s[1], i % s[1])) bad.store(true, std::memory_order_relaxed);
  });
  if (!bad.load()) return;
  for (std::int64_t a = 0; a < s[0]; ++a)
    for (std::int64_t b = 0; b < s[1]; ++b)
      for (std::int64_t c = 0; c < s[2]; ++c)
        for (std::int64_t d = 0; d < s[3]; ++d)
          if (!std::isfinite(gdr_at(v, a, b, c, d)))
            throw Error(name, "holds a NaN or an infinity at [" + num(a) + ", " + num(b) + ", " + num(c) + ", " + num(d) + "]");
}

}  // namespace

GdrSizes check_gated_delta(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                           const ConstTensorView& g, const ConstTensorView& beta, const TensorView& out,
                           const GatedDeltaRuleOptions& o) {
  check_isa();
  for (const auto& [view, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
    if (!float_dtype(view->dtype))
      throw Error(name, "dtype must be f32, bf16 or f16, got " + std::string(dtype_name(view->dtype)));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    throw Error(k.dtype != q.dtype ? "k" : "v", "dtype differs from q's " + std::string(dtype_name(q.dtype)));
  const Shape4& qs = q.shape;
  const GdrSizes z{qs[0], qs[1], qs[2], v.shape[2], qs[3], v.shape[3]};
  if (z.B < 1 || z.T < 0 || z.H < 1 || z.Dk < 1) throw Error("q", "expected [B >= 1, T, H >= 1, Dk >= 1], got " + shape_str(qs));
  if (k.shape != qs) throw Error("k", "expected q's shape " + shape_str(qs) + ", got " + shape_str(k.shape));
  if (v.shape[0] != z.B || v.shape[1] != z.T || z.Hv < 1 || z.Hv % z.H != 0 || z.Dv < 1)
    throw Error("v", "expected [B, T, Hv, Dv] with B = " + num(z.B) + ", T = " + num(z.T) + ", Hv a multiple of H = " +
                         num(z.H) + ", got " + shape_str(v.shape));
  const Shape4 gs{z.B, z.T, z.Hv, 1};
  for (const auto& [view, name] : {std::pair{&g, "g"}, std::pair{&beta, "beta"}}) {
    if (!float_dtype(view->dtype))
      throw Error(name, "dtype must be f32, bf16 or f16, got " + std::string(dtype_name(view->dtype)));
    if (view->shape != gs) throw Error(name, "expected [B, T, Hv, 1] = " + shape_str(gs) + ", got " + shape_str(view->shape));
  }
  const Shape4 os{z.B, z.T, z.Hv, z.Dv};
  if (out.dtype != q.dtype) throw Error("out", "dtype must be q's " + std::string(dtype_name(q.dtype)));
  if (out.shape != os) throw Error("out", "expected [B, T, Hv, Dv] = " + shape_str(os) + ", got " + shape_str(out.shape));
  if (o.threads < 0) throw Error("options.threads", "must be >= 0, got " + std::to_string(o.threads));
  if (o.scale && !std::isfinite(*o.scale))  // (any finite scale, as flash-linear-attention takes it)
    throw Error("options.scale", "must be finite, got " + std::to_string(*o.scale));
  const Shape4 ss{z.B, z.Hv, z.Dk, z.Dv};
  if (view_given(o.initial_state)) {
    if (o.initial_state.dtype != DType::f32)
      throw Error("options.initial_state", "dtype must be f32, got " + std::string(dtype_name(o.initial_state.dtype)));
    if (o.initial_state.shape != ss)
      throw Error("options.initial_state", "expected [B, Hv, Dk, Dv] = " + shape_str(ss) + ", got " + shape_str(o.initial_state.shape));
  }
  if (view_given(o.final_state)) {
    if (o.final_state.dtype != DType::f32)
      throw Error("options.final_state", "dtype must be f32, got " + std::string(dtype_name(o.final_state.dtype)));
    if (o.final_state.shape != ss)
      throw Error("options.final_state", "expected [B, Hv, Dk, Dv] = " + shape_str(ss) + ", got " + shape_str(o.final_state.shape));
  }
  // every input's bytes countable; the outputs clear of every input and of each other
  const Span so = byte_span("out", out.data, out.dtype, out.shape, out.strides);
  check_no_self_overlap("out", out.shape, out.strides);
  std::vector<std::pair<const char*, Span>> inputs = {{"q", byte_span("q", q)}, {"k", byte_span("k", k)},
                                                              {"v", byte_span("v", v)}, {"g", byte_span("g", g)},
                                                              {"beta", byte_span("beta", beta)}};
  if (view_given(o.initial_state)) inputs.push_back({"options.initial_state", byte_span("options.initial_state", o.initial_state)});
  for (const auto& [name, span] : inputs)
    if (overlaps(so, span)) throw Error("out", std::string("memory overlaps ") + name);
  if (view_given(o.final_state)) {
    const TensorView& f = o.final_state;
    const Span sf = byte_span("options.final_state", f.data, f.dtype, f.shape, f.strides);
    check_no_self_overlap("options.final_state", f.shape, f.strides);
    if (overlaps(sf, so)) throw Error("options.final_state", "memory overlaps out");
    for (const auto& [name, span] : inputs) {
      // in place: the initial state's own view (each head's state read before it is written);
      // any other overlap would read a state another head, or the same head, had already written
      const bool in_place = std::string(name) == "options.initial_state" && f.data == o.initial_state.data &&
                            f.strides == o.initial_state.strides;
      if (!in_place && overlaps(sf, span))
        throw Error("options.final_state", std::string("memory overlaps ") + name +
                                               (std::string(name) == "options.initial_state"
                                                    ? " other than as the same view (in place: the same data and strides)"
                                                    : ""));
    }
  }
  // values: finite inputs, g <= 0
  const int th = o.threads;
  check_finite(q, "q", th), check_finite(k, "k", th), check_finite(v, "v", th), check_finite(beta, "beta", th);
  check_finite(g, "g", th);
  for (std::int64_t b = 0; b < z.B; ++b)
    for (std::int64_t t = 0; t < z.T; ++t)
      for (std::int64_t h = 0; h < z.Hv; ++h)
        if (gdr_at(g, b, t, h, 0) > 0.0f)
          throw Error("g", "must be <= 0 (the log of a decay), got " + std::to_string(gdr_at(g, b, t, h, 0)) + " at [" + num(b) + ", " +
                               num(t) + ", " + num(h) + "]");
  if (view_given(o.initial_state)) check_finite(o.initial_state, "options.initial_state", th);
  return z;
}

}  // namespace simdattn::detail

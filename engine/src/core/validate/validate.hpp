// Turning the arguments of attention() and attention_paged() into a Problem: one validator, two
// forms of the call (validate.cpp, paged.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "core/problem.hpp"
#include "simdattn/attention.hpp"
#include "simdattn/paged.hpp"
#include "simdattn/error.hpp"
#include "simdattn/runtime.hpp"

namespace simdattn::detail {

// Byte span [lo, hi) a view touches; {0, 0} for an empty view.
struct Span {
  std::uintptr_t lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
};

// The bytes a view of these sizes and element strides touches. Throws Error(name) for a negative
// size or stride, a null pointer under a non-empty shape, or an overflow.
Span byte_span(const std::string& name, const void* data, DType dtype, const Shape4& shape, const Shape4& strides);
inline Span byte_span(const std::string& name, const ConstTensorView& v) {
  return byte_span(name, v.data, v.dtype, v.shape, v.strides);
}
// A sufficient condition for an output view to have no two elements at one address: ordered
// by stride, each dimension's stride exceeds the extent of all smaller ones. Throws Error(name).
void check_no_self_overlap(const std::string& name, const Shape4& shape, const Shape4& strides);
bool overlaps(const Span& a, const Span& b);
// The bytes [data, data + bytes) (an option's span of values).
inline Span span_of(const void* data, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(data);
  return Span{a, a + bytes};
}
// An 8-bit K/V scales option `name`: absent unless kv_dtype is an 8-bit code dtype (given
// anyway: Error), then required, f32, of shape `want` (written shape_name in messages), clear of
// out's span so. Returns its data, or nullptr for K/V without codes. Throws Error(name).
const float* check_scale_view(const std::string& name, const ConstTensorView& view, const Shape4& want,
                              const char* shape_name, DType kv_dtype, const Span& so);
// The first of n scales s[j * stride] that is not finite and >= 0 (8-bit K/V's), or -1.
std::int64_t first_bad_scale(const float* s, std::int64_t n, std::int64_t stride);
// `values` holds `want` finite floats (name: what they are, one per `per`) clear of the output
// span `so`. Throws Error(name), or Error("out") on an overlap.
void check_per_head(const std::string& name, std::span<const float> values, std::int64_t want, const char* per,
                    const Span& so);

// The softcap (finite, > 0), ALiBi slopes and sinks ([p.H] finite values each, clear of out's
// span so) of options `opt` onto a problem's softcap, alibi and sinks (attention() and
// attention_paged() take them alike). Throws Error naming the option.
template <class P, class Options>
void set_softcap_alibi_sinks(P& p, const Options& opt, const Span& so) {
  if (opt.softcap) {
    if (!(std::isfinite(*opt.softcap) && *opt.softcap > 0.0))
      throw Error("options.softcap", "must be finite and > 0, got " + std::to_string(*opt.softcap));
    p.softcap = *opt.softcap;
  }
  if (!opt.alibi_slopes.empty()) {
    check_per_head("options.alibi_slopes", opt.alibi_slopes, p.H, "query head", so);
    p.alibi = opt.alibi_slopes.data();
  }
  if (!opt.sinks.empty()) {
    check_per_head("options.sinks", opt.sinks, p.H, "query head", so);
    p.sinks = opt.sinks.data();
  }
}

// The window of options onto a problem whose Sq and Sk are set (each side >= -1; saturated past
// every distance between a query's position and a key, `offsets_reach` further with query
// offsets). Throws Error("options.window").
void set_window(Problem& p, const std::optional<Window>& window, std::int64_t offsets_reach = 0);
// The scale (default 1 / sqrt(D); finite) and the thread count (>= 0) of options onto a problem
// whose D is set. Throws Error naming the option.
void set_scale_threads(Problem& p, const ScoreOptions& opt);

// T5's relative position bias onto a problem whose H is set: its table f32, f64, bf16 or f16
// [1, 1, num_buckets, H] (num_buckets >= 4 bidirectional, >= 2 one-way), max_distance past the
// exact buckets, clear of out's span so. Throws Error naming the option.
void set_relative_bias(Problem& p, const RelativePositionBias& rb, const Span& so);

// Resolves the ISA the kernels dispatch to (once per process): an unknown or unavailable
// SIMDATTN_ISA throws Error("SIMDATTN_ISA", ...). Every public entry point calls it first, so a
// bad environment is a named input error on every path, never an escape from a parallel region.
// It also reads SIMDATTN_THREAD_RUNTIME (env_thread_runtime): a value other than team or openmp
// throws Error("SIMDATTN_THREAD_RUNTIME", ...).
void check_isa();

// The thread runtime SIMDATTN_THREAD_RUNTIME names (read once): none when unset or empty;
// Error("SIMDATTN_THREAD_RUNTIME", ...) for a value other than team or openmp.
std::optional<ThreadRuntime> env_thread_runtime();

// Validates the arguments of attention() and builds the Problem. Throws Error.
Problem make_problem(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     const TensorView& out, const AttentionOptions& options);
// The same for attention_paged() (paged.cpp): its keys in blocks, varlen queries.
Problem make_problem(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                     const BlockTable& block_table, std::span<const std::int64_t> seq_lens, const TensorView& out,
                     const PagedAttentionOptions& options);

}  // namespace simdattn::detail

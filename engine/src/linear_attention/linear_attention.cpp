// Linear attention: the reference (double-precision sums straight from the definition), the
// native chunked kernel on the GEMM, and the recurrent state for decoding (see linear.hpp).
#include "simdattn/linear.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/problem.hpp"
#include "core/validate/validate.hpp"
#include "linalg/convert.hpp"
#include "linalg/panels.hpp"
#include "linear_attention/native.hpp"
#include "linear_attention/phi.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/verbose.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"
#include "simdattn/simd/kernels.hpp"

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
      const double f = phi<double>(o.feature_map, k[b * p.k_strides[0] + hk * p.k_strides[1] + j * p.k_strides[2] + d * p.k_strides[3]]);
      for (std::int64_t e = 0; e < p.Dv; ++e)
        s[d * W + e] += f * static_cast<double>(v[b * p.v_strides[0] + hk * p.v_strides[1] + j * p.v_strides[2] + e * p.v_strides[3]]);
      s[d * W + p.Dv] += f;
    }
  };
  auto write_row = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    for (std::int64_t d = 0; d < p.D; ++d)
      fq[d] = phi<double>(o.feature_map, q[b * p.q_strides[0] + h * p.q_strides[1] + i * p.q_strides[2] + d * p.q_strides[3]]);
    double den = o.eps;
    for (std::int64_t d = 0; d < p.D; ++d) den += fq[d] * s[d * W + p.Dv];
    for (std::int64_t e = 0; e < p.Dv; ++e) {
      double num = 0.0;
      for (std::int64_t d = 0; d < p.D; ++d) num += fq[d] * s[d * W + e];
      out[b * p.o_strides[0] + h * p.o_strides[1] + i * p.o_strides[2] + e * p.o_strides[3]] = static_cast<T>(num / den);
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

// bf16/f16 operands: q, k and v widened to dense copies in W (the reference: f64, so its sums are
// the definition's on the rounded inputs; native: f32, products and sums in f32), computed there,
// and the output narrowed (to nearest even, once) into out.
template <class W, class Run>
void widened(const Problem& p, Run run) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(p.dtype));
  // Each (batch, head) of a view, as the [S, cols] matrix it is, to or from its dense copy.
  auto each_matrix = [&](const Shape4& st, const Shape4& shape, auto convert) {
    for (std::int64_t a = 0; a < shape[0]; ++a)
      for (std::int64_t b = 0; b < shape[1]; ++b) convert((a * st[0] + b * st[1]) * es, (a * shape[1] + b) * shape[2] * shape[3]);
  };
  auto dense = [&](const void* src, const Shape4& st, const Shape4& shape) {
    std::vector<W> d(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    each_matrix(st, shape, [&](std::int64_t byte_off, std::int64_t n) {
      detail::convert_matrix(static_cast<const char*>(src) + byte_off, p.dtype, st[2], st[3], shape[2], shape[3], d.data() + n,
                             dtype_of<W>(), shape[3]);
    });
    return d;
  };
  const Shape4 qshape{p.B, p.H, p.Sq, p.D}, kshape{p.B, p.Hkv, p.Sk, p.D}, vshape{p.B, p.Hkv, p.Sk, p.Dv};
  const Shape4 oshape{p.B, p.H, p.Sq, p.Dv};
  const std::vector<W> q = dense(p.q, p.q_strides, qshape), k = dense(p.k, p.k_strides, kshape), v = dense(p.v, p.v_strides, vshape);
  std::vector<W> o(static_cast<std::size_t>(p.B * p.H * p.Sq * p.Dv));
  Problem f = p;
  f.dtype = dtype_of<W>();
  f.q = q.data(), f.k = k.data(), f.v = v.data(), f.o = o.data();
  f.q_strides = contiguous_strides(qshape), f.k_strides = contiguous_strides(kshape);
  f.v_strides = contiguous_strides(vshape), f.o_strides = contiguous_strides(oshape);
  run(f);
  each_matrix(p.o_strides, oshape, [&](std::int64_t byte_off, std::int64_t n) {
    detail::convert_matrix(o.data() + n, dtype_of<W>(), p.Dv, 1, p.Sq, p.Dv, static_cast<char*>(p.o) + byte_off, p.dtype,
                           p.o_strides[2], p.o_strides[3]);
  });
}

// Verbose mode's fields (runtime/verbose.hpp): path= native (the chunked kernel; 16-bit inputs on
// f32 copies: native.widened) or reference.
void describe(detail::VerboseCall& call, const Problem& p, const LinearAttentionOptions& o) {
  const bool half = p.dtype == DType::bf16 || p.dtype == DType::f16;
  call.backend = backend_name(o.backend);
  call.take_path(std::string(backend_name(o.backend)) + (half && o.backend == Backend::native ? ".widened" : ""), "");
  call.dtype = dtype_name(p.dtype);
  call.kv_dtype = dtype_name(p.kv_dtype);
  call.shape("q", detail::verbose_shape({p.B, p.H, p.Sq, p.D}));
  call.shape("k", detail::verbose_shape({p.B, p.Hkv, p.Sk, p.D}));
  call.shape("v", detail::verbose_shape({p.B, p.Hkv, p.Sk, p.Dv}));
  call.opts = std::string(o.causal ? "causal," : "") + "phi:" + std::string(feature_map_name(o.feature_map)) +
              ",chunk:" + std::to_string(o.chunk);
}

void run_linear(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& out,
                const LinearAttentionOptions& options, detail::VerboseCall* verbose) {
  const detail::CallScope in_use;  // the thread budget counts this thread as busy
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
  if (verbose != nullptr) describe(*verbose, p, options);
  if (p.B == 0 || p.H == 0 || p.Sq == 0 || p.Dv == 0) return;
  const bool half = p.dtype == DType::bf16 || p.dtype == DType::f16;
  if (half && options.backend == Backend::reference) {
    widened<double>(p, [&](const Problem& f) { reference<double>(f, options); });
  } else if (half) {
    widened<float>(p, [&](const Problem& f) { native<float>(f, options); });
  } else if (options.backend == Backend::reference) {
    if (p.dtype == DType::f32) reference<float>(p, options);
    else reference<double>(p, options);
  } else {
    if (p.dtype == DType::f32) native<float>(p, options);
    else native<double>(p, options);
  }
}

}  // namespace

void linear_attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                      const TensorView& out, const LinearAttentionOptions& options) {
  detail::verbose_entry("linear_attention",
                        [&](detail::VerboseCall* verbose) { run_linear(q, k, v, out, options, verbose); });
}

}  // namespace simdattn

// The native backend, first version: a portable row-at-a-time kernel with an online softmax.
//
// Per query row it keeps a running maximum m, a running sum l and an accumulator acc[Dv], and
// rescales acc and l only when the maximum grows (the same recurrence the fused flash kernel uses),
// so the Sq x Sk score matrix is never stored. Rows are spread over threads in balanced chunks.
// Accumulation is in double, which keeps it well inside DESIGN.md's tolerances at any Sk. The
// vectorized, cache-blocked fused kernel replaces this loop nest; the contract stays the same.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "problem.hpp"
#include "threading.hpp"

namespace simdattn::detail {
namespace {

// Rows per thread below which a parallel region costs more than it saves: one row at D = 64 and
// Sk = 128 is ~30k flops, about 10 us here, the order of an OpenMP fork/join.
constexpr std::int64_t kMinRowsPerThread = 4;

template <class T>
void native_rows(const Problem& p, std::int64_t row_begin, std::int64_t row_end) {
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  T* o = static_cast<T*>(p.o);
  const std::int64_t group = p.H / p.Hkv;
  const double neg_inf = -std::numeric_limits<double>::infinity();

  // Per-thread accumulator, grown once and reused by every later call on this thread.
  thread_local std::vector<double> acc_buf;
  if (acc_buf.size() < static_cast<std::size_t>(p.Dv)) acc_buf.resize(static_cast<std::size_t>(p.Dv));
  double* acc = acc_buf.data();

  for (std::int64_t row = row_begin; row < row_end; ++row) {
    // row = (b * H + h) * Sq + i
    const std::int64_t i = row % p.Sq;
    const std::int64_t h = (row / p.Sq) % p.H;
    const std::int64_t b = row / (p.Sq * p.H);
    const std::int64_t hk = h / group;
    const T* qi = q + b * p.qs[0] + h * p.qs[1] + i * p.qs[2];
    const T* kb = k + b * p.ks[0] + hk * p.ks[1];
    const T* vb = v + b * p.vs[0] + hk * p.vs[1];

    double m = neg_inf, l = 0.0;
    for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] = 0.0;
    for (std::int64_t j = 0; j < p.Sk; ++j) {
      if (!position_visible(p, b, i, j)) continue;
      if (p.mask_kind == MaskKind::boolean && !p.mask_allows(b, h, i, j)) continue;
      const T* kj = kb + j * p.ks[2];
      double dot = 0.0;
      for (std::int64_t d = 0; d < p.D; ++d)
        dot += static_cast<double>(qi[d * p.qs[3]]) * static_cast<double>(kj[d * p.ks[3]]);
      double s = p.scale * dot;
      if (p.mask_kind == MaskKind::additive) s += p.mask_add(b, h, i, j);
      if (s == neg_inf) continue;  // exactly zero weight
      if (s > m) {                 // the maximum grows: rescale what was accumulated
        const double alpha = std::exp(m - s);  // m = -inf gives 0
        l *= alpha;
        for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] *= alpha;
        m = s;
      }
      const double w = std::exp(s - m);  // NaN scores propagate through w into l and acc
      l += w;
      const T* vj = vb + j * p.vs[2];
      for (std::int64_t d = 0; d < p.Dv; ++d) acc[d] += w * static_cast<double>(vj[d * p.vs[3]]);
    }

    T* oi = o + b * p.os[0] + h * p.os[1] + i * p.os[2];
    const double inv = l == 0.0 ? 0.0 : 1.0 / l;  // no visible key: a zero row
    for (std::int64_t d = 0; d < p.Dv; ++d) oi[d * p.os[3]] = static_cast<T>(acc[d] * inv);
  }
}

}  // namespace

void attention_native(const Problem& p) {
  const std::int64_t rows = p.B * p.H * p.Sq;
  parallel_for(rows, p.threads, kMinRowsPerThread, [&](std::int64_t begin, std::int64_t end) {
    if (p.dtype == DType::f32) native_rows<float>(p, begin, end);
    else native_rows<double>(p, begin, end);
  });
}

}  // namespace simdattn::detail

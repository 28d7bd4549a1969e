// Row operations the native attention paths share: scaling and masking one row of scores, and
// writing one output row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/modifiers.hpp"
#include "core/position_rule.hpp"
#include "core/problem.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

// The keys [lo, hi) of j0 .. j0 + nk - 1, relative to j0, that query i of batch b may see by
// key length, causal and window; with sparse patterns [0, key length) (checked key by key).
inline KeyRange row_keys_in(const Problem& p, std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t nk) {
  KeyRange r = p.sparse() ? KeyRange{0, p.key_len(b)} : row_keys(p, b, i);
  r.lo = std::clamp<std::int64_t>(r.lo - j0, 0, nk);
  r.hi = std::clamp<std::int64_t>(r.hi - j0, r.lo, nk);
  return r;
}

// With sparse patterns, hides the keys of row[lo, hi) (keys j0 + lo .. j0 + hi - 1) that query
// i of batch b, not a global query, cannot see: visible are the global keys (< G) and, inside
// its structural interval, the keys of listed bs x bs blocks. Segment by segment, one block each.
template <class T>
void hide_sparse_keys(const Problem& p, T* row, std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t lo,
                      std::int64_t hi) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const KeyRange r = row_keys(p, b, i);
  const std::int64_t bs = p.block_mask != nullptr ? p.block_size : hi + j0 + 1;
  for (std::int64_t s0 = j0 + lo; s0 < j0 + hi;) {
    const std::int64_t e0 = std::min(j0 + hi, (s0 / bs + 1) * bs);  // segment [s0, e0): one block
    const bool listed = p.block_mask == nullptr || p.block_allows(i, s0);
    const std::int64_t start = std::max(s0, std::min(e0, p.global_tokens));  // keys before are global
    const std::int64_t va = listed ? std::clamp(r.lo, start, e0) : e0;
    const std::int64_t vz = listed ? std::clamp(r.hi, va, e0) : e0;
    for (std::int64_t j = start; j < va; ++j) row[j - j0] = neg_inf;
    for (std::int64_t j = vz; j < e0; ++j) row[j - j0] = neg_inf;
    s0 = e0;
  }
}

// Scales row[0:nk] (the raw scores of query i of head (b, h) against keys j0 .. j0 + nk - 1),
// applies the score modifiers, adds the additive mask, sets hidden keys to -inf and returns the
// row max. `full`: every key is visible and there is no explicit mask (nor modifier). bias: the
// row's ALiBi and T5 terms for keys j0 .. j0 + nk - 1 (fill_bias_line), or null to have them
// computed here.
template <class T>
T scale_mask_row(const Problem& p, const simd::VectorKernels<T>& vk, T* row, std::int64_t b, std::int64_t h,
                 std::int64_t i, std::int64_t j0, std::int64_t nk, bool full, const T* bias = nullptr) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = static_cast<T>(p.scale);
  if (full && !p.scores_modified()) return vk.scale_add_max(row, nk, scale, nullptr);
  // Key lengths, causal and window leave the row one interval [lo, hi) of visible keys: scale
  // it (adding the mask), fill the rest with -inf.
  const KeyRange r = row_keys_in(p, b, i, j0, nk);
  const std::int64_t lo = r.lo, hi = r.hi;
  for (std::int64_t j = 0; j < lo; ++j) row[j] = neg_inf;
  for (std::int64_t j = hi; j < nk; ++j) row[j] = neg_inf;
  const T* add = nullptr;
  if (p.mask_kind == MaskKind::additive && p.mask_dtype == dtype_of<T>() && p.mask_strides[3] == 1)
    add = static_cast<const T*>(p.mask) + p.mask_offset(b, h, i, j0);
  T bm = neg_inf;
  if (lo < hi && p.scores_modified()) {
    // scaled (and capped), then the ALiBi and T5 line, then the mask
    thread_local std::vector<T> own;
    if (bias == nullptr && (p.alibi != nullptr || p.t5_table != nullptr)) {
      own.resize(static_cast<std::size_t>(nk));
      fill_bias_line(p, h, j0 - (i + p.query_offset(b)), nk, own.data());
      bias = own.data();
    }
    T* x = row + lo;
    const std::int64_t n = hi - lo;
    if (p.softcap > 0.0) {
      bm = vk.softcap_add_max(x, n, scale, static_cast<T>(p.softcap), bias != nullptr ? bias + lo : nullptr);
    } else {
      bm = vk.scale_add_max(x, n, scale, bias != nullptr ? bias + lo : nullptr);
    }
    if (add != nullptr) bm = vk.scale_add_max(x, n, T(1), add + lo);
  } else if (lo < hi) {
    bm = vk.scale_add_max(row + lo, hi - lo, scale, add ? add + lo : nullptr);
  }
  if ((p.mask_kind == MaskKind::additive && add == nullptr) || p.mask_kind == MaskKind::boolean) {
    for (std::int64_t j = lo; j < hi; ++j) {
      if (p.mask_kind == MaskKind::boolean) {
        if (!p.mask_allows(b, h, i, j0 + j)) row[j] = neg_inf;
      } else {
        row[j] += static_cast<T>(p.mask_add(b, h, i, j0 + j));
      }
    }
    bm = lo < hi ? vk.max(row + lo, hi - lo) : neg_inf;
  }
  // After the explicit mask, so that a +inf or NaN mask value at a hidden key cannot reach it.
  if (p.sparse() && lo < hi && !global_query(p, b, i)) {
    hide_sparse_keys(p, row, b, i, j0, lo, hi);
    bm = vk.max(row + lo, hi - lo);
  }
  return bm;
}

// Writes one output row: acc[0:Dv] / l to dst (stride os[3]); l == 0 (no visible key) writes
// zeros without reading acc, which then may never have been written. acc may be overwritten.
template <class T>
void write_output_row(const Problem& p, const simd::VectorKernels<T>& vk, T* acc, T l, T* dst) {
  if (l == T(0)) {
    for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.o_strides[3]] = T(0);
    return;
  }
  if (p.o_strides[3] == 1) {
    vk.scale_to(acc, dst, p.Dv, T(1) / l);
    return;
  }
  vk.scale(acc, p.Dv, T(1) / l);
  for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.o_strides[3]] = acc[d];
}

}  // namespace simdattn::detail

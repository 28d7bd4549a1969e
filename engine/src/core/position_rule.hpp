// The position and visibility rule (docs/design.md, "Positions and visibility"): the one place
// it is written. Every backend asks it which keys a query, a block of queries or a tile sees.
//
// Query i of batch b sits at key position pos = i + query_offset(b). Its structure (key length,
// causal, window) leaves it one interval of keys; as i grows both ends of that interval move
// right (or stay), so for a block of rows the first and last rows bound everything:
//   union        [row_keys(first).lo, row_keys(last).hi)   keys some row of the block may see
//   intersection [row_keys(last).lo, row_keys(first).hi)   keys every row of the block sees
// Sparse patterns (global tokens, a block mask) and the explicit mask are applied on top.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/problem.hpp"

namespace simdattn::detail {

// Keys [lo, hi); empty when hi <= lo (the bounds are not clamped against each other).
struct KeyRange {
  std::int64_t lo = 0, hi = 0;
  bool empty() const { return hi <= lo; }
};

// The keys query i of batch b may see by key length, causal and window (no sparse patterns, no
// explicit mask): [max(0, pos - left), min(L[b], pos + 1 if causal, pos + right + 1)).
inline KeyRange row_keys(const Problem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t pos = i + p.query_offset(b);
  KeyRange r{0, p.key_len(b)};
  if (p.causal != Causal::none) r.hi = std::min(r.hi, pos + 1);
  if (p.has_window && p.window_left >= 0) r.lo = std::max(r.lo, pos - p.window_left);
  if (p.has_window && p.window_right >= 0) r.hi = std::min(r.hi, pos + p.window_right + 1);
  return r;
}

// Keys some row of queries [i0, i1) may see by structure (i1 > i0).
inline KeyRange block_keys_union(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1) {
  return {row_keys(p, b, i0).lo, row_keys(p, b, i1 - 1).hi};
}

// Keys every row of queries [i0, i1) sees by structure (i1 > i0).
inline KeyRange block_keys_intersection(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1) {
  return {row_keys(p, b, i1 - 1).lo, row_keys(p, b, i0).hi};
}

// Whether query i of batch b is global (its position is one of the first G).
inline bool global_query(const Problem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t pos = i + p.query_offset(b);
  return pos >= 0 && pos < p.global_tokens;
}

// Key j visible to query i of batch b by everything but the explicit mask: key length, causal,
// window, global tokens and the block mask.
inline bool position_visible(const Problem& p, std::int64_t b, std::int64_t i, std::int64_t j) {
  if (j >= p.key_len(b)) return false;
  // A global key or a global query: nothing else hides it.
  if (j < p.global_tokens || global_query(p, b, i)) return true;
  if (p.block_mask != nullptr && !p.block_allows(i, j)) return false;
  const KeyRange r = row_keys(p, b, i);
  return j >= r.lo && j < r.hi;
}

// A tile of queries [i0, i1) x keys [j0, j1): no pair visible, every pair visible with no
// explicit mask to apply, or mixed (decided key by key).
enum class Cover { hidden, full, mixed };

// The tile by structure alone (key length, causal, window).
inline Cover classify_structure(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                                std::int64_t j1) {
  const KeyRange some = block_keys_union(p, b, i0, i1);
  if (j0 >= some.hi || j1 <= some.lo) return Cover::hidden;
  const KeyRange all = block_keys_intersection(p, b, i0, i1);
  // a tree mask shows every row its context whole
  const bool unmasked = p.mask_kind == MaskKind::none || (p.tree_mask != nullptr && j1 <= p.query_offset(b));
  const bool full = j0 >= all.lo && j1 <= all.hi && unmasked;
  return full ? Cover::full : Cover::mixed;
}

// The tile with the sparse patterns too: a tile touching a global query or key is mixed (decided
// per element); otherwise the block mask hides it when none of the bs x bs blocks it overlaps is
// listed, and keeps it full only when all are.
inline Cover classify(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                      std::int64_t j1) {
  if (!p.sparse()) return classify_structure(p, b, i0, i1, j0, j1);
  const std::int64_t L = p.key_len(b);
  if (j0 >= L) return Cover::hidden;
  const std::int64_t first = i0 + p.query_offset(b), last = i1 - 1 + p.query_offset(b);
  if (j0 < p.global_tokens || (last >= 0 && first < p.global_tokens)) return Cover::mixed;
  const Cover base = classify_structure(p, b, i0, i1, j0, j1);
  if (base == Cover::hidden || p.block_mask == nullptr) return base;
  bool any = false, all = true;
  const std::int64_t bs = p.block_size, je = std::min(j1, L);
  for (std::int64_t bi = i0 / bs; bi <= (i1 - 1) / bs; ++bi)
    for (std::int64_t bj = j0 / bs; bj <= (je - 1) / bs; ++bj) {
      const bool v = p.block_mask[bi * p.block_mask_strides[0] + bj * p.block_mask_strides[1]] != 0;
      any = any || v;
      all = all && v;
    }
  if (!any) return Cover::hidden;
  return all ? base : Cover::mixed;
}

}  // namespace simdattn::detail

// The onednn backend's blocks (blocks.hpp): their key ranges and masks from the position rule
// and the score modifiers.
#include "attention/onednn/blocks.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/modifiers.hpp"
#include "core/position_rule.hpp"
#include "core/problem.hpp"

namespace simdattn::detail::onednn_attention {

void key_range(const Problem& p, Block& blk, bool& structure_hides) {
  if (p.sparse()) {  // global tokens and block masks: every key below L may be visible
    blk.jlo = 0;
    blk.jhi = p.key_len(blk.b);
    structure_hides = blk.jhi > 0;
    return;
  }
  const KeyRange some = block_keys_union(p, blk.b, blk.i0, blk.i1);
  const KeyRange all = block_keys_intersection(p, blk.b, blk.i0, blk.i1);
  // 16-bit operands: the keys from 0, not from the block's first visible one. oneDNN 2.6's bf16
  // matmuls on K and V views starting at a later key gave wrong rows (a window of (31, 2) over 83
  // keys: errors up to 0.59 on the rows nearest the start; guarded by
  // tests/attention/onednn/test_onednn.cpp).
  blk.jlo = p.dtype == DType::f32 ? some.lo : 0;
  blk.jhi = std::max(some.lo, some.hi);
  structure_hides = blk.jhi > blk.jlo && (blk.jhi > all.hi || blk.jlo < all.lo);
}

void build_mask(const Problem& p, const Block& blk, float* mask, std::uint8_t* flags) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const std::int64_t W = blk.jhi - blk.jlo;
  for (std::int64_t hh = 0; hh < blk.mask_heads; ++hh) {
    for (std::int64_t r = 0; r < blk.mask_rows; ++r) {
      const std::int64_t i = blk.i0 + r;
      // The structure leaves row i one interval of keys (a mask shared by every row of the
      // block is one the structure hides nothing from: the block's keys below the key length).
      const KeyRange keys = blk.mask_rows > 1 || blk.i1 - blk.i0 == 1 ? row_keys(p, blk.b, i)
                                                                       : KeyRange{0, p.key_len(blk.b)};
      float* row = mask + (hh * blk.mask_rows + r) * W;
      bool any = false;
      for (std::int64_t c = 0; c < W; ++c) {
        const std::int64_t j = blk.jlo + c;
        float x = neg_inf;
        if (p.sparse() ? position_visible(p, blk.b, i, j) : (j >= keys.lo && j < keys.hi)) {
          if (p.mask_kind == MaskKind::boolean) {
            if (p.mask_allows(blk.b, hh, i, j)) x = 0.f;
          } else if (p.mask_kind == MaskKind::additive) {
            x = static_cast<float>(p.mask_add(blk.b, hh, i, j));
          } else {
            x = 0.f;
          }
          if (x != neg_inf && (p.alibi != nullptr || p.t5_table != nullptr)) {  // (hh is the head: see mask_by_head_)
            const std::int64_t rel = j - (i + p.query_offset(blk.b));
            double add = 0.0;
            if (p.alibi != nullptr) add += static_cast<double>(p.alibi[hh]) * static_cast<double>(rel);
            if (p.t5_table != nullptr) add += t5_bias(p, hh, rel);
            x = static_cast<float>(static_cast<double>(x) + add);
          }
        }
        row[c] = x;
        any = any || x != neg_inf;
      }
      flags[hh * blk.mask_rows + r] = any ? 0 : 1;
    }
  }
}

}  // namespace simdattn::detail::onednn_attention

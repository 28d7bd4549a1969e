// The onednn backend's blocks (onednn.cpp): one batch and block of query rows, the keys some row
// of it can see, and its additive mask.
#pragma once

#include <cstdint>
#include <memory>

#include "attention/onednn/primitives.hpp"
#include "core/problem.hpp"

namespace simdattn::detail::onednn_attention {

// One (batch, row block) of the call.
struct Block {
  std::int64_t b = 0, i0 = 0, i1 = 0;
  std::int64_t jlo = 0, jhi = 0;    // keys handed to oneDNN; empty: every row is zero
  std::int64_t mask_heads = 0;      // 0: no mask; else 1 or H
  std::int64_t mask_rows = 0;       // 1 or i1 - i0
  std::shared_ptr<const StepPrims> prims;
};

// Keys [jlo, jhi) some row of the block can see, and whether any key in that range is hidden from
// some row by the structure (key length, causal, window) or a sparse pattern.
void key_range(const Problem& p, Block& blk, bool& structure_hides);

// Fills the block's mask [mask_heads, mask_rows, W] and flags[mask_heads * mask_rows] (1 for a
// row with no visible key).
void build_mask(const Problem& p, const Block& blk, float* mask, std::uint8_t* flags);

}  // namespace simdattn::detail::onednn_attention

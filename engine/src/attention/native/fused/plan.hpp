// The fused path's block sizes and its plan of a call: everything one call needs to know,
// shared by its threads (attention/native/fused/fused.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "attention/native/paths.hpp"
#include "core/modifiers.hpp"
#include "core/problem.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
// Part of fused.cpp, the one file that includes it: internal linkage, as if written there.
namespace {

// Query rows per block: a multiple of the in-place tile heights (6 on AVX-512) so that full
// blocks have no short tiles; 96 rows x 128 keys of S is 48 KiB (f32), in L2 beside
// the packed K^T and V blocks.
constexpr std::int64_t kBlockQ = 96;
// Keys per block: a multiple of every ISA's panel width (32, 16, 8 f32 columns); also the
// granularity at which causal masks and windows skip whole blocks. Up to kMaxBlockK keys
// (vit's 197) go as one block: one online-softmax step and one pass over O per query block
// instead of two.
constexpr std::int64_t kBlockK = 128;
constexpr std::int64_t kMaxBlockK = 256;
// Stacked rows (the decode paths: a group's heads of a few tokens as one block of rows,
// RowBlock): up to 128 rows a block, MLA's 128 heads of one token in one block (S 128 x 128
// keys is 64 KiB, in L2 beside the packed block).
constexpr std::int64_t kBlockRowsStacked = 128;
// The fused path stacks a group's heads too (fused_stacks_heads) up to this many query tokens
// a sequence (a speculative step's tree, a cascade's forks over their prefix): a group's rows read
// each packed key block once, from L2, where one head's few rows read the blocks kept for the
// group's other heads (2 MiB for 2048 f32 keys of D 128) from beyond it, and their short tiles
// weigh more. Measured (H 32, Hkv 8, 4096 paged f32 keys, 2 threads) stacked against one head's
// rows: 17 tokens 1.12x, 24 1.08x, 32 1.03-1.06x, 40 1.01x, 48 0.98x, 64 0.96x.
constexpr std::int64_t kStackedMaxTokens = 32;
// On AMX tiles (FusedPlan::amx): query blocks of up to 128 rows (four groups of 32 tile rows),
// their rows a multiple of 16 (one tile's), and key blocks of kMaxBlockK keys (round_up(Sk, 32)
// when fewer): half as many softmax steps and passes over O per key as 128, where 512 gained
// nothing more (guarded by attention/native/gpt.bf16 and batch.bf16).
constexpr std::int64_t kBlockQTiles = 128;
constexpr std::int64_t kMaxBlockQ = std::max({kBlockQ, kBlockQTiles, kBlockRowsStacked});
// Largest register-tile height or panel width of any ISA (bounds the row-pointer arrays).
constexpr std::int64_t kMaxTile = 64;

// How a call's rows come: blocks of one head's rows (the fused path: prompts, long queries) or a
// group's heads stacked (the decode paths: a few tokens a sequence).
enum class RowLayout { one_head, stacked };

// Everything one call needs to know, shared by its threads.
// T: the type computed in (f32 or f64); S: the type q, k, v and out are stored in (T, or bf16 /
// f16 computed in f32: K and V rows widened while they are packed, Q rows while they are copied,
// and the normalised output narrowed to nearest even as it is written).
template <class T, class S>
struct FusedPlan {
  const Problem& p;
  const simd::KernelTable& kt;
  const simd::GemmKernels<T>& gk;
  const simd::VectorKernels<T>& vk;
  std::int64_t tile_rows, tile_cols;  // the in-place-A tile both GEMMs run on
  std::int64_t lanes;                 // elements per vector
  std::int64_t dv_computed;           // Dv rounded up to a vector: the columns of O computed
  std::int64_t dv_padded;             // Dv rounded up to tile_cols: O's row stride in scratch
  RowLayout layout;
  std::int64_t q_blocks, k_blocks;    // query blocks per head (one_head), key blocks
  std::int64_t q_rows;                // query rows per block (the last may have fewer); stacked: the most
  std::int64_t k_keys;                // keys per block (the last may have fewer)
  // Packed key blocks a worker keeps: every block of its kv head (one_head: the later query
  // blocks of the head and its group reuse them), or one (stacked: a unit's rows read each
  // block once; a long sequence's keys would not fit). Block jb sits in slot jb % k_slots.
  std::int64_t k_slots;
  // Scratch layout (elements, each part 64-byte aligned): packed K^T and V of one kv head,
  // packed Q block, S block, O block, row max m, row sum l and rescale factor, which key blocks
  // are packed.
  std::int64_t k_size, v_size, q_size, s_size, o_size, row_size, flag_size;
  std::int64_t conv_size;  // 16-bit storage or 8-bit codes: a panel of K rows, or a block of V rows, widened
  std::int64_t t5_reach = 0, t5_size = 0;  // T5's bias by relative position in [-reach, reach]
  // Tiles (bf16 on a table with tile kernels, fused_on_tiles: AMX, or vdpbf16ps over the same
  // layouts; one head's rows or stacked rows): both products on them. K packed as pairs along D
  // per panel of 32 keys, V as pairs along the keys per panel of 32 columns, the Q block and the
  // probabilities P as tiles of 32 x 32 bf16 (elements of uint16 held in T's scratch).
  bool amx = false;
  std::int64_t max_rows;  // the most rows of a query block: kBlockQ, or kBlockQTiles on tiles
  std::int64_t dp = 0;  // D rounded up to 32
  std::int64_t k16_size = 0, v16_size = 0, q16_size = 0, p16_size = 0;
  std::int64_t stage16_size = 0;  // tiles over 8-bit codes: a block's K and V rows in bf16 (in T elements)
  std::int64_t block_lines = 0;   // tiles: the cache lines of a key block's K and V rows (prefetched)

  FusedPlan(const Problem& prob, const simd::KernelTable& table, RowLayout rows = RowLayout::one_head)
      : p(prob), kt(table), gk(table.gemm<T>()), vk(table.vec<T>()), layout(rows) {
    tile_rows = gk.blocking_a_in_place.mr;
    tile_cols = gk.blocking_a_in_place.nr;
    lanes = gk.blocking_a_in_place.lanes;
    dv_computed = round_up(p.Dv, lanes);
    if (tile_cols > kMaxTile || kBlockK % tile_cols != 0) std::abort();  // ISA table invariant
    amx = fused_on_tiles(p);
    max_rows = amx ? kBlockQTiles : layout == RowLayout::stacked ? kBlockRowsStacked : kBlockQ;
    const std::int64_t row_unit = amx ? 16 : tile_rows;
    if (amx) k_keys = std::min(kMaxBlockK, round_up(std::max<std::int64_t>(p.Sk, 1), 32));  // Sk = 0: one empty block
    else k_keys = p.Sk > kBlockK && p.Sk <= kMaxBlockK ? round_up(p.Sk, tile_cols) : kBlockK;
    dv_padded = round_up(p.Dv, tile_cols);
    // Equal blocks of at most max_rows rows, rounded to the tile height: Sq = 128 gives 66 + 62
    // rather than 96 + 32.
    q_blocks = (p.Sq + max_rows - 1) / max_rows;
    q_rows = q_blocks > 0 ? std::min(max_rows, round_up((p.Sq + q_blocks - 1) / q_blocks, row_unit)) : max_rows;
    // A block mask: query blocks inside one row of bs x bs blocks (bs or bs / 2 rows), so that
    // a query block's key panels are hidden or listed as a whole.
    // (Small blocks keep the default: row blocks of a few rows would starve the micro-kernel.)
    if (p.block_mask != nullptr && p.block_size >= 16 && p.block_size <= kBlockQ) q_rows = p.block_size;
    else if (p.block_mask != nullptr && p.block_size % 2 == 0 && p.block_size / 2 >= 16 && p.block_size / 2 <= kBlockQ)
      q_rows = p.block_size / 2;
    // A narrow window (left side bounded): each query block computes its own rows' span plus
    // the window; halving the block trims that span (long with window 512: 560 keys a block
    // instead of 608). Guarded by sparse/native/long-window512.
    if (p.block_mask == nullptr && p.has_window && p.window_left >= 0 && p.window_left <= 8 * k_keys)
      q_rows = std::min(q_rows, round_up(kBlockQ / 2, row_unit));
    q_blocks = q_blocks > 0 ? (p.Sq + q_rows - 1) / q_rows : 0;
    if (layout == RowLayout::stacked) q_rows = max_rows;
    k_blocks = (p.Sk + k_keys - 1) / k_keys;
    k_slots = layout == RowLayout::stacked ? std::min<std::int64_t>(1, k_blocks) : k_blocks;
    const std::int64_t a = kLineElems<T>;
    k_size = round_up(k_slots * p.D * k_keys, a);
    v_size = round_up(k_slots * k_keys * dv_padded, a);
    q_size = round_up(max_rows * p.D, a);
    s_size = round_up(max_rows * k_keys, a);
    o_size = round_up(max_rows * dv_padded, a);
    row_size = round_up(max_rows, a);
    flag_size = round_up(k_slots, a);
    conv_size = std::is_same_v<S, T> && !p.kv_codes() ? 0 : round_up(std::max(tile_cols * p.D, k_keys * p.Dv), a);
    t5_reach = t5_table_reach(p);
    t5_size = p.t5_table != nullptr ? round_up(2 * t5_reach + 1, a) : 0;
    if constexpr (std::is_same_v<S, bfloat16> && std::is_same_v<T, float>) {
      if (amx) {
        dp = round_up(p.D, 32);
        const std::int64_t groups = (max_rows + 31) / 32;
        k16_size = round_up(k_slots * k_keys * dp / 2, a);
        v16_size = round_up(k_slots * k_keys * round_up(p.Dv, 32) / 2, a);
        q16_size = round_up(groups * 32 * dp / 2, a);
        p16_size = round_up(groups * 32 * k_keys / 2, a);
        k_size = v_size = conv_size = 0;  // the f32 panels and the widening buffer are not used
        if (p.kv_codes()) conv_size = round_up(k_keys * std::max(p.D, p.Dv), a);  // dequantized (f32)
        const std::int64_t element = p.kv_codes() ? 1 : 2;
        block_lines = (k_keys * (p.D + p.Dv) * element + 63) / 64;
        // 8-bit codes (rounded to bf16): a block's K and V rows
        if (p.kv_codes()) stage16_size = round_up((k_keys * (p.D + p.Dv) + 1) / 2, a);
      }
    }
  }
  std::size_t scratch_size() const {
    return static_cast<std::size_t>(k_size + v_size + q_size + s_size + o_size + 3 * row_size + flag_size + conv_size +
                                    t5_size + k16_size + v16_size + q16_size + p16_size + stage16_size);
  }
};

}  // namespace
}  // namespace simdattn::detail

// The native backend's fused path (flash attention) on the simd/ micro-kernels.
//
// For each (batch b, head h, block of up to kBlockQ query rows; or, for a few query tokens of
// grouped heads, a group's heads stacked: fused_stacks_heads):
//   Q block, read in place (rows copied only if D is strided)  [br, D]
//   for each key block of k_keys keys (128; up to 256 when that is all of them) that the
//   visibility rule does not hide entirely:
//     S = Q_blk K_blk^T             (in-place-A micro-kernel)   [br, Bc]
//     scale, mask (only where the block is not fully visible), row max m_new
//     P = exp(S - m_new), row sums; O and l rescaled by exp(m_old - m_new) only when m grows
//     O += P V_blk                  (in-place-A micro-kernel)   [br, Dv]
//   out = O / l, with l == 0 (no visible key) giving a zero row.
// The Sq x Sk score matrix is never formed: S is one [br, Bc] block in the thread's scratch.
//
// Both GEMMs run the short, wide in-place-A tile (6 x 64 f32 on AVX-512), so neither Q nor P is
// packed. K^T and V are packed into the thread's scratch a key block at a time, when a query block
// first computes that block (its rows prefetched by the products of the block before, or for a
// kv head's first block by the last products of the head before), and every
// later query block (and every query head of a grouped-query group) of that kv head reuses them.
// The online-softmax step of a block's rows is one call (VectorKernels::softmax_rows). The
// (batch, head, query block) units go to the work plan (attention/native/work.hpp): their keys
// split when there are few of them (each part's rows merged after, in key order), the items
// shared by the number of key blocks each computes (so causal work splits evenly), stolen when a
// thread's share is done (parallel_shares). The keys come from the problem's key source, run by
// run (a paged cache's blocks), into the same packed blocks. Every row is computed the same way
// whatever the thread count or schedule: results are bitwise identical for any count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention/native/fused/plan.hpp"
#include "attention/native/fused/tile_steps.hpp"
#include "attention/native/fused/vector_steps.hpp"
#include "attention/native/fused/worker.hpp"
#include "attention/native/paths.hpp"
#include "attention/native/work.hpp"
#include "core/fp_env.hpp"
#include "core/position_rule.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

template <class T, class S>
void fused(const Problem& p) {
  const bool stacked = fused_stacks_heads(p);
  const FusedPlan<T, S> plan(p, simd::kernels(), stacked ? RowLayout::stacked : RowLayout::one_head);
  WorkPlan& work = WorkPlan::of_this_thread();
  const std::int64_t group = p.H / p.Hkv;
  if (stacked) {
    add_stacked_units(p, plan.q_rows, work);
  } else {
    for (std::int64_t b = 0; b < p.B; ++b) {
      const std::int64_t ql = p.query_len(b);
      for (std::int64_t h = 0; h < p.H; ++h)
        for (std::int64_t i0 = 0; i0 < ql; i0 += plan.q_rows) {
          const std::int64_t i1 = std::min(ql, i0 + plan.q_rows);
          work.add(RowBlock{b, h / group, h, i0, 1, i1 - i0}, unit_keys(p, b, i0, i1));
        }
    }
  }
  work.cut(work.split_keys(plan.k_keys), p.Dv);
  // An item's cost in key blocks (plus one: packing Q and writing O), so that causal work
  // splits evenly.
  const auto cost = [&](const WorkItem& it) {
    const RowBlock& rb = work.units[static_cast<std::size_t>(it.unit)].rows;
    std::int64_t blocks = 1;
    for (std::int64_t jb = it.k0 / plan.k_keys; jb * plan.k_keys < it.k1; ++jb)
      blocks += classify(p, rb.b, rb.i0, rb.i0 + rb.tokens, jb * plan.k_keys, std::min(p.Sk, (jb + 1) * plan.k_keys)) !=
                Cover::hidden;
    return blocks;
  };
  const double flops_per_block = 2.0 * double(plan.q_rows) * double(plan.k_keys) * double(p.D + p.Dv);
  run_plan<T>(
      p, work, flops_per_block,
      [&] { return FusedWorker<T, S>(plan, thread_buffer<T, scratch::NativeAttention>().get(plan.scratch_size())); }, cost);
}

}  // namespace

bool fused_stacks_heads(const Problem& p) {
  return p.H > p.Hkv && p.Sq <= kStackedMaxTokens && !p.scores_modified() && !p.sparse() && !fused_on_tiles(p);
}

Refusal fused_tiles_why_not(const Problem& p) {
  const simd::KernelTable& table = simd::kernels();
  if (p.dtype != DType::bf16) return {"dtype {w} (bf16 only)", dtype_name(p.dtype)};
  if (table.tile_attention.block == nullptr || table.tile_attention.softmax_rows == nullptr ||
      table.tile_attention.softmax_rows_lse == nullptr)
    return {"ISA {w} has no AMX tiles, nor vdpbf16ps at the FMA rate", simd::isa_name(table.isa)};
  return {};
}

void fused_attention(const Problem& p) {
  visit_dtype(p.dtype, [&](auto s) { fused<compute_type<decltype(s)>, decltype(s)>(p); });
}

}  // namespace simdattn::detail

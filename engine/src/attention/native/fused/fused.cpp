// The native backend's fused path (flash attention) on the simd/ micro-kernels.
//
// For each (batch b, head h, block of up to kBlockQ query rows):
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
// The online-softmax step of a block's rows is one call (VectorKernels::softmax_rows). Threads
// own equal shares of the flattened (batch, head, query block) items by the number of key blocks
// each computes (so causal work splits evenly) and steal when theirs is done (parallel_shares).
// Every row is computed the same way whatever the thread count or schedule: results are bitwise
// identical for any count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attention/native/fused/plan.hpp"
#include "attention/native/fused/tile_steps.hpp"
#include "attention/native/fused/vector_steps.hpp"
#include "attention/native/fused/worker.hpp"
#include "attention/native/paths.hpp"
#include "core/fp_env.hpp"
#include "core/position_rule.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

template <class T, class S>
void fused(const Problem& p) {
  const FusedPlan<T, S> plan(p, simd::kernels());
  const std::int64_t items = p.B * p.H * plan.q_blocks;
  if (items == 0) return;

  // Cost of each item in key blocks, prefix-summed: threads take equal shares of the total.
  thread_local std::vector<std::int64_t> prefix;
  prefix.resize(static_cast<std::size_t>(items) + 1);
  prefix[0] = 0;
  for (std::int64_t it = 0; it < items; ++it) {
    const std::int64_t qb = it % plan.q_blocks, b = it / (plan.q_blocks * p.H);
    const std::int64_t i0 = qb * plan.q_rows, i1 = std::min(p.Sq, i0 + plan.q_rows);
    std::int64_t cost = 1;  // packing Q and writing O
    for (std::int64_t jb = 0; jb < plan.k_blocks; ++jb)
      cost += classify(p, b, i0, i1, jb * plan.k_keys, std::min(p.Sk, (jb + 1) * plan.k_keys)) != Cover::hidden;
    prefix[static_cast<std::size_t>(it) + 1] = prefix[static_cast<std::size_t>(it)] + cost;
  }
  const double flops_per_block = 2.0 * double(plan.q_rows) * double(plan.k_keys) * double(p.D + p.Dv);
  const double useful = std::min(double(items), double(prefix.back()) * flops_per_block / kMinFlopsPerThread);
  const auto nt = static_cast<int>(std::max(1.0, std::min<double>(resolve_threads(p.threads), useful)));

  RegionFailure failure;
  parallel_shares(prefix, nt, [&](auto next_run) {
    failure.guard([&] {
      const FlushDenormals ftz;
      FusedWorker<T, S> worker(plan, thread_buffer<T, scratch::NativeAttention>().get(plan.scratch_size()));
      for (auto run = next_run(); run.first < run.second; run = next_run())
        for (std::int64_t it = run.first; it < run.second; ++it) {
          const std::int64_t qb = it % plan.q_blocks, h = (it / plan.q_blocks) % p.H;
          worker.run(it / (plan.q_blocks * p.H), h, qb);
        }
      if (plan.amx) plan.kt.gemm_bf16.amx_done();
    });
  });
  failure.rethrow();
}

}  // namespace

Refusal fused_tiles_why_not(const Problem& p) {
  const simd::KernelTable& table = simd::kernels();
  if (p.dtype != DType::bf16) return {"dtype {w} (bf16 only)", dtype_name(p.dtype)};
  if (table.gemm_bf16.amx_block == nullptr || table.amx_attention.softmax_rows == nullptr)
    return {"ISA {w} has no AMX tiles", simd::isa_name(table.isa)};
  if (p.D > 256) return {"D = {} > 256", p.D};
  return {};
}

void fused_attention(const Problem& p) {
  switch (p.dtype) {
    case DType::f64: fused<double, double>(p); break;
    case DType::bf16: fused<float, bfloat16>(p); break;
    case DType::f16: fused<float, float16>(p); break;
    default: fused<float, float>(p);
  }
}

}  // namespace simdattn::detail

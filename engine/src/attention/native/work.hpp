// The native paths' work plan: units of query rows that share a kv head (RowBlock), each unit's
// keys cut into items when the units are too few to keep a large machine busy (split-KV), the
// items spread over the threads by cost, and each split unit's parts merged in key order
// (core/partial.hpp) by the path's worker. What an item computes depends on the shapes alone,
// never on the thread count: outputs are bitwise identical at any count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/fp_env.hpp"
#include "core/partial.hpp"
#include "core/position_rule.hpp"
#include "core/problem.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {

namespace scratch {
struct SplitParts : ScratchSlot {};  // the calling thread's partial rows of its split units
}  // namespace scratch

// The query rows of one unit of work, all reading kv head hk of batch b: `heads` query heads from
// h0 on, each with `tokens` query rows from i0 on; row r is head h0 + r / tokens, token i0 + r %
// tokens. One head (a prompt's block of rows, the fused path) or a group's heads stacked (a few
// tokens each, the decode paths: every K and V row is read once for the whole group).
struct RowBlock {
  std::int64_t b = 0, hk = 0, h0 = 0, i0 = 0, heads = 1, tokens = 0;
  std::int64_t rows() const { return heads * tokens; }
  std::int64_t head(std::int64_t r) const { return h0 + r / tokens; }
  std::int64_t token(std::int64_t r) const { return i0 + r % tokens; }
};

// The keys rows [i0, i1) of batch b may see by structure (key length, causal, window), within
// [0, L[b]); with sparse patterns (global keys, global queries) all of [0, L[b]).
inline KeyRange unit_keys(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1) {
  const std::int64_t L = p.key_len(b);
  if (p.sparse()) return {0, L};
  const KeyRange r = block_keys_union(p, b, i0, i1);
  const std::int64_t lo = std::clamp<std::int64_t>(r.lo, 0, L);
  return {lo, std::clamp<std::int64_t>(r.hi, lo, L)};
}

struct WorkUnit {
  RowBlock rows;
  KeyRange keys;  // the keys some row may see (by structure), within [0, L[b])
  std::int64_t first_item = 0, items = 0;
};

struct WorkItem {
  std::int64_t unit = 0;
  std::int64_t k0 = 0, k1 = 0;  // keys [k0, k1): a split's (the unit's keys clipped to it), or the unit's
  std::int64_t part = -1;       // offset of its partial rows in the parts buffer; -1: writes the output
};

// Split-KV, from the shapes alone: a problem with fewer than kSplitUnits units (the cores of a
// large socket; a decode step of one 8-kv-head sequence has 8) cuts each unit's keys into parts
// of at least kMinSplitKeys keys (below which the merge and the per-item set-up cost more than
// another thread gains; the paged kernel's measured 512), as many as give about kSplitUnits items.
inline constexpr std::int64_t kSplitUnits = 64;
inline constexpr std::int64_t kMinSplitKeys = 512;

// The calling thread's plan: units, items and the thread's cost prefix, reused from call to call
// (a call allocates nothing once its sizes were seen); the team reaches it by reference.
struct WorkPlan {
  std::vector<WorkUnit> units;
  std::vector<WorkItem> items;
  std::vector<std::int64_t> prefix, merged;
  std::int64_t part_floats = 0;  // the parts buffer's size
  std::int64_t split = 0;        // keys per split (0: none)

  static WorkPlan& of_this_thread() {
    thread_local WorkPlan plan;
    plan.units.clear(), plan.items.clear(), plan.part_floats = 0, plan.split = 0;
    return plan;
  }

  void add(const RowBlock& rows, KeyRange keys) { units.push_back({rows, keys, 0, 0}); }

  // Keys per split for these units (a multiple of granule, the paths' key block), or 0.
  std::int64_t split_keys(std::int64_t granule) const {
    const auto n = static_cast<std::int64_t>(units.size());
    if (n == 0 || n >= kSplitUnits) return 0;
    std::int64_t longest = 0;
    for (const WorkUnit& u : units) longest = std::max(longest, u.keys.hi - u.keys.lo);
    // as many parts as give about kSplitUnits items, each of at least kMinSplitKeys keys (a
    // step over 513 keys is not cut into 512 and 1)
    const std::int64_t parts = std::min((kSplitUnits + n - 1) / n, longest / kMinSplitKeys);
    if (parts < 2) return 0;
    const std::int64_t keys = round_up((longest + parts - 1) / parts, granule);
    return longest > keys ? keys : 0;
  }

  // Each unit's items: one per split its keys touch (at multiples of `split`, absolute key
  // positions), or one; split items get room for their rows' m, l and Dv-wide acc.
  void cut(std::int64_t split_keys_, std::int64_t dv) {
    split = split_keys_;
    items.clear();
    part_floats = 0;
    for (std::size_t i = 0; i < units.size(); ++i) {
      WorkUnit& u = units[i];
      u.first_item = static_cast<std::int64_t>(items.size());
      const std::int64_t lo = u.keys.lo, hi = std::max(u.keys.lo, u.keys.hi);
      const bool cuts = split > 0 && hi > lo && (hi - 1) / split > lo / split;
      if (!cuts) {
        items.push_back({static_cast<std::int64_t>(i), lo, hi, -1});
      } else {
        for (std::int64_t a = lo; a < hi; a = (a / split + 1) * split) {
          items.push_back({static_cast<std::int64_t>(i), a, std::min(hi, (a / split + 1) * split), part_floats});
          part_floats += u.rows.rows() * (dv + 2);
        }
      }
      u.items = static_cast<std::int64_t>(items.size()) - u.first_item;
    }
  }
};

// A few query tokens a sequence (a decode step, a speculative step's drafts, a cascade's forks over
// their shared prefix): per (sequence, kv head), the group's heads stacked into units of at most
// max_rows rows (RowBlock: heads x every token of the sequence), the heads split evenly over as few
// units as hold them (8 heads of 1 token: one unit of 8 rows; MLA's 128 heads of 1 token: one of
// 128; 8 heads of 24 drafted tokens: two of 96), so that each unit reads each K and V row once for
// all its rows. tokens <= max_rows.
inline void add_stacked_units(const Problem& p, std::int64_t max_rows, WorkPlan& work) {
  const std::int64_t group = p.H / p.Hkv;
  for (std::int64_t b = 0; b < p.B; ++b) {
    const std::int64_t tokens = p.query_len(b);
    if (tokens == 0) continue;
    const std::int64_t fit = std::max<std::int64_t>(1, max_rows / tokens);  // heads a unit holds
    const std::int64_t units = (group + fit - 1) / fit, heads = (group + units - 1) / units;
    const KeyRange keys = unit_keys(p, b, 0, tokens);
    for (std::int64_t hk = 0; hk < p.Hkv; ++hk)
      for (std::int64_t c = 0; c < group; c += heads)
        work.add(RowBlock{b, hk, hk * group + c, 0, std::min(heads, group - c), tokens}, keys);
  }
}

// Runs a plan's items on up to p.threads threads, shared by cost (cost(item): its work in units
// of flops_per_cost flops), each thread's worker (make_worker()) running its items in order with
// worker.run(unit, item, parts) and then worker.end(); then each split unit's parts merged by
// worker.finish(unit, parts) (T: the parts' type).
template <class T, class MakeWorker, class Cost>
void run_plan(const Problem& p, WorkPlan& plan, double flops_per_cost, MakeWorker&& make_worker, Cost&& cost) {
  if (plan.items.empty()) return;
  T* parts = plan.part_floats > 0
                 ? thread_buffer<T, scratch::SplitParts>().get(static_cast<std::size_t>(plan.part_floats))
                 : nullptr;
  std::vector<std::int64_t>& prefix = plan.prefix;
  prefix.assign(plan.items.size() + 1, 0);
  for (std::size_t i = 0; i < plan.items.size(); ++i) prefix[i + 1] = prefix[i] + cost(plan.items[i]);
  const double flops = double(prefix.back()) * flops_per_cost;
  const auto nt = static_cast<int>(std::clamp<double>(
      flops / kMinFlopsPerThread, 1.0, std::min<double>(resolve_threads(p.threads), double(plan.items.size()))));
  RegionFailure failure;
  parallel_shares(prefix, nt, [&](auto next_run) {
    failure.guard([&] {
      const FlushDenormals ftz;
      auto worker = make_worker();
      for (auto run = next_run(); run.first < run.second; run = next_run())
        for (std::int64_t it = run.first; it < run.second; ++it) {
          const WorkItem& item = plan.items[static_cast<std::size_t>(it)];
          worker.run(plan.units[static_cast<std::size_t>(item.unit)], item, parts);
        }
      worker.end();
    });
  });
  failure.rethrow();
  // split units: their parts merged in key order
  plan.merged.clear();
  for (std::size_t u = 0; u < plan.units.size(); ++u)
    if (plan.units[u].items > 1) plan.merged.push_back(static_cast<std::int64_t>(u));
  if (plan.merged.empty()) return;
  parallel_for(static_cast<std::int64_t>(plan.merged.size()), nt, 1, [&](std::int64_t u0, std::int64_t u1) {
    failure.guard([&] {
      const FlushDenormals ftz;
      auto worker = make_worker();
      thread_local std::vector<PartRows<T>> rows;
      for (std::int64_t x = u0; x < u1; ++x) {
        const WorkUnit& u = plan.units[static_cast<std::size_t>(plan.merged[static_cast<std::size_t>(x)])];
        const std::int64_t n = u.rows.rows(), dv = p.Dv;
        rows.clear();
        for (std::int64_t it = u.first_item; it < u.first_item + u.items; ++it) {
          const T* base = parts + plan.items[static_cast<std::size_t>(it)].part;
          rows.push_back({base, base + n, base + 2 * n, dv});
        }
        worker.finish(u, std::span<const PartRows<T>>(rows));
      }
      worker.end();
    });
  });
  failure.rethrow();
}

// A part's rows written by a worker: m, l and the rows' acc (Dv values each, from acc rows ld apart).
template <class T>
void store_part(T* part, std::int64_t rows, std::int64_t dv, const T* m, const T* l, const T* acc, std::int64_t ld) {
  std::copy(m, m + rows, part);
  std::copy(l, l + rows, part + rows);
  for (std::int64_t r = 0; r < rows; ++r) std::copy(acc + r * ld, acc + r * ld + dv, part + 2 * rows + r * dv);
}

}  // namespace simdattn::detail

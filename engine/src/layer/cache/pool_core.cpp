// A pool layer's attention core: one problem over the pool's blocks, or the cascade for the
// step's sequences that share a prefix (pool_core.hpp).
#include "layer/cache/pool_core.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention/run.hpp"
#include "attention/states.hpp"
#include "core/problem.hpp"
#include "core/validate/validate.hpp"
#include "runtime/verbose.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

namespace scratch {
struct PoolCascade : ScratchSlot {};  // a cascade's gathered q rows, the prefix's out and lse, the suffix's lse
}  // namespace scratch

namespace {


// A problem over the pool's blocks and the storage its pointers name (kept alive with it).
struct PoolProblem {
  Problem q;
  std::vector<std::int64_t> lens, starts;
  std::vector<std::int32_t> table;
  std::vector<std::uint8_t> tree;
};

// K, V (and 8-bit scales) of the store; the core's dtype; the scale, softcap and threads of a.
void set_store(Problem& q, const KvStore& store, DType core, std::int64_t H, const AttentionOptions& a) {
  const std::int64_t hd = store.head_dim, bs = store.block_size;
  q.dtype = core;
  q.kv_dtype = store.dtype;
  q.H = H, q.Hkv = store.kv_heads, q.D = hd, q.Dv = store.v_dim;
  q.k = store.k, q.v = store.v;
  q.k_strides = q.v_strides = {store.block_stride, bs * hd, hd, 1};  // block, kv head, slot, d
  if (is_kv_code(store.dtype)) {
    q.k_scale = store.k_scale, q.v_scale = store.v_scale;
    for (std::int64_t* st : {q.k_scale_strides, q.v_scale_strides}) st[0] = store.scale_stride, st[1] = bs, st[2] = 1;
  }
  set_scale_threads(q, a);
  if (a.softcap) q.softcap = *a.softcap;
}

// Each sequence's tokens over its keys past its first skip[i] blocks (empty: none skipped), with
// a's window, ALiBi and sinks; lse (rows x H, f32) written when given.
void build_steps(PoolProblem& pp, const KvStore& store, std::span<const StoreSeq> seqs, std::span<const std::int64_t> skip,
                 DType core, std::int64_t H, const void* qd, std::int64_t ldq, void* od, std::int64_t ldo,
                 const AttentionOptions& a, float* lse) {
  const std::int64_t hd = store.head_dim, bs = store.block_size;
  pp.q = Problem{};
  Problem& q = pp.q;
  set_store(q, store, core, H, a);
  q.B = static_cast<std::int64_t>(seqs.size());
  pp.lens.clear(), pp.starts.assign(1, 0);
  std::int64_t max_blocks = 1;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const StoreSeq& s = seqs[i];
    const std::int64_t skipped = skip.empty() ? 0 : skip[i] * bs;
    pp.lens.push_back(s.start + s.tokens - skipped);
    max_blocks = std::max(max_blocks, (pp.lens.back() + bs - 1) / bs);
    pp.starts.push_back(pp.starts.back() + s.tokens);
    q.Sq = std::max(q.Sq, s.tokens), q.Sk = std::max(q.Sk, pp.lens.back());
  }
  pp.table.assign(seqs.size() * static_cast<std::size_t>(max_blocks), 0);
  for (std::size_t i = 0; i < seqs.size(); ++i)
    std::copy_n(seqs[i].blocks->begin() + (skip.empty() ? 0 : skip[i]), (pp.lens[i] + bs - 1) / bs,
                pp.table.begin() + static_cast<std::ptrdiff_t>(i) * max_blocks);
  q.key_lengths = pp.lens.data();
  q.query_start = pp.starts.data();
  q.kv_blocks = {pp.table.data(), max_blocks, bs, store.blocks};
  q.q = qd, q.q_strides = {0, hd, ldq, 1};
  q.o = od, q.o_strides = {0, store.v_dim, ldo, 1};
  q.causal = Causal::bottom_right;  // a step's tokens see the keys before them and themselves
  if (std::any_of(seqs.begin(), seqs.end(), [](const StoreSeq& s) { return s.tree_mask != nullptr; })) {
    // draft trees: one tree mask over the steps (a step without one: its causal matrix)
    pp.tree.clear();
    q.tree_starts.clear();
    for (const StoreSeq& s : seqs) {
      q.tree_starts.push_back(static_cast<std::int64_t>(pp.tree.size()));
      for (std::int64_t j = 0; j < s.tokens; ++j)
        for (std::int64_t c = 0; c < s.tokens; ++c)
          pp.tree.push_back(s.tree_mask != nullptr ? s.tree_mask[j * s.tokens + c] != 0 : c <= j);
    }
    q.tree_mask = pp.tree.data();
    q.mask_kind = MaskKind::boolean;
    q.causal = Causal::none;
  }
  set_window(q, a.window);
  set_softcap_alibi_sinks(q, a, Span{});
  if (lse != nullptr) {
    q.lse = lse;
    q.lse_strides[0] = 0, q.lse_strides[1] = 1, q.lse_strides[2] = H;
  }
}

// Each group's members' tokens (rows of qg, H * head_dim apart, group after group, member after
// member) over the group's shared blocks, every key seen (the members' context), into og and lse.
void build_prefixes(PoolProblem& pp, const KvStore& store, std::span<const StoreSeq> seqs,
                    std::span<const SharedPrefix> groups, DType core, std::int64_t H, const void* qg, void* og,
                    float* lse, const AttentionOptions& a) {
  const std::int64_t hd = store.head_dim, bs = store.block_size, ld = H * hd, dv = store.v_dim, ldo = H * dv;
  pp.q = Problem{};
  Problem& q = pp.q;
  set_store(q, store, core, H, a);
  q.B = static_cast<std::int64_t>(groups.size());
  pp.lens.clear(), pp.starts.assign(1, 0);
  std::int64_t max_blocks = 1;
  for (const SharedPrefix& g : groups) {
    std::int64_t tokens = 0;
    for (const std::size_t i : g.members) tokens += seqs[i].tokens;
    pp.lens.push_back(g.blocks * bs);
    pp.starts.push_back(pp.starts.back() + tokens);
    max_blocks = std::max(max_blocks, g.blocks);
    q.Sq = std::max(q.Sq, tokens), q.Sk = std::max(q.Sk, g.blocks * bs);
  }
  pp.table.assign(groups.size() * static_cast<std::size_t>(max_blocks), 0);
  for (std::size_t g = 0; g < groups.size(); ++g)
    std::copy_n(seqs[groups[g].members[0]].blocks->begin(), groups[g].blocks,
                pp.table.begin() + static_cast<std::ptrdiff_t>(g) * max_blocks);
  q.key_lengths = pp.lens.data();
  q.query_start = pp.starts.data();
  q.kv_blocks = {pp.table.data(), max_blocks, bs, store.blocks};
  q.q = qg, q.q_strides = {0, hd, ld, 1};
  q.o = og, q.o_strides = {0, dv, ldo, 1};
  q.causal = Causal::none;
  q.lse = lse;
  q.lse_strides[0] = 0, q.lse_strides[1] = 1, q.lse_strides[2] = H;
}

std::string cascade_item(std::size_t members, std::int64_t keys) {
  return std::to_string(members) + "x" + std::to_string(keys);
}

}  // namespace

namespace {
std::atomic<int> g_cascade_override{-1};  // -1: the environment's mode, else a CascadeMode
std::atomic<std::uint64_t> g_cascades{0};
}  // namespace

std::uint64_t cascades_run() noexcept { return g_cascades.load(std::memory_order_relaxed); }

CascadeMode cascade_mode() {
  const int forced = g_cascade_override.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<CascadeMode>(forced);
  static const std::string value = [] {
    const char* v = std::getenv("SIMDATTN_CASCADE");
    return std::string(v == nullptr ? "" : v);
  }();
  if (value.empty() || value == "auto") return CascadeMode::automatic;
  if (value == "never") return CascadeMode::never;
  if (value == "always") return CascadeMode::always;
  throw Error("SIMDATTN_CASCADE", "expected auto, never or always, got '" + value + "'");
}

void set_cascade_mode(std::optional<CascadeMode> mode) noexcept {
  g_cascade_override.store(mode ? static_cast<int>(*mode) : -1, std::memory_order_relaxed);
}

bool cascade_pays(std::int64_t members, std::int64_t shared_keys, std::int64_t tokens, std::int64_t key_bytes) {
  if (members < 2 || tokens > shared_keys) return false;
  if (cascade_mode() == CascadeMode::always) return true;
  return members >= 2 && shared_keys >= kCascadeMinKeys && tokens <= kCascadeMaxTokens * members &&
         tokens <= shared_keys && members * shared_keys * key_bytes >= kCascadeMinBytes;
}

std::vector<SharedPrefix> shared_prefixes(const KvStore& store, std::span<const StoreSeq> seqs, const AttentionOptions& a) {
  std::vector<SharedPrefix> groups;
  if (a.backend != Backend::native || a.window || !a.alibi_slopes.empty() || cascade_mode() == CascadeMode::never)
    return groups;
  const std::int64_t block_size = store.block_size;
  // a key's K and V rows over the kv heads (and 8-bit rows' scales)
  const std::int64_t key_bytes =
      store.kv_heads * 2 * (store.head_dim * static_cast<std::int64_t>(dtype_size(store.dtype)) + (is_kv_code(store.dtype) ? 4 : 0));
  std::vector<bool> taken(seqs.size(), false);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    if (taken[i] || seqs[i].tokens == 0 || seqs[i].start < block_size) continue;
    const std::vector<std::int32_t>& first = *seqs[i].blocks;
    SharedPrefix g;
    g.members.push_back(i);
    g.blocks = seqs[i].start / block_size;
    std::int64_t tokens = seqs[i].tokens;
    for (std::size_t j = i + 1; j < seqs.size(); ++j) {
      if (taken[j] || seqs[j].tokens == 0 || seqs[j].start < block_size || (*seqs[j].blocks)[0] != first[0]) continue;
      const std::vector<std::int32_t>& other = *seqs[j].blocks;
      std::int64_t same = 1;
      const std::int64_t most = std::min(g.blocks, seqs[j].start / block_size);
      while (same < most && other[static_cast<std::size_t>(same)] == first[static_cast<std::size_t>(same)]) ++same;
      g.blocks = same;
      g.members.push_back(j);
      tokens += seqs[j].tokens;
    }
    if (!cascade_pays(static_cast<std::int64_t>(g.members.size()), g.blocks * block_size, tokens, key_bytes)) continue;
    for (const std::size_t j : g.members) taken[j] = true;
    groups.push_back(std::move(g));
  }
  return groups;
}

void pool_attention(const KvStore& store, std::span<const StoreSeq> seqs, DType core, std::int64_t H, const void* qd,
                    std::int64_t ldq, void* od, std::int64_t ldo, const AttentionOptions& a) {
  thread_local PoolProblem steps, prefixes;
  const std::vector<SharedPrefix> groups = shared_prefixes(store, seqs, a);
  if (groups.empty()) {
    build_steps(steps, store, seqs, {}, core, H, qd, ldq, od, ldo, a, nullptr);
    return run_attention("attention_paged", steps.q, a.backend);
  }
  const std::int64_t hd = store.head_dim, ld = H * hd, dv = store.v_dim, ldv = H * dv;
  const std::int64_t cs = static_cast<std::int64_t>(dtype_size(core));
  std::int64_t rows = 0, shared_rows = 0;
  for (const StoreSeq& s : seqs) rows += s.tokens;
  std::vector<std::int64_t> skip(seqs.size(), 0), first_row(seqs.size(), 0);
  for (std::size_t i = 0, r = 0; i < seqs.size(); r += static_cast<std::size_t>(seqs[i].tokens), ++i)
    first_row[i] = static_cast<std::int64_t>(r);
  for (const SharedPrefix& g : groups)
    for (const std::size_t i : g.members) skip[i] = g.blocks, shared_rows += seqs[i].tokens;
  // scratch: the members' q rows gathered, the prefix problem's out rows, its lse, the suffix's lse
  const auto line = kLineElems<std::byte>;
  const std::int64_t q_bytes = round_up(shared_rows * ld * cs, line), o_bytes = round_up(shared_rows * ldv * cs, line);
  const std::int64_t lse_bytes = round_up(shared_rows * H * 4, line);
  std::byte* buf = thread_buffer<std::byte, scratch::PoolCascade>().get(
      static_cast<std::size_t>(q_bytes + o_bytes + lse_bytes + round_up(rows * H * 4, line)));
  std::byte* qg = buf;
  std::byte* og = qg + q_bytes;
  auto* lse_prefix = reinterpret_cast<float*>(og + o_bytes);
  auto* lse_steps = reinterpret_cast<float*>(og + o_bytes + lse_bytes);
  std::int64_t at = 0;
  for (const SharedPrefix& g : groups)
    for (const std::size_t i : g.members)
      for (std::int64_t t = 0; t < seqs[i].tokens; ++t, ++at)
        std::memcpy(qg + at * ld * cs, static_cast<const std::byte*>(qd) + (first_row[i] + t) * ldq * cs,
                    static_cast<std::size_t>(ld * cs));
  build_prefixes(prefixes, store, seqs, groups, core, H, qg, og, lse_prefix, a);
  run_attention("attention_paged", prefixes.q, a.backend);
  build_steps(steps, store, seqs, skip, core, H, qd, ldq, od, ldo, a, lse_steps);
  run_attention("attention_paged", steps.q, a.backend);
  // each member's rows: the prefix's state merged into its own, in place
  at = 0;
  for (const SharedPrefix& g : groups)
    for (const std::size_t i : g.members) {
      const std::int64_t T = seqs[i].tokens, r = first_row[i];
      const ConstTensorView out_a(og + at * ldv * cs, core, {1, T, H, dv}, {0, ldv, dv, 1});
      const ConstTensorView lse_a(lse_prefix + at * H, DType::f32, {1, T, H, 1}, {0, H, 1, 1});
      const TensorView out(static_cast<std::byte*>(od) + r * ldo * cs, core, {1, T, H, dv}, {0, ldo, dv, 1});
      const TensorView lse(lse_steps + r * H, DType::f32, {1, T, H, 1}, {0, H, 1, 1});
      merge_states_into(out_a, lse_a, out, lse, out, lse);
      at += T;
    }
  g_cascades.fetch_add(groups.size(), std::memory_order_relaxed);
  if (verbose_on())
    if (VerboseCall* call = VerboseCall::current())
      for (const SharedPrefix& g : groups) call->add_cascade(cascade_item(g.members.size(), g.blocks * store.block_size));
}

}  // namespace simdattn::detail

// A pool layer's attention core (kv_store.hpp's store_attention over a paged store): one problem
// over the pool's blocks, or the cascade where sequences of the step share leading blocks.
//
// Cascade (docs/serving.md, "Shared prefixes"): forks of one prompt hold the same blocks at the
// start of their tables (the pool shares them, copy-on-write). Where a group of the step's
// sequences shares P whole blocks that every member's new tokens see in full (P * block_size <=
// each member's keys before the step), the group's new tokens attend to those P * block_size keys
// as one query block (one problem batch: the keys read once for the whole group), each sequence
// attends to its own keys past them (its table from block P on), and the two attention states
// (output and lse) merge into the sequence's output by merge_attention_states' rule. The sum is
// the same as over all keys (within rounding: f32 states merged in double and rounded once; a
// 16-bit core rounds each part to its dtype first). Sinks join the second problem only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "layer/cache/kv_store.hpp"

namespace simdattn::detail {

// The sequences of a step (indices into its seqs) that share their first `blocks` blocks.
struct SharedPrefix {
  std::vector<std::size_t> members;
  std::int64_t blocks = 0;
};

// The step's groups that take the cascade: the sequences with new tokens grouped by their first
// block; a group's prefix is the blocks every member's table holds alike, up to the whole blocks
// before each member's new tokens; kept where cascade_pays. None when the options make the keys'
// scores depend on the query's position (window, ALiBi) or the backend is not native.
std::vector<SharedPrefix> shared_prefixes(const KvStore& store, std::span<const StoreSeq> seqs, const AttentionOptions& a);

// When the cascade pays, measured (docs/serving.md, "Shared prefixes": prefix call + suffix call +
// merge against one call, 2 threads, 32 heads, 8 kv heads, d 128, blocks of 16; f32, bf16 and
// int8 pools; 2-32 sequences, 64-2048 shared keys, 1-64 new tokens each): reading the shared keys
// once saves their bytes, and the step gains where it streams them, not where it computes. So:
// two sequences or more, at most kCascadeMaxTokens new tokens a sequence on average (with 16 the
// separate steps are compute-bound: 0.83-1.16x), kCascadeMinKeys shared keys or more, and the
// shared keys' rows read by the separate steps (members x shared_keys x key_bytes, a key's K and
// V rows over the kv heads) kCascadeMinBytes or more (below, 0.68-1.05x in bf16 and int8, where
// the decode paths' reads come from cache). The group's tokens are at most its shared keys.
// Every bound but members >= 2 and tokens <= shared keys dropped under CascadeMode::always.
inline constexpr std::int64_t kCascadeMaxTokens = 4, kCascadeMinKeys = 256, kCascadeMinBytes = std::int64_t{16} << 20;
bool cascade_pays(std::int64_t members, std::int64_t shared_keys, std::int64_t tokens, std::int64_t key_bytes);

// SIMDATTN_CASCADE (read once): auto (unset or empty: cascade_pays decides), never, or always
// (every group of two sequences or more that shares a whole block: to measure and test the
// cascade); another value is Error("SIMDATTN_CASCADE") from forward_pool. set_cascade_mode
// overrides it for the process (tests; nullopt: the environment's again).
enum class CascadeMode { automatic, never, always };
CascadeMode cascade_mode();
void set_cascade_mode(std::optional<CascadeMode> mode) noexcept;
// The groups that took the cascade since the process began (the serving soak's count).
std::uint64_t cascades_run() noexcept;

// The pool's attention core: each sequence's tokens (rows of q at qd, ldq apart, in the core's
// dtype, one sequence after another) over its keys (start + tokens, bottom-right aligned, or its
// tree mask) into its rows of o (od, ldo apart), varlen, with options a; the cascade for the
// groups shared_prefixes finds. Verbose mode's line names each cascade (cascade=).
void pool_attention(const KvStore& store, std::span<const StoreSeq> seqs, DType core, std::int64_t H, const void* qd,
                    std::int64_t ldq, void* od, std::int64_t ldo, const AttentionOptions& a);

}  // namespace simdattn::detail

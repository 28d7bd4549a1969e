// The native backend: its paths as a table, in the order they are tried. attention_native runs
// the first path whose why_not says nothing against the problem; the last (fused) takes every
// problem. The table is what `simdattn info` lists, and choose_native_path says which path a
// problem takes and why each one before it did not.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"

namespace simdattn::detail {

// Why a path does not take a problem: a message with its numbers, formatted only when asked, so
// the hot path tests it without building a string. Empty (format null): the path applies.
struct Refusal {
  constexpr Refusal() = default;
  constexpr Refusal(const char* f, std::int64_t a = 0, std::int64_t b = 0) : format(f), numbers{a, b} {}
  constexpr Refusal(const char* f, std::string_view w) : format(f), word(w) {}
  const char* format = nullptr;  // "{}" stands for the next of `numbers`, "{w}" for `word`
  std::int64_t numbers[2] = {0, 0};
  std::string_view word;
  explicit operator bool() const noexcept { return format != nullptr; }
  std::string text() const;  // e.g. "16 query rows per kv head > 8"
};

struct NativePath {
  std::string_view name;                 // e.g. "decode", "fused.tiles"
  std::string_view what;                 // what it is for, one line
  Refusal (*why_not)(const Problem& p);  // empty: the path takes p
  void (*run)(const Problem& p);
};

// Every path, in the order attention_native tries them.
std::span<const NativePath> native_paths() noexcept;

// The path attention_native runs for p, and each path tried before it with its reason.
struct NativeChoice {
  const NativePath* path = nullptr;
  std::vector<std::pair<const NativePath*, Refusal>> passed_over;
};
NativeChoice choose_native_path(const Problem& p);

// Whether the fused path takes a group's heads stacked (work.hpp's add_stacked_units) rather than
// one head's rows a block: a few query tokens a sequence (up to fused/plan.hpp's
// kStackedMaxTokens, 32) in grouped-query attention, on the vector unit, with no score modifier or
// sparse pattern (its worker applies those to one head's rows).
bool fused_stacks_heads(const Problem& p);

// With varlen queries (attention_paged's, the KV pool's) whose sequences have both a few query
// tokens and more (decode steps beside prompt chunks), attention_native runs each run of
// neighbouring sequences of one kind as a problem of its own, on its own path: the end of the run
// that starts at sequence b0 (p.B for every other problem), and sequences [b0, b1) as a problem.
std::int64_t native_part_end(const Problem& p, std::int64_t b0);
Problem batches_of(const Problem& p, std::int64_t b0, std::int64_t b1);

}  // namespace simdattn::detail

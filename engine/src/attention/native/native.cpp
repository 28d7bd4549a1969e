// The native backend: its path table (native.hpp) and the entry point that runs the first path
// taking a validated problem.
#include "attention/native/native.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "attention/native/paths.hpp"
#include "core/backends.hpp"

namespace simdattn::detail {
namespace {

Refusal takes_all(const Problem&) { return {}; }

// In order: the decode paths first (up to kDecodeMaxTokens query tokens, bound by reading K and
// V; the 8-bit one after the others, which refuse 8-bit K/V), then the tile path before the
// short-key one (its tile blocks take sdcross's 77 keys too), the fused path last (every
// problem). Every path but decode.widened and short_keys reads every key source (dense, paged,
// 8-bit codes); those two refuse a paged one (needs_dense_keys).
constexpr std::array<NativePath, 7> kPaths{{
    {"decode16", "up to 16 query tokens (a decode step), dense or paged: a kv head's query rows as one matrix, bf16/f16 K and V rows read once as they are",
     &decode16_why_not, &decode16_attention},
    {"decode.widened", "decode in bf16/f16 with dense K or V strided along D, on dense f32 copies",
     &widened_why_not, &widened_attention},
    {"decode", "up to 16 query tokens (a decode step), dense or paged: a kv head's query rows as one matrix, f32/f64 K and V rows read once",
     &decode_why_not, &decode_attention},
    {"decode8", "up to 16 query tokens (a decode step), dense or paged: a kv head's query rows as one matrix, 8-bit K and V codes read once (scales per key)",
     &decode8_why_not, &decode8_attention},
    {"fused.tiles", "flash attention on AMX tiles, or their layouts on vdpbf16ps (bf16), dense or paged", &fused_tiles_why_not, &fused_attention},
    {"short_keys", "up to 96 dense keys, no mask or causal: queries on the vector lanes", &short_keys_why_not,
     &short_keys_attention},
    {"fused", "flash attention over key blocks, dense or paged: every other problem", &takes_all, &fused_attention},
}};

}  // namespace

std::string Refusal::text() const {
  std::string s;
  if (format == nullptr) return s;
  std::size_t n = 0;
  for (const char* c = format; *c != '\0'; ++c) {
    if (c[0] == '{' && c[1] == '}') {
      s += std::to_string(numbers[n < 2 ? n++ : 1]);
      ++c;
    } else if (c[0] == '{' && c[1] == 'w' && c[2] == '}') {
      s += word;
      c += 2;
    } else {
      s += *c;
    }
  }
  return s;
}

std::span<const NativePath> native_paths() noexcept { return kPaths; }

NativeChoice choose_native_path(const Problem& p) {
  NativeChoice choice;
  for (const NativePath& path : kPaths) {
    const Refusal r = path.why_not(p);
    if (!r) {
      choice.path = &path;
      break;
    }
    choice.passed_over.emplace_back(&path, r);
  }
  return choice;
}

std::int64_t native_part_end(const Problem& p, std::int64_t b0) {
  if (p.query_start == nullptr) return p.B;
  const auto few = [&](std::int64_t b) { return p.query_len(b) <= kDecodeMaxTokens; };
  std::int64_t b1 = b0 + 1;
  while (b1 < p.B && few(b1) == few(b0)) ++b1;
  return b1;
}

Problem batches_of(const Problem& p, std::int64_t b0, std::int64_t b1) {
  Problem s = p;
  s.B = b1 - b0;
  // q, out (and lse) rows are numbered by query_start, whose entries stay the call's
  s.query_start = p.query_start + b0;
  if (p.key_lengths != nullptr) s.key_lengths = p.key_lengths + b0;
  if (p.query_offsets != nullptr) s.query_offsets = p.query_offsets + b0;
  if (p.tree_mask != nullptr) s.tree_starts.assign(p.tree_starts.begin() + b0, p.tree_starts.begin() + b1);
  if (p.paged()) s.kv_blocks.table = p.kv_blocks.table + b0 * p.kv_blocks.table_stride;
  else s.q = nullptr, s.k = s.v = nullptr, s.o = nullptr;  // never: dense keys come with whole query blocks
  s.Sq = s.Sk = 0;
  for (std::int64_t b = 0; b < s.B; ++b) s.Sq = std::max(s.Sq, s.query_len(b)), s.Sk = std::max(s.Sk, s.key_len(b));
  return s;
}

void attention_native(const Problem& p) {
  for (std::int64_t b0 = 0, b1 = 0; b0 < p.B; b0 = b1) {
    b1 = native_part_end(p, b0);
    const Problem part = b0 == 0 && b1 == p.B ? p : batches_of(p, b0, b1);
    for (const NativePath& path : kPaths)
      if (!path.why_not(part)) {
        path.run(part);
        break;
      }
  }
}

}  // namespace simdattn::detail

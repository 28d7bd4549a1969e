// Verbose mode's fields for attention() and attention_paged() (verbose.hpp): one problem, one way.
#include "attention/verbose.hpp"

#include <cstdio>

#include "attention/native/native.hpp"

namespace simdattn::detail {
namespace {

void add(std::string& list, const std::string& item) {
  if (!list.empty()) list += ',';
  list += item;
}

// path= and not=: the backend's name, or on native the path table's choice, each path passed
// over as name:reason.
void add_path(std::string& names, std::string_view name) {
  if (!names.empty()) names.push_back('+');
  names.append(name);
}

// A problem run in parts (native_part_end: decode steps beside prompt chunks) names each part's
// path, joined by '+', and the first part's passed-over paths.
void choose_path(VerboseCall& call, Backend backend, const Problem& p) {
  if (backend != Backend::native) return call.take_path(backend_name(backend), "");
  std::string names, declined;
  for (std::int64_t b0 = 0, b1 = 0; b0 < p.B || b0 == 0; b0 = b1) {
    b1 = p.B == 0 ? 1 : native_part_end(p, b0);
    const NativeChoice choice = choose_native_path(b0 == 0 && b1 >= p.B ? p : batches_of(p, b0, b1));
    if (b0 == 0)
      for (const auto& [path, refusal] : choice.passed_over)
        add(declined, std::string(path->name) + ":" + verbose_token(refusal.text()));
    add_path(names, choice.path != nullptr ? choice.path->name : std::string_view("none"));
  }
  call.take_path(names, declined);
}

}  // namespace

std::string verbose_number(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", x);
  return s;
}

void describe_attention(VerboseCall& call, const Problem& p, Backend backend) {
  call.backend = backend_name(backend);
  choose_path(call, backend, p);
  call.dtype = dtype_name(p.dtype);
  call.kv_dtype = dtype_name(p.kv_dtype);
  if (p.paged()) {  // attention_paged: its tokens, its cache and its sequences
    const std::int64_t total_q = p.query_start != nullptr ? p.query_start[p.B] : p.B;
    call.shape("q", verbose_shape({total_q, p.H, p.D}));
    call.shape("kv_cache", verbose_shape({p.kv_blocks.blocks, p.kv_blocks.block_size, p.Hkv, p.D}));
    call.shape("seqs", std::to_string(p.B));
  } else {
    call.shape("q", verbose_shape({p.B, p.H, p.Sq, p.D}));
    call.shape("k", verbose_shape({p.B, p.Hkv, p.Sk, p.D}));
    call.shape("v", verbose_shape({p.B, p.Hkv, p.Sk, p.Dv}));
  }
  std::string& o = call.opts;
  if (p.causal != Causal::none) add(o, "causal:" + std::string(causal_name(p.causal)));
  if (p.tree_mask != nullptr) add(o, "tree_mask");
  else if (p.mask_kind != MaskKind::none) add(o, "mask:" + std::string(dtype_name(p.mask_dtype)));
  if (p.key_lengths != nullptr && !p.paged()) add(o, "key_lengths");
  if (p.query_offsets != nullptr) add(o, "query_offsets");
  if (p.has_window) add(o, "window:" + std::to_string(p.window_left) + ":" + std::to_string(p.window_right));
  if (p.global_tokens > 0) add(o, "global:" + std::to_string(p.global_tokens));
  if (p.block_mask != nullptr) add(o, "block_mask:" + std::to_string(p.block_size));
  add(o, "scale:" + verbose_number(p.scale));
  if (p.softcap > 0.0) add(o, "softcap:" + verbose_number(p.softcap));
  if (p.alibi != nullptr) add(o, "alibi");
  if (p.sinks != nullptr) add(o, "sinks");
  if (p.t5_table != nullptr) add(o, "t5_bias:" + std::to_string(p.t5_buckets));
  if (p.lse != nullptr) add(o, "lse");
  if (p.scores != nullptr) add(o, "scores:" + std::string(score_stage_name(p.scores_stage)));
}

}  // namespace simdattn::detail

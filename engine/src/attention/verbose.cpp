// Verbose mode's fields for attention() and attention_paged() (verbose.hpp).
#include "attention/verbose.hpp"

#include <cstdio>

#include "attention/native/native.hpp"

namespace simdattn::detail {
namespace {

void add(std::string& list, const std::string& item) {
  if (!list.empty()) list += ',';
  list += item;
}

std::string window(std::int64_t left, std::int64_t right) {
  return "window:" + std::to_string(left) + ":" + std::to_string(right);
}

// The options both calls share, in short form.
void shared_options(std::string& o, double scale, double softcap, const float* alibi, const float* sinks) {
  add(o, "scale:" + verbose_number(scale));
  if (softcap > 0.0) add(o, "softcap:" + verbose_number(softcap));
  if (alibi != nullptr) add(o, "alibi");
  if (sinks != nullptr) add(o, "sinks");
}

// path= and not=: the backend's name, or on native the path table's choice, each path passed
// over as name:reason.
void choose_path(VerboseCall& call, Backend backend, const Problem& p) {
  if (backend != Backend::native) return call.take_path(backend_name(backend), "");
  const NativeChoice choice = choose_native_path(p);
  std::string declined;
  for (const auto& [path, refusal] : choice.passed_over)
    add(declined, std::string(path->name) + ":" + verbose_token(refusal.text()));
  call.take_path(choice.path != nullptr ? choice.path->name : "none", declined);
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
  call.shape("q", verbose_shape({p.B, p.H, p.Sq, p.D}));
  call.shape("k", verbose_shape({p.B, p.Hkv, p.Sk, p.D}));
  call.shape("v", verbose_shape({p.B, p.Hkv, p.Sk, p.Dv}));
  std::string& o = call.opts;
  if (p.causal != Causal::none) add(o, "causal:" + std::string(causal_name(p.causal)));
  if (p.mask_kind != MaskKind::none) add(o, "mask:" + std::string(dtype_name(p.mask_dtype)));
  if (p.key_lengths != nullptr) add(o, "key_lengths");
  if (p.query_offsets != nullptr) add(o, "query_offsets");
  if (p.has_window) add(o, window(p.window_left, p.window_right));
  if (p.global_tokens > 0) add(o, "global:" + std::to_string(p.global_tokens));
  if (p.block_mask != nullptr) add(o, "block_mask:" + std::to_string(p.block_size));
  shared_options(o, p.scale, p.softcap, p.alibi, p.sinks);
  if (p.t5_table != nullptr) add(o, "t5_bias:" + std::to_string(p.t5_buckets));
  if (p.lse != nullptr) add(o, "lse");
  if (p.scores != nullptr) add(o, "scores:" + std::string(score_stage_name(p.scores_stage)));
}

void describe_paged(VerboseCall& call, const PagedProblem& p, Backend backend) {
  call.backend = backend_name(backend);
  // the paged kernel has one native path (attention/paged/native.cpp)
  call.take_path(backend == Backend::native ? "paged" : backend_name(backend), "");
  call.dtype = dtype_name(p.dtype);
  call.kv_dtype = dtype_name(p.kv_dtype);
  call.shape("q", verbose_shape({p.total_q, p.H, p.D}));
  call.shape("kv_cache", verbose_shape({p.num_blocks, p.block_size, p.Hkv, p.D}));
  call.shape("seqs", std::to_string(p.N));
  std::string& o = call.opts;
  if (p.causal != Causal::none) add(o, "causal:" + std::string(causal_name(p.causal)));
  if (p.has_window) add(o, window(p.window_left, p.window_right));
  shared_options(o, p.scale, p.softcap, p.alibi, p.sinks);
}

}  // namespace simdattn::detail

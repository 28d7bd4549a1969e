// The native backend's decode.widened path: bf16/f16 operands whose K or V is strided along D
// (which the 16-bit decode path does not read) as dense f32 copies on the f32 decode path.
#include <algorithm>
#include <cstdint>

#include "attention/native/paths.hpp"
#include "core/backends.hpp"
#include "core/element.hpp"
#include "linalg/convert.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail {
namespace scratch {
struct WidenedQ : ScratchSlot {};  // f32 copies of q, k, v and out
struct WidenedK : ScratchSlot {};
struct WidenedV : ScratchSlot {};
struct WidenedOut : ScratchSlot {};
}  // namespace scratch

namespace {

// Rows of a [B, heads, S, cols] view (strides st) between two element types: rows [0, rows(b))
// of every (b, h) converted, the rest of a dense destination zeroed.
template <class To, class From, class RowsFn>
void convert_rows(const From* src, const Shape4& st, To* dst, const Shape4& dt, const Shape4& shape, int threads,
                  RowsFn rows) {
  const std::int64_t items = shape[0] * shape[1];
  const auto min_items = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(1, shape[2] * shape[3]));
  parallel_for(items, threads, min_items, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t it = i0; it < i1; ++it) {
      const std::int64_t b = it / shape[1], h = it % shape[1], n = std::min(rows(b), shape[2]);
      To* d = dst + b * dt[0] + h * dt[1];
      convert_matrix(src + b * st[0] + h * st[1], dtype_of<From>(), st[2], st[3], n, shape[3], d, dtype_of<To>(), dt[2], dt[3]);
      for (std::int64_t i = n; i < shape[2]; ++i)
        for (std::int64_t c = 0; c < shape[3]; ++c) d[i * dt[2] + c * dt[3]] = To{};
    }
  });
}

// A bf16/f16 problem as dense f32 copies of q, k, v and out would be (data pointers still p's).
Problem as_f32_copies(const Problem& p) {
  Problem f = p;
  f.dtype = DType::f32;
  f.q_strides = contiguous_strides({p.B, p.H, p.Sq, p.D}), f.k_strides = contiguous_strides({p.B, p.Hkv, p.Sk, p.D});
  f.v_strides = contiguous_strides({p.B, p.Hkv, p.Sk, p.Dv}), f.o_strides = contiguous_strides({p.B, p.H, p.Sq, p.Dv});
  return f;
}

// q, k and v widened to dense f32 copies (K and V rows at or past a batch's key length are not
// read: zeros), attention computed in f32, and the f32 output narrowed (to nearest even) into
// out. (The short-key and fused paths read 16-bit operands themselves.)
template <class H>
void widened(const Problem& p) {
  const Shape4 qshape{p.B, p.H, p.Sq, p.D}, kshape{p.B, p.Hkv, p.Sk, p.D}, vshape{p.B, p.Hkv, p.Sk, p.Dv};
  const Shape4 oshape{p.B, p.H, p.Sq, p.Dv};
  auto numel = [](const Shape4& s) { return static_cast<std::size_t>(std::max<std::int64_t>(1, s[0] * s[1] * s[2] * s[3])); };
  Problem f = as_f32_copies(p);
  auto* q = thread_buffer<float, scratch::WidenedQ>().get(numel(qshape));
  auto* k = thread_buffer<float, scratch::WidenedK>().get(numel(kshape));
  auto* v = thread_buffer<float, scratch::WidenedV>().get(numel(vshape));
  auto* o = thread_buffer<float, scratch::WidenedOut>().get(numel(oshape));
  const auto all_rows = [&](std::int64_t) { return p.Sq; };
  const auto key_rows = [&](std::int64_t b) { return p.key_len(b); };
  convert_rows(static_cast<const H*>(p.q), p.q_strides, q, f.q_strides, qshape, p.threads, all_rows);
  convert_rows(static_cast<const H*>(p.k), p.k_strides, k, f.k_strides, kshape, p.threads, key_rows);
  convert_rows(static_cast<const H*>(p.v), p.v_strides, v, f.v_strides, vshape, p.threads, key_rows);
  f.q = q, f.k = k, f.v = v, f.o = o;
  attention_native(f);
  convert_rows(o, f.o_strides, static_cast<H*>(p.o), p.o_strides, oshape, p.threads, all_rows);
}

}  // namespace

Refusal widened_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (!is_16bit(p.dtype)) return {"dtype {w} (bf16 and f16 only)", dtype_name(p.dtype)};
  if (Refusal r = needs_dense_keys(p)) return r;
  return decode_why_not(as_f32_copies(p));
}

void widened_attention(const Problem& p) {
  if (p.dtype == DType::bf16) widened<bfloat16>(p);
  else widened<float16>(p);
}

}  // namespace simdattn::detail

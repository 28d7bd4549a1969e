// Argument validation for attention_paged() (simdattn/paged.hpp): the paged form of make_problem.
// A paged call is attention() over another key source (core/problem.hpp's KeyBlocks): sequence i
// is batch i, its keys are read through the block table, its query rows through query_start
// (varlen), and its key length is seq_lens[i], bottom-right aligned. Everything is checked here,
// before any backend runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/problem.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/paged.hpp"

namespace simdattn::detail {
namespace {

void check_dtypes(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& out) {
  if (q.dtype != DType::f32 && q.dtype != DType::bf16 && q.dtype != DType::f16)
    throw Error("q", "dtype must be f32, bf16 or f16, got " + std::string(dtype_name(q.dtype)));
  if (is_kv_code(k.dtype) || is_kv_code(v.dtype)) {
    if (v.dtype != k.dtype)
      throw Error("v_cache", "dtype " + std::string(dtype_name(v.dtype)) + " differs from k_cache's " +
                                 std::string(dtype_name(k.dtype)) + " (8-bit caches take one code dtype)");
    if (out.dtype != q.dtype)
      throw Error("out", "dtype " + std::string(dtype_name(out.dtype)) + " differs from q's " + std::string(dtype_name(q.dtype)));
    return;
  }
  const std::pair<const char*, DType> others[] = {{"k_cache", k.dtype}, {"v_cache", v.dtype}, {"out", out.dtype}};
  for (const auto& [name, t] : others)
    if (t != q.dtype)
      throw Error(name, "dtype " + std::string(dtype_name(t)) + " differs from q's " + std::string(dtype_name(q.dtype)));
}

// Shapes: q [1, total_q, H, D], caches [num_blocks, block_size, Hkv, D / Dv], out [1, total_q,
// H, Dv]. Returns total_q and num_blocks.
std::pair<std::int64_t, std::int64_t> set_shapes(Problem& p, const ConstTensorView& q, const ConstTensorView& k,
                                                 const ConstTensorView& v, const TensorView& out) {
  if (q.shape[0] != 1) throw Error("q", "expected shape [1, total_q, H, D], got " + shape_str(q.shape));
  const std::int64_t total_q = q.shape[1];
  p.H = q.shape[2], p.D = q.shape[3];
  if (p.H < 1 || p.D < 1) throw Error("q", "shape " + shape_str(q.shape) + " needs H >= 1 and D >= 1");
  const std::int64_t num_blocks = k.shape[0], block_size = k.shape[1];
  p.Hkv = k.shape[2];
  if (block_size < 1 || p.Hkv < 1 || k.shape[3] != p.D)
    throw Error("k_cache", "expected shape [num_blocks, block_size >= 1, Hkv >= 1, D=" + num(p.D) + "], got " +
                               shape_str(k.shape));
  if (p.H % p.Hkv != 0)
    throw Error("k_cache", "q's H=" + num(p.H) + " heads are not a multiple of Hkv=" + num(p.Hkv));
  p.Dv = v.shape[3];
  if (v.shape[0] != num_blocks || v.shape[1] != block_size || v.shape[2] != p.Hkv || p.Dv < 1)
    throw Error("v_cache", "expected shape [num_blocks=" + num(num_blocks) + ", block_size=" + num(block_size) +
                               ", Hkv=" + num(p.Hkv) + ", Dv >= 1], got " + shape_str(v.shape));
  const Shape4 want{1, total_q, p.H, p.Dv};
  if (out.shape != want)
    throw Error("out", "expected shape [1, total_q, H, Dv] = " + shape_str(want) + ", got " + shape_str(out.shape));
  p.kv_blocks.block_size = block_size;
  return {total_q, num_blocks};
}

// seq_lens, query_start and the block table, against the shapes: the key lengths, the varlen
// query rows (Sq the longest) and the key source's table (Sk the longest sequence).
void set_sequences(Problem& p, std::int64_t total_q, std::int64_t num_blocks, const BlockTable& table,
                   std::span<const std::int64_t> seq_lens, std::span<const std::int64_t> query_start) {
  p.B = static_cast<std::int64_t>(seq_lens.size());
  if (table.rows != p.B)
    throw Error("block_table", "expected " + num(p.B) + " rows (one per sequence in seq_lens), got " + num(table.rows));
  if (table.cols < 0 || table.row_stride < 0)
    throw Error("block_table", "negative cols " + num(table.cols) + " or row_stride " + num(table.row_stride));
  p.kv_blocks.table_stride = table.row_stride == 0 ? table.cols : table.row_stride;
  if (table.rows > 1 && p.kv_blocks.table_stride < table.cols)
    throw Error("block_table", "row_stride " + num(p.kv_blocks.table_stride) + " < cols " + num(table.cols) + " (rows overlap)");
  if (p.B > 0 && table.cols > 0 && table.data == nullptr) throw Error("block_table", "null data for " + num(p.B) + " rows");
  if (query_start.empty()) {
    if (total_q != p.B)
      throw Error("q", "without options.query_start each sequence has one query token: expected total_q = N = " +
                           num(p.B) + ", got " + num(total_q));
    p.Sq = p.B > 0 ? 1 : 0;
  } else {
    if (static_cast<std::int64_t>(query_start.size()) != p.B + 1)
      throw Error("options.query_start", "expected N + 1 = " + num(p.B + 1) + " offsets, got " +
                                             num(static_cast<std::int64_t>(query_start.size())));
    if (query_start[0] != 0) throw Error("options.query_start", "entry 0 is " + num(query_start[0]) + ", expected 0");
    for (std::size_t i = 0; i + 1 < query_start.size(); ++i)
      if (query_start[i + 1] < query_start[i])
        throw Error("options.query_start", "not increasing: entry " + num(static_cast<std::int64_t>(i + 1)) + " (" +
                                               num(query_start[i + 1]) + ") < entry " + num(static_cast<std::int64_t>(i)) +
                                               " (" + num(query_start[i]) + ")");
    if (query_start.back() != total_q)
      throw Error("options.query_start", "last entry is " + num(query_start.back()) + ", expected total_q = " + num(total_q));
    p.query_start = query_start.data();
    p.Sq = 0;
    for (std::int64_t i = 0; i < p.B; ++i) p.Sq = std::max(p.Sq, p.query_len(i));
  }
  p.key_lengths = seq_lens.data();
  p.Sk = 0;
  const std::int64_t bs = p.kv_blocks.block_size;
  for (std::int64_t i = 0; i < p.B; ++i) {
    const std::int64_t L = seq_lens[static_cast<std::size_t>(i)], ql = p.query_len(i);
    if (L < 0 || L > (std::int64_t{1} << 40))
      throw Error("seq_lens", "entry " + num(i) + " is " + num(L) + ", expected 0 <= seq_len <= 2^40");
    if (ql > L)
      throw Error("seq_lens", "sequence " + num(i) + " has " + num(ql) + " query tokens but seq_len " + num(L) +
                                  " (the new tokens must already be in the cache)");
    const std::int64_t used = (L + bs - 1) / bs;
    if (used > table.cols)
      throw Error("block_table", "row " + num(i) + " has " + num(table.cols) + " entries, sequence " + num(i) +
                                     " needs ceil(" + num(L) + " / " + num(bs) + ") = " + num(used));
    for (std::int64_t c = 0; c < used; ++c) {
      const std::int64_t b = table.data[i * p.kv_blocks.table_stride + c];
      if (b < 0 || b >= num_blocks)
        throw Error("block_table", "entry [" + num(i) + ", " + num(c) + "] is " + num(b) + ", expected a block in [0, " +
                                       num(num_blocks) + ")");
    }
    p.Sk = std::max(p.Sk, L);
  }
  p.kv_blocks.table = table.data;
  p.kv_blocks.blocks = num_blocks;
}

// options.k_scale / v_scale: [num_blocks, block_size, Hkv, 1] f32, given exactly with 8-bit
// caches, clear of out; the scales of every key a sequence reads finite and >= 0. After
// set_sequences (the key source's table).
void set_scales(Problem& p, std::int64_t num_blocks, const PagedAttentionOptions& o, const Span& so) {
  for (const auto& [name, view, dst, strides] :
       {std::tuple<const char*, const ConstTensorView&, const float**, std::int64_t*>{
            "options.k_scale", o.k_scale, &p.k_scale, p.k_scale_strides},
        {"options.v_scale", o.v_scale, &p.v_scale, p.v_scale_strides}}) {
    const float* f = check_scale_view(name, view, {num_blocks, p.kv_blocks.block_size, p.Hkv, 1},
                                      "[num_blocks, block_size, Hkv, 1]", p.kv_dtype, so);
    if (f == nullptr) continue;
    // the problem's order: block, kv head, slot
    strides[0] = view.strides[0], strides[1] = view.strides[2], strides[2] = view.strides[1];
    for (std::int64_t i = 0; i < p.B; ++i)
      for (std::int64_t t0 = 0; t0 < p.key_len(i); t0 += p.kv_blocks.block_size) {  // block by block, kv head by kv head
        const KeyRun run = p.key_run(i, t0, p.key_len(i));
        for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
          const float* row = f + run.outer * strides[0] + hk * strides[1];
          const std::int64_t slot = first_bad_scale(row, run.n, strides[2]);
          if (slot >= 0)
            throw Error(name, "scale [" + num(run.outer) + ", " + num(slot) + ", " + num(hk) + "] (sequence " + num(i) +
                                  ", key " + num(t0 + slot) + ") must be finite and >= 0, got " +
                                  std::to_string(row[slot * strides[2]]));
        }
      }
    *dst = f;
  }
}

// options.tree_mask and tree_mask_start (after set_sequences: the query lengths): each
// sequence's [q_len, q_len] matrix inside the mask, a boolean mask of the tree's layout (the
// problem's tree_allows); causal then none, windows and ALiBi refused.
void set_tree_mask(Problem& p, const PagedAttentionOptions& opt, const Span& so) {
  const auto& mask = opt.tree_mask;
  const auto& start = opt.tree_mask_start;
  if (mask.data() == nullptr && mask.empty()) {
    if (!start.empty()) throw Error("tree_mask_start", "given without a tree_mask");
    return;
  }
  if (opt.window) throw Error("tree_mask", "cannot be combined with options.window (positions inside a tree are not linear)");
  if (!opt.alibi_slopes.empty())
    throw Error("tree_mask", "cannot be combined with options.alibi_slopes (positions inside a tree are not linear)");
  const auto size = static_cast<std::int64_t>(mask.size());
  p.tree_starts.resize(static_cast<std::size_t>(p.B));
  if (start.empty()) {
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < p.B; ++i) {
      p.tree_starts[static_cast<std::size_t>(i)] = at;
      at += p.query_len(i) * p.query_len(i);
    }
    if (at > size)
      throw Error("tree_mask", "has " + num(size) + " elements, the sequences' [q_len, q_len] matrices need " + num(at));
  } else {
    if (static_cast<std::int64_t>(start.size()) != p.B + 1)
      throw Error("tree_mask_start", "expected N + 1 = " + num(p.B + 1) + " offsets, got " +
                                         num(static_cast<std::int64_t>(start.size())));
    if (start[0] < 0) throw Error("tree_mask_start", "entry 0 is " + num(start[0]) + ", expected >= 0");
    for (std::int64_t i = 0; i < p.B; ++i) {
      const std::int64_t ql = p.query_len(i), a = start[static_cast<std::size_t>(i)], b = start[static_cast<std::size_t>(i + 1)];
      if (b - a != ql * ql)
        throw Error("tree_mask_start", "entries " + num(i) + " and " + num(i + 1) + " (" + num(a) + ", " + num(b) +
                                           ") are " + num(b - a) + " apart, sequence " + num(i) + "'s " + num(ql) +
                                           " new tokens need q_len^2 = " + num(ql * ql));
      p.tree_starts[static_cast<std::size_t>(i)] = a;
    }
    if (start[static_cast<std::size_t>(p.B)] > size)
      throw Error("tree_mask_start", "last entry is " + num(start[static_cast<std::size_t>(p.B)]) +
                                         ", past the tree_mask's " + num(size) + " elements");
    if (overlaps(so, span_of(start.data(), start.size_bytes()))) throw Error("out", "memory overlaps tree_mask_start");
  }
  if (overlaps(so, span_of(mask.data(), mask.size_bytes()))) throw Error("out", "memory overlaps tree_mask");
  p.tree_mask = mask.data();
  p.mask_kind = MaskKind::boolean;
  p.causal = Causal::none;
}

// options.lse: [1, total_q, H, 1] f32, its elements distinct, clear of every input and out.
void set_lse(Problem& p, std::int64_t total_q, const PagedAttentionOptions& opt, const std::vector<Span>& inputs,
             const Span& so) {
  const TensorView& l = opt.lse;
  if (!view_given(l)) return;
  if (l.dtype != DType::f32) throw Error("options.lse", "dtype must be f32, got " + std::string(dtype_name(l.dtype)));
  const Shape4 want{1, total_q, p.H, 1};
  if (l.shape != want)
    throw Error("options.lse", "expected shape [1, total_q, H, 1] = " + shape_str(want) + ", got " + shape_str(l.shape));
  const Span s = byte_span("options.lse", l.data, l.dtype, l.shape, l.strides);
  check_no_self_overlap("options.lse", l.shape, l.strides);
  for (const Span& in : inputs)
    if (overlaps(s, in)) throw Error("options.lse", "memory overlaps an input");
  if (overlaps(s, so)) throw Error("options.lse", "memory overlaps out");
  p.lse = static_cast<float*>(l.data);
  // [B, H, Sq] in the problem's order: batch b's rows from query_start[b] (or row b) on
  p.lse_strides[0] = p.query_start != nullptr ? 0 : l.strides[1];
  p.lse_strides[1] = l.strides[2], p.lse_strides[2] = l.strides[1];
}

void set_options(Problem& p, const PagedAttentionOptions& opt, const Span& so) {
  const bool tree = opt.tree_mask.data() != nullptr || !opt.tree_mask.empty();  // (causal ignored)
  if (!tree && opt.causal != Causal::bottom_right && opt.causal != Causal::none)
    throw Error("options.causal", "must be bottom_right or none (each sequence's new tokens are its last), got " +
                                      std::string(causal_name(opt.causal)));
  p.causal = opt.causal;
  set_window(p, opt.window);
  set_scale_threads(p, opt);
  set_softcap_alibi_sinks(p, opt, so);
  set_tree_mask(p, opt, so);
}

}  // namespace

Problem make_problem(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                     const BlockTable& block_table, std::span<const std::int64_t> seq_lens, const TensorView& out,
                     const PagedAttentionOptions& options) {
  check_isa();
  Problem p;
  check_dtypes(q, k_cache, v_cache, out);
  p.dtype = q.dtype;
  p.kv_dtype = k_cache.dtype;
  const Span sq = byte_span("q", q), sk = byte_span("k_cache", k_cache), sv = byte_span("v_cache", v_cache);
  const Span so = byte_span("out", out);
  const auto [total_q, num_blocks] = set_shapes(p, q, k_cache, v_cache, out);
  check_no_self_overlap("out", out.shape, out.strides);
  if (overlaps(so, sq)) throw Error("out", "memory overlaps q");
  if (overlaps(so, sk)) throw Error("out", "memory overlaps k_cache");
  if (overlaps(so, sv)) throw Error("out", "memory overlaps v_cache");
  set_sequences(p, total_q, num_blocks, block_table, seq_lens, options.query_start);
  const std::size_t table_bytes = static_cast<std::size_t>(p.B * p.kv_blocks.table_stride) * sizeof(std::int32_t);
  if (overlaps(so, span_of(block_table.data, table_bytes))) throw Error("out", "memory overlaps block_table");
  if (overlaps(so, span_of(seq_lens.data(), seq_lens.size_bytes()))) throw Error("out", "memory overlaps seq_lens");
  if (overlaps(so, span_of(options.query_start.data(), options.query_start.size_bytes())))
    throw Error("out", "memory overlaps options.query_start");
  set_options(p, options, so);
  set_scales(p, num_blocks, options, so);
  set_lse(p, total_q, options,
          {sq, sk, sv, span_of(block_table.data, table_bytes), span_of(seq_lens.data(), seq_lens.size_bytes()),
           span_of(options.query_start.data(), options.query_start.size_bytes()),
           span_of(options.tree_mask.data(), options.tree_mask.size_bytes()),
           span_of(options.tree_mask_start.data(), options.tree_mask_start.size_bytes()),
           span_of(options.alibi_slopes.data(), options.alibi_slopes.size_bytes()),
           span_of(options.sinks.data(), options.sinks.size_bytes()),
           view_given(options.k_scale) ? byte_span("options.k_scale", options.k_scale) : Span{},
           view_given(options.v_scale) ? byte_span("options.v_scale", options.v_scale) : Span{}},
          so);
  // q and out [1, total_q, H, .]: batch b's rows from query_start[b] (or row b, one each) on
  p.q = q.data, p.k = k_cache.data, p.v = v_cache.data, p.o = out.data;
  const std::int64_t q0 = p.query_start != nullptr ? 0 : q.strides[1], o0 = p.query_start != nullptr ? 0 : out.strides[1];
  p.q_strides = {q0, q.strides[2], q.strides[1], q.strides[3]};
  p.o_strides = {o0, out.strides[2], out.strides[1], out.strides[3]};
  // the caches [num_blocks, block_size, Hkv, .] in the problem's order: block, kv head, slot
  p.k_strides = {k_cache.strides[0], k_cache.strides[2], k_cache.strides[1], k_cache.strides[3]};
  p.v_strides = {v_cache.strides[0], v_cache.strides[2], v_cache.strides[1], v_cache.strides[3]};
  return p;
}

}  // namespace simdattn::detail

// attention_paged(): its checks, the backend choice, and the reference backend (each sequence's
// keys gathered into dense views for attention()'s float64 oracle).
#include "attention/paged/paged.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "attention/verbose.hpp"
#include "core/backends.hpp"
#include "core/text.hpp"
#include "core/validate.hpp"
#include "runtime/team.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

std::string num(std::int64_t x) { return std::to_string(x); }

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

// Shapes: q [1, total_q, H, D], caches [num_blocks, block_size, Hkv, D / Dv], out [1, total_q, H, Dv].
void set_shapes(PagedProblem& p, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                const TensorView& out) {
  if (q.shape[0] != 1) throw Error("q", "expected shape [1, total_q, H, D], got " + shape_str(q.shape));
  p.total_q = q.shape[1], p.H = q.shape[2], p.D = q.shape[3];
  if (p.H < 1 || p.D < 1) throw Error("q", "shape " + shape_str(q.shape) + " needs H >= 1 and D >= 1");
  p.num_blocks = k.shape[0], p.block_size = k.shape[1], p.Hkv = k.shape[2];
  if (p.block_size < 1 || p.Hkv < 1 || k.shape[3] != p.D)
    throw Error("k_cache", "expected shape [num_blocks, block_size >= 1, Hkv >= 1, D=" + num(p.D) + "], got " +
                               shape_str(k.shape));
  if (p.H % p.Hkv != 0)
    throw Error("k_cache", "q's H=" + num(p.H) + " heads are not a multiple of Hkv=" + num(p.Hkv));
  p.Dv = v.shape[3];
  if (v.shape[0] != p.num_blocks || v.shape[1] != p.block_size || v.shape[2] != p.Hkv || p.Dv < 1)
    throw Error("v_cache", "expected shape [num_blocks=" + num(p.num_blocks) + ", block_size=" + num(p.block_size) +
                               ", Hkv=" + num(p.Hkv) + ", Dv >= 1], got " + shape_str(v.shape));
  const Shape4 want{1, p.total_q, p.H, p.Dv};
  if (out.shape != want)
    throw Error("out", "expected shape [1, total_q, H, Dv] = " + shape_str(want) + ", got " + shape_str(out.shape));
}

// options.k_scale / v_scale: [num_blocks, block_size, Hkv, 1] f32, given exactly with 8-bit
// caches, clear of out; the scales of every key a sequence reads finite and >= 0. After
// set_sequences.
void set_scales(PagedProblem& p, const PagedAttentionOptions& o, const Span& so) {
  for (const auto& [name, view, dst, strides] :
       {std::tuple<const char*, const ConstTensorView&, const float**, std::int64_t*>{
            "options.k_scale", o.k_scale, &p.k_scale, p.k_scale_strides},
        {"options.v_scale", o.v_scale, &p.v_scale, p.v_scale_strides}}) {
    const float* f = check_scale_view(name, view, {p.num_blocks, p.block_size, p.Hkv, 1},
                                      "[num_blocks, block_size, Hkv, 1]", p.kv_dtype, so);
    if (f == nullptr) continue;
    for (std::int64_t i = 0; i < p.N; ++i)
      for (std::int64_t t0 = 0; t0 < p.seq_lens[i]; t0 += p.block_size) {  // block by block, kv head by kv head
        const std::int64_t blk = p.block_of(i, t0), n = std::min(p.block_size, p.seq_lens[i] - t0);
        for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
          const float* row = f + blk * view.strides[0] + hk * view.strides[2];
          const std::int64_t slot = first_bad_scale(row, n, view.strides[1]);
          if (slot >= 0)
            throw Error(name, "scale [" + num(blk) + ", " + num(slot) + ", " + num(hk) + "] (sequence " + num(i) +
                                  ", key " + num(t0 + slot) + ") must be finite and >= 0, got " +
                                  std::to_string(row[slot * view.strides[1]]));
        }
      }
    *dst = f;
    strides[0] = view.strides[0], strides[1] = view.strides[1], strides[2] = view.strides[2];
  }
}

// seq_lens, query_start and the block table, against the shapes.
void set_sequences(PagedProblem& p, const BlockTable& table, std::span<const std::int64_t> seq_lens,
                   std::span<const std::int64_t> query_start) {
  p.N = static_cast<std::int64_t>(seq_lens.size());
  if (table.rows != p.N)
    throw Error("block_table", "expected " + num(p.N) + " rows (one per sequence in seq_lens), got " + num(table.rows));
  if (table.cols < 0 || table.row_stride < 0)
    throw Error("block_table", "negative cols " + num(table.cols) + " or row_stride " + num(table.row_stride));
  p.table_stride = table.row_stride == 0 ? table.cols : table.row_stride;
  if (table.rows > 1 && p.table_stride < table.cols)
    throw Error("block_table", "row_stride " + num(p.table_stride) + " < cols " + num(table.cols) + " (rows overlap)");
  if (p.N > 0 && table.cols > 0 && table.data == nullptr) throw Error("block_table", "null data for " + num(p.N) + " rows");
  p.table = table.data;
  if (query_start.empty()) {
    if (p.total_q != p.N)
      throw Error("q", "without options.query_start each sequence has one query token: expected total_q = N = " +
                           num(p.N) + ", got " + num(p.total_q));
    thread_local std::vector<std::int64_t> one_each;
    if (static_cast<std::int64_t>(one_each.size()) < p.N + 1) {
      const auto from = static_cast<std::int64_t>(one_each.size());
      one_each.resize(static_cast<std::size_t>(p.N + 1));
      for (std::int64_t i = from; i <= p.N; ++i) one_each[static_cast<std::size_t>(i)] = i;
    }
    p.query_start = one_each.data();
  } else {
    if (static_cast<std::int64_t>(query_start.size()) != p.N + 1)
      throw Error("options.query_start", "expected N + 1 = " + num(p.N + 1) + " offsets, got " + num(static_cast<std::int64_t>(query_start.size())));
    if (query_start[0] != 0) throw Error("options.query_start", "entry 0 is " + num(query_start[0]) + ", expected 0");
    for (std::int64_t i = 0; i < p.N; ++i)
      if (query_start[static_cast<std::size_t>(i + 1)] < query_start[static_cast<std::size_t>(i)])
        throw Error("options.query_start", "not increasing: entry " + num(i + 1) + " (" +
                                               num(query_start[static_cast<std::size_t>(i + 1)]) + ") < entry " + num(i) +
                                               " (" + num(query_start[static_cast<std::size_t>(i)]) + ")");
    if (query_start.back() != p.total_q)
      throw Error("options.query_start", "last entry is " + num(query_start.back()) + ", expected total_q = " + num(p.total_q));
    p.query_start = query_start.data();
  }
  p.seq_lens = seq_lens.data();
  for (std::int64_t i = 0; i < p.N; ++i) {
    const std::int64_t L = seq_lens[static_cast<std::size_t>(i)], ql = p.query_len(i);
    if (L < 0 || L > (std::int64_t{1} << 40))
      throw Error("seq_lens", "entry " + num(i) + " is " + num(L) + ", expected 0 <= seq_len <= 2^40");
    if (ql > L)
      throw Error("seq_lens", "sequence " + num(i) + " has " + num(ql) + " query tokens but seq_len " + num(L) +
                                  " (the new tokens must already be in the cache)");
    const std::int64_t used = (L + p.block_size - 1) / p.block_size;
    if (used > table.cols)
      throw Error("block_table", "row " + num(i) + " has " + num(table.cols) + " entries, sequence " + num(i) +
                                     " needs ceil(" + num(L) + " / " + num(p.block_size) + ") = " + num(used));
    for (std::int64_t c = 0; c < used; ++c) {
      const std::int64_t b = p.table[i * p.table_stride + c];
      if (b < 0 || b >= p.num_blocks)
        throw Error("block_table", "entry [" + num(i) + ", " + num(c) + "] is " + num(b) + ", expected a block in [0, " +
                                       num(p.num_blocks) + ")");
    }
  }
}

void set_options(PagedProblem& p, const PagedAttentionOptions& opt, const Span& so) {
  if (opt.causal != Causal::bottom_right && opt.causal != Causal::none)
    throw Error("options.causal", "must be bottom_right or none (each sequence's new tokens are its last), got " +
                                      std::string(causal_name(opt.causal)));
  p.causal = opt.causal;
  if (opt.window) {
    if (opt.window->left < -1 || opt.window->right < -1)
      throw Error("options.window", "(" + num(opt.window->left) + ", " + num(opt.window->right) +
                                        "): each side must be >= 0, or -1 for unbounded");
    p.has_window = true;
    constexpr std::int64_t reach = std::int64_t{1} << 42;  // past every position: saturate
    p.window_left = std::min(opt.window->left, reach);
    p.window_right = std::min(opt.window->right, reach);
  }
  p.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  if (!std::isfinite(p.scale)) throw Error("options.scale", "must be finite, got " + std::to_string(p.scale));
  set_softcap_alibi_sinks(p, opt, so);
  if (opt.threads < 0) throw Error("options.threads", "must be >= 0, got " + num(opt.threads));
  p.threads = opt.threads;
}

}  // namespace

Problem PagedProblem::sequence(std::int64_t i) const {
  Problem s;
  s.dtype = DType::f32;  // the scores' type: every path computes them in f32 or f64
  s.B = 1, s.H = H, s.Hkv = Hkv, s.D = D, s.Dv = Dv;
  s.Sq = query_len(i), s.Sk = seq_lens[i];
  s.causal = causal;
  s.has_window = has_window, s.window_left = window_left, s.window_right = window_right;
  s.scale = scale, s.softcap = softcap, s.alibi = alibi, s.sinks = sinks;
  return s;
}

PagedProblem make_paged_problem(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                                const BlockTable& block_table, std::span<const std::int64_t> seq_lens,
                                const TensorView& out, const PagedAttentionOptions& options) {
  check_isa();
  PagedProblem p;
  check_dtypes(q, k_cache, v_cache, out);
  p.dtype = q.dtype;
  p.kv_dtype = k_cache.dtype;
  const Span sq = byte_span("q", q), sk = byte_span("k_cache", k_cache), sv = byte_span("v_cache", v_cache);
  const Span so = byte_span("out", out);
  set_shapes(p, q, k_cache, v_cache, out);
  check_no_self_overlap("out", out.shape, out.strides);
  if (overlaps(so, sq)) throw Error("out", "memory overlaps q");
  if (overlaps(so, sk)) throw Error("out", "memory overlaps k_cache");
  if (overlaps(so, sv)) throw Error("out", "memory overlaps v_cache");
  set_sequences(p, block_table, seq_lens, options.query_start);
  const auto at = [](const void* d, std::size_t bytes) {
    const auto a = reinterpret_cast<std::uintptr_t>(d);
    return Span{a, a + bytes};
  };
  if (overlaps(so, at(p.table, static_cast<std::size_t>(p.N * p.table_stride) * sizeof(std::int32_t))))
    throw Error("out", "memory overlaps block_table");
  if (overlaps(so, at(seq_lens.data(), seq_lens.size_bytes()))) throw Error("out", "memory overlaps seq_lens");
  set_options(p, options, so);
  set_scales(p, options, so);
  p.q = q.data, p.k = k_cache.data, p.v = v_cache.data, p.o = out.data;
  p.q_strides = q.strides, p.k_strides = k_cache.strides, p.v_strides = v_cache.strides, p.o_strides = out.strides;
  return p;
}

void paged_reference(const PagedProblem& p) {
  const std::size_t es = dtype_size(p.dtype), ks = dtype_size(p.kv_dtype);
  std::vector<std::byte> k, v;
  std::vector<float> k_scale, v_scale;  // 8-bit caches: [Hkv, L]
  for (std::int64_t i = 0; i < p.N; ++i) {
    const std::int64_t L = p.seq_lens[i], ql = p.query_len(i), q0 = p.query_start[i];
    if (ql == 0) continue;
    // K [1, Hkv, L, D] and V [1, Hkv, L, Dv], dense
    k.resize(static_cast<std::size_t>(p.Hkv * L * p.D) * ks);
    v.resize(static_cast<std::size_t>(p.Hkv * L * p.Dv) * ks);
    if (p.kv_codes()) k_scale.resize(static_cast<std::size_t>(p.Hkv * L)), v_scale.resize(k_scale.size());
    for (std::int64_t t = 0; t < L; ++t) {
      const std::int64_t blk = p.block_of(i, t), slot = t % p.block_size;
      for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
        const auto copy = [&](const void* src, const Shape4& st, std::int64_t d, std::byte* dst) {
          for (std::int64_t e = 0; e < d; ++e)
            std::memcpy(dst + static_cast<std::size_t>(e) * ks,
                        static_cast<const std::byte*>(src) +
                            static_cast<std::size_t>(blk * st[0] + slot * st[1] + hk * st[2] + e * st[3]) * ks,
                        ks);
        };
        copy(p.k, p.k_strides, p.D, k.data() + static_cast<std::size_t>((hk * L + t) * p.D) * ks);
        copy(p.v, p.v_strides, p.Dv, v.data() + static_cast<std::size_t>((hk * L + t) * p.Dv) * ks);
        if (p.kv_codes()) {
          k_scale[static_cast<std::size_t>(hk * L + t)] =
              p.k_scale[blk * p.k_scale_strides[0] + slot * p.k_scale_strides[1] + hk * p.k_scale_strides[2]];
          v_scale[static_cast<std::size_t>(hk * L + t)] =
              p.v_scale[blk * p.v_scale_strides[0] + slot * p.v_scale_strides[1] + hk * p.v_scale_strides[2]];
        }
      }
    }
    Problem s = p.sequence(i);
    s.dtype = p.dtype;
    s.kv_dtype = p.kv_dtype;
    if (p.kv_codes()) {
      s.k_scale = k_scale.data(), s.v_scale = v_scale.data();
      s.k_scale_strides[0] = s.v_scale_strides[0] = 0;
      s.k_scale_strides[1] = s.v_scale_strides[1] = L;
      s.k_scale_strides[2] = s.v_scale_strides[2] = 1;
    }
    s.q = static_cast<const std::byte*>(p.q) + static_cast<std::size_t>(q0 * p.q_strides[1]) * es;
    s.q_strides = {0, p.q_strides[2], p.q_strides[1], p.q_strides[3]};
    s.k = k.data(), s.k_strides = {0, L * p.D, p.D, 1};
    s.v = v.data(), s.v_strides = {0, L * p.Dv, p.Dv, 1};
    s.o = static_cast<std::byte*>(p.o) + static_cast<std::size_t>(q0 * p.o_strides[1]) * es;
    s.o_strides = {0, p.o_strides[2], p.o_strides[1], p.o_strides[3]};
    attention_reference(s);
  }
}

}  // namespace simdattn::detail

namespace simdattn {

void attention_paged(const ConstTensorView& q, const ConstTensorView& k_cache, const ConstTensorView& v_cache,
                     const BlockTable& block_table, std::span<const std::int64_t> seq_lens, const TensorView& out,
                     const PagedAttentionOptions& options) {
  detail::verbose_entry("attention_paged", [&](detail::VerboseCall* verbose) {
    const detail::CallScope in_use;  // the thread budget counts this thread as busy
    if (options.backend != Backend::native && options.backend != Backend::reference)
      throw Error("options.backend", "attention_paged runs on the native and reference backends, not '" +
                                         std::string(backend_name(options.backend)) + "'");
    const detail::PagedProblem p = detail::make_paged_problem(q, k_cache, v_cache, block_table, seq_lens, out, options);
    if (verbose != nullptr) detail::describe_paged(*verbose, p, options.backend);
    if (options.backend == Backend::reference) detail::paged_reference(p);
    else detail::paged_native(p);
  });
}

}  // namespace simdattn

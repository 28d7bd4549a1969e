// A step's rows checked, appended and attended over a layer's cached keys (kv_store.hpp), the same
// for a KvCache and a pool layer.
#include "layer/cache/kv_store.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/run.hpp"
#include "core/problem.hpp"
#include "core/text.hpp"
#include "core/validate/validate.hpp"
#include "layer/call_options.hpp"
#include "layer/cache/pool_core.hpp"
#include "layer/positions/positions.hpp"
#include "linalg/code8.hpp"
#include "linalg/convert.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

// The block and slot of a sequence's key at `pos`.
std::pair<std::int64_t, std::int64_t> place(const KvStore& store, const StoreSeq& s, std::int64_t pos) {
  if (!store.paged) return {s.index, pos};
  return {(*s.blocks)[static_cast<std::size_t>(pos / store.block_size)], pos % store.block_size};
}

}  // namespace

template <class T>
void check_step_rows(const LayerStorage<T>& layer, const ConstSeqView& query, const SeqView& out,
                     std::span<const std::int64_t> positions, std::int64_t B) {
  const MhaConfig& c = layer.cfg;
  check_seq("query", query, dtype_of<T>(), B, c.d_model);
  check_rows("query", query, std::max({c.d_model, layer.n_in, layer.nq}), sizeof(T));
  check_out(out, dtype_of<T>(), query.B, query.S, c.d_model);
  check_positions(positions, query.B, query.S);  // (a layer without RoPE ignores them, but not their shape)
}

void check_cached_options(const MhaOptions& opt, const char* what) {
  if (opt.causal == Causal::top_left)
    throw Error("options.causal", std::string("a cached step attends with bottom-right alignment over ") + what +
                                      "; top-left is not meaningful there (use none or bottom_right)");
  if (!opt.key_padding_mask.empty() || opt.attn_mask.data != nullptr)
    throw Error("options", std::string("masks are not supported over ") + what + " (truncate the sequence instead)");
}

template <class T>
BadRow first_bad_row(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                     std::span<const StoreSeq> seqs) {
  if (!is_kv_code(store.dtype)) return {};
  const std::int64_t hd = layer.cfg.head_dim;
  for (std::size_t i = 0; i < seqs.size(); ++i)
    for (std::int64_t t = 0; t < seqs[i].tokens; ++t)
      for (std::int64_t hk = 0; hk < store.kv_heads; ++hk)
        for (const auto& [off, which] : {std::pair{layer.k0, "K"}, std::pair{layer.v0, "V"}})
          if (first_nonfinite_row(p + (seqs[i].row0 + t) * N + hk * hd + off, dtype_of<T>(), 1, hd, hd) == 0)
            return {static_cast<std::int64_t>(i), seqs[i].start + t, hk, which};
  return {};
}

std::string bad_row_text(const BadRow& bad, std::int64_t id, DType dtype, const char* what) {
  return "sequence " + num(id) + ", token " + num(bad.token) + ": its " + bad.which + " row of kv head " +
         num(bad.kv_head) + " holds a NaN or an infinity, which a " + std::string(dtype_name(dtype)) + " " + what +
         " cannot represent (the " + what + " is unchanged)";
}

template <class T>
void append_store_rows(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                       std::span<const StoreSeq> seqs) {
  const std::int64_t hd = layer.cfg.head_dim, bs = store.block_size;
  const auto esize = static_cast<std::int64_t>(dtype_size(store.dtype));
  const bool codes = is_kv_code(store.dtype);
  float* row = codes ? thread_buffer<float, scratch::MhaCacheQ>().get(static_cast<std::size_t>(hd)) : nullptr;
  for (const StoreSeq& s : seqs)
    for (std::int64_t t = 0; t < s.tokens; ++t) {
      const auto [blk, slot] = place(store, s, s.start + t);
      for (std::int64_t hk = 0; hk < store.kv_heads; ++hk) {
        const T* src = p + (s.row0 + t) * N + hk * hd;
        const std::int64_t at = blk * store.block_stride + (hk * bs + slot) * hd;
        const std::int64_t sc = blk * store.scale_stride + hk * bs + slot;
        for (const auto& [off, base, scale] : {std::tuple{layer.k0, store.k, store.k_scale}, std::tuple{layer.v0, store.v, store.v_scale}}) {
          if (codes)  // checked finite before (first_bad_row)
            quantize_row(store.dtype, src + off, dtype_of<T>(), hd, row, reinterpret_cast<std::uint8_t*>(base) + at, scale + sc);
          else
            convert_elements(src + off, dtype_of<T>(), base + at * esize, store.dtype, hd);
        }
      }
    }
}

template <class T>
void append_latent_rows(const KvStore& store, std::span<const StoreSeq> seqs, const T* rows) {
  const std::int64_t W = store.head_dim;
  const auto esize = static_cast<std::int64_t>(dtype_size(store.dtype));
  const bool codes = is_kv_code(store.dtype);
  float* tmp = codes ? thread_buffer<float, scratch::MhaCacheQ>().get(static_cast<std::size_t>(W)) : nullptr;
  for (const StoreSeq& s : seqs)
    for (std::int64_t t = 0; t < s.tokens; ++t) {
      const auto [blk, slot] = place(store, s, s.start + t);
      const T* src = rows + (s.row0 + t) * W;
      const std::int64_t at = blk * store.block_stride + slot * W;
      if (codes)
        quantize_row(store.dtype, src, dtype_of<T>(), W, tmp, reinterpret_cast<std::uint8_t*>(store.k) + at,
                     store.k_scale + blk * store.scale_stride + slot);
      else
        convert_elements(src, dtype_of<T>(), store.k + at * esize, store.dtype, W);
    }
}

template <class T>
void read_latent_rows(const KvStore& store, const StoreSeq& s, std::int64_t n, T* dst) {
  const std::int64_t W = store.head_dim;
  const auto esize = static_cast<std::int64_t>(dtype_size(store.dtype));
  const bool codes = is_kv_code(store.dtype);
  for (std::int64_t t = 0; t < n; ++t) {
    const auto [blk, slot] = place(store, s, t);
    const std::int64_t at = blk * store.block_stride + slot * W;
    T* row = dst + t * W;
    if (codes) {
      const auto* c = reinterpret_cast<const std::uint8_t*>(store.k) + at;
      const float scale = store.k_scale[blk * store.scale_stride + slot];
      for (std::int64_t d = 0; d < W; ++d) row[d] = narrow<T>(static_cast<double>(code8_value(store.dtype, c[d]) * scale));
    } else {
      convert_elements(store.k + at * esize, store.dtype, row, dtype_of<T>(), W);
    }
  }
}

namespace {

// A KvCache's core: attention() on dense views of its whole capacity (the kernels size their
// scratch by it once, so decode steps allocate nothing), with the sequences' new lengths as key
// lengths and every option a carries (T5's bias, the weights' scores output). q's rows at qd, ldq
// apart; the output's at od, ldo apart; in the core's dtype.
void dense_core(const KvStore& store, std::span<const StoreSeq> seqs, DType core, std::int64_t H, const void* qd,
                std::int64_t ldq, void* od, std::int64_t ldo, AttentionOptions a) {
  const std::int64_t B = static_cast<std::int64_t>(seqs.size()), T = seqs.empty() ? 0 : seqs[0].tokens;
  const std::int64_t Hkv = store.kv_heads, hd = store.head_dim, cap = store.block_size, dv = store.v_dim;
  thread_local std::vector<std::int64_t> lens;
  lens.clear();
  for (const StoreSeq& s : seqs) lens.push_back(s.start + s.tokens);
  a.causal = Causal::bottom_right;
  a.key_lengths = lens;
  const Shape4 kvs{store.block_stride, cap * hd, hd, 1};
  const ConstTensorView k(store.k, store.dtype, {B, Hkv, cap, hd}, kvs), v(store.v, store.dtype, {B, Hkv, cap, dv}, kvs);
  if (is_kv_code(store.dtype)) {
    const Shape4 ss{store.scale_stride, cap, 1, 1};
    a.k_scale = ConstTensorView(store.k_scale, DType::f32, {B, Hkv, cap, 1}, ss);
    a.v_scale = ConstTensorView(store.v_scale, DType::f32, {B, Hkv, cap, 1}, ss);
  }
  attention(ConstTensorView(qd, core, {B, H, T, hd}, {T * ldq, hd, ldq, 1}), k, v,
            TensorView(od, core, {B, H, T, dv}, {T * ldo, dv, ldo, 1}), a);
}

}  // namespace

void core_attention(const KvStore& store, std::span<const StoreSeq> seqs, DType core, std::int64_t H, const void* qd,
                    std::int64_t ldq, void* od, std::int64_t ldo, const AttentionOptions& a) {
  if (store.paged) pool_attention(store, seqs, core, H, qd, ldq, od, ldo, a);
  else dense_core(store, seqs, core, H, qd, ldq, od, ldo, a);
}

template <class T>
void store_attention_rows(std::int64_t H, std::int64_t nq, std::int64_t no, const T* p, std::int64_t N,
                          const KvStore& store, std::span<const StoreSeq> seqs, T* o, const AttentionOptions& a) {
  if (seqs.empty()) return;
  const std::int64_t r0 = seqs[0].row0;  // the sequences' rows: consecutive from r0
  const DType core = core_dtype(store.dtype, dtype_of<T>());
  p += r0 * N, o += r0 * no;
  if (core == dtype_of<T>()) return core_attention(store, seqs, core, H, p, N, o, no, a);
  // A store of another dtype: q converted to it (rounded to nearest even if narrower, as
  // llama.cpp rounds q for its f16 cache) and the output back.
  std::int64_t M = 0;
  for (const StoreSeq& s : seqs) M += s.tokens;
  const std::int64_t cs = static_cast<std::int64_t>(dtype_size(core));
  std::byte* qc = thread_buffer<std::byte, scratch::MhaCacheQ>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, M * nq * cs)));
  std::byte* oc = thread_buffer<std::byte, scratch::MhaCacheOut>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, M * no * cs)));
  for (std::int64_t m = 0; m < M; ++m) convert_elements(p + m * N, dtype_of<T>(), qc + m * nq * cs, core, nq);
  core_attention(store, seqs, core, H, qc, nq, oc, no, a);
  convert_elements(oc, core, o, dtype_of<T>(), M * no);
}

template <class T>
void store_attention(const LayerStorage<T>& layer, const T* p, std::int64_t N, const KvStore& store,
                     std::span<const StoreSeq> seqs, T* o, const AttentionOptions& a) {
  store_attention_rows(layer.cfg.heads, layer.nq, layer.nq, p, N, store, seqs, o, a);
}

#define SIMDATTN_STORE(T)                                                                                          \
  template void check_step_rows(const LayerStorage<T>&, const ConstSeqView&, const SeqView&,                       \
                                std::span<const std::int64_t>, std::int64_t);                                     \
  template BadRow first_bad_row(const LayerStorage<T>&, const T*, std::int64_t, const KvStore&,                   \
                                std::span<const StoreSeq>);                                                       \
  template void append_store_rows(const LayerStorage<T>&, const T*, std::int64_t, const KvStore&,                  \
                                  std::span<const StoreSeq>);                                                     \
  template void store_attention(const LayerStorage<T>&, const T*, std::int64_t, const KvStore&,                    \
                                std::span<const StoreSeq>, T*, const AttentionOptions&);                           \
  template void store_attention_rows(std::int64_t, std::int64_t, std::int64_t, const T*, std::int64_t,            \
                                     const KvStore&, std::span<const StoreSeq>, T*, const AttentionOptions&);      \
  template void append_latent_rows(const KvStore&, std::span<const StoreSeq>, const T*);                         \
  template void read_latent_rows(const KvStore&, const StoreSeq&, std::int64_t, T*);
SIMDATTN_STORE(float)
SIMDATTN_STORE(double)
SIMDATTN_STORE(bfloat16)
SIMDATTN_STORE(float16)
#undef SIMDATTN_STORE

}  // namespace simdattn::detail

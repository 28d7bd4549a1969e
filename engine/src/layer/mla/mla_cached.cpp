// Multi-head Latent Attention over its latent cache (mla.hpp): a cached step in the absorbed
// form. Each new token's latent row [RMSNorm(c) | RoPE(kr)] is appended to the cache; each
// head's query becomes [q_nope W_UK[h] | RoPE(q_rope)] (W_UK[h]: kv_b's key rows of head h), so
// every head attends over the one latent row per key (keys the whole row, values its first
// kv_lora_rank columns, read once for all heads), and its output o_latent W_UV[h]^T (kv_b's value
// rows) goes to o_proj. The dot products are the expanded form's (q_nope . k_nope = q_nope .
// (W_UK c) = (q_nope W_UK) . c), and so are the outputs.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/text.hpp"
#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_store.hpp"
#include "layer/call_options.hpp"
#include "layer/mla/mla.hpp"
#include "layer/positions/positions.hpp"
#include "layer/projection.hpp"
#include "linalg/code8.hpp"
#include "linalg/convert.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {

namespace scratch {
struct MlaCachedRows : HugePagesSlot {};  // a cached step's rows: the first projection, q, latent rows, absorbed q and output
}  // namespace scratch

template <class T>
void mla_cached_forward(const MlaStorage<T>& layer, const ConstSeqView& query, CacheState& cache, const SeqView& out,
                        const MhaOptions& opt) {
  const MhaConfig& c = layer.cfg;
  const MlaConfig& m = layer.m;
  check_seq("query", query, dtype_of<T>(), cache.batch, c.d_model);
  check_rows("query", query, c.d_model, sizeof(T));
  check_out(out, dtype_of<T>(), query.B, query.S, c.d_model);
  check_cached_options(opt, "a KvCache");
  const std::int64_t B = cache.batch, S = query.S, M = B * S;
  check_positions(opt.positions, B, S);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = cache.lengths[static_cast<std::size_t>(b)];
    if (S > cache.capacity - L)
      throw Error("cache", "sequence " + num(b) + " holds " + num(L) + " tokens; " + num(S) + " more exceed the capacity " +
                               num(cache.capacity));
  }
  if (M == 0) return;
  const std::int64_t H = c.heads, nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim, qk = nope + rope;
  const std::int64_t kvl = m.kv_lora_rank, W = kvl + rope, vd = m.v_head_dim, nA = layer.n_a, d = c.d_model;
  const int threads = opt.threads;
  // scratch: A [M, n_a], the up-projected q [M, H * qk] (q LoRA), latent rows [M, W], absorbed q
  // [M, H, W], absorbed output [M, H, kvl], the heads' output [M, H * vd]
  const bool lora = m.q_lora_rank > 0;
  const std::size_t need = static_cast<std::size_t>(M * (nA + (lora ? H * qk : 0) + W + H * W + H * kvl + H * vd));
  T* A = thread_buffer<T, scratch::MlaCachedRows>().get(need);
  T* Qup = A + M * nA;
  T* Lr = Qup + (lora ? M * H * qk : 0);
  T* Qa = Lr + M * W;
  T* Oa = Qa + M * H * W;
  T* O = Oa + M * H * kvl;
  project(static_cast<const T*>(query.data), M, d, d, layer.w_a, 0, nA, layer.b_a.empty() ? nullptr : layer.b_a.data(), A,
          nA, threads);
  parallel_for(M, threads, 64, [&](std::int64_t m0, std::int64_t m1) {
    for (std::int64_t r = m0; r < m1; ++r) {
      if (lora) rms_norm_row(A + r * nA, m.q_lora_rank, layer.q_norm.data(), m.norm_eps);
      rms_norm_row(A + r * nA + layer.kv0, kvl, layer.kv_norm.data(), m.norm_eps);
    }
  });
  const T* qsrc = A;
  std::int64_t ldq = nA;
  if (lora) {
    project(A, M, m.q_lora_rank, nA, layer.w_qb, 0, H * qk, static_cast<const T*>(nullptr), Qup, H * qk, threads);
    qsrc = Qup, ldq = H * qk;
  }
  // the absorbed queries' latent parts: q_nope of head h times W_UK[h]
  for (std::int64_t h = 0; h < H; ++h) {
    if (nope == 0) {
      for (std::int64_t r = 0; r < M; ++r) std::fill_n(Qa + r * H * W + h * W, kvl, T{});
      continue;
    }
    project(qsrc + h * qk, M, nope, ldq, layer.w_uk[static_cast<std::size_t>(h)], 0, kvl, static_cast<const T*>(nullptr),
            Qa + h * W, H * W, threads);
  }
  // the latent rows and the queries' rotary parts at each token's position
  parallel_for(M, threads, 16, [&](std::int64_t m0, std::int64_t m1) {
    thread_local std::vector<double> cs;
    cs.resize(layer.rope.inv_freq.size() * 2);
    for (std::int64_t r = m0; r < m1; ++r) {
      const std::int64_t b = r / S, s = r % S;
      const std::int64_t pos =
          opt.positions.empty() ? cache.lengths[static_cast<std::size_t>(b)] + s : opt.positions[static_cast<std::size_t>(r)];
      rope_angles(layer.rope, pos, cs.data());
      T* row = Lr + r * W;
      std::copy_n(A + r * nA + layer.kv0, W, row);  // [normed c | kr]
      rope_rotate(layer.rope, cs.data(), row + kvl, 1);
      for (std::int64_t h = 0; h < H; ++h) {
        T* q = Qa + (r * H + h) * W + kvl;
        std::copy_n(qsrc + r * ldq + h * qk + nope, rope, q);
        rope_rotate(layer.rope, cs.data(), q, 1);
      }
    }
  });
  // an 8-bit cache holds no NaN or infinity: refused before anything is written
  const bool codes = is_kv_code(cache.dtype);
  if (codes) {
    const std::int64_t bad = first_nonfinite_row(Lr, dtype_of<T>(), M, W, W);
    if (bad >= 0)
      throw Error("cache", "sequence " + num(bad / S) + ", token " + num(cache.lengths[static_cast<std::size_t>(bad / S)] + bad % S) +
                               ": its latent row holds a NaN or an infinity, which a " + std::string(dtype_name(cache.dtype)) +
                               " cache cannot represent (the cache is unchanged)");
  }
  // appended at each sequence's length (converted, or quantized per row)
  const KvStore store = cache_store(cache);
  const auto esize = static_cast<std::int64_t>(dtype_size(cache.dtype));
  float* tmp = codes ? thread_buffer<float, scratch::MhaCacheQ>().get(static_cast<std::size_t>(W)) : nullptr;
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t b = r / S, slot = cache.lengths[static_cast<std::size_t>(b)] + r % S;
    const std::int64_t at = b * store.block_stride + slot * W;
    if (codes)
      quantize_row(cache.dtype, Lr + r * W, dtype_of<T>(), W, tmp, reinterpret_cast<std::uint8_t*>(store.k) + at,
                   store.k_scale + b * store.scale_stride + slot);
    else
      convert_elements(Lr + r * W, dtype_of<T>(), store.k + at * esize, cache.dtype, W);
  }
  // every head over the latent rows (keys: whole rows; values: their first kvl columns)
  std::vector<StoreSeq> seqs;
  cache_seqs(cache, S, 0, seqs);
  AttentionOptions a;
  add_config_options(c, a);
  a.threads = threads;
  a.backend = opt.backend;
  store_attention_rows(H, H * W, H * kvl, Qa, H * W, store, seqs, Oa, a);
  for (std::int64_t h = 0; h < H; ++h)
    project(Oa + h * kvl, M, kvl, H * kvl, layer.w_uv[static_cast<std::size_t>(h)], 0, vd, static_cast<const T*>(nullptr),
            O + h * vd, H * vd, threads);
  project(O, M, H * vd, H * vd, layer.wo, 0, d, layer.bo.empty() ? nullptr : layer.bo.data(), static_cast<T*>(out.data), d,
          threads);
  for (std::int64_t b = 0; b < B; ++b) cache.lengths[static_cast<std::size_t>(b)] += S;
}

#define SIMDATTN_MLA_CACHED(T)                                                                                  \
  template void mla_cached_forward(const MlaStorage<T>&, const ConstSeqView&, CacheState&, const SeqView&,        \
                                   const MhaOptions&);
SIMDATTN_MLA_CACHED(float)
SIMDATTN_MLA_CACHED(double)
SIMDATTN_MLA_CACHED(bfloat16)
SIMDATTN_MLA_CACHED(float16)
#undef SIMDATTN_MLA_CACHED

}  // namespace simdattn::detail

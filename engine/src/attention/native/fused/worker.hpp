// The per-thread worker of the fused path and of the decode paths' stacked rows
// (attention/native/fused/fused.cpp, attention/native/decode.cpp): a unit's rows (RowBlock)
// against a range of its keys, its key/value block state, prefetches, softmax step rows and
// output, whole or as a part of a split unit (core/partial.hpp); its vector-unit steps are in
// vector_steps.hpp, its AMX tile steps in tile_steps.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "attention/native/fused/plan.hpp"
#include "attention/native/rows.hpp"
#include "attention/native/work.hpp"
#include "core/modifiers.hpp"
#include "core/partial.hpp"
#include "core/position_rule.hpp"
#include "linalg/convert.hpp"
#include "runtime/prefetch.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
// Part of the files that include it (fused.cpp, decode.cpp): internal linkage, as if written there.
namespace {

template <class T, class S>
class FusedWorker {
  static constexpr bool kWiden = !std::is_same_v<S, T>;

 public:
  FusedWorker(const FusedPlan<T, S>& plan, T* scratch_base);

  // Computes the rows of rb against keys [k0, k1) (whole key blocks, or the last keys): into the
  // output, or (part not null) as partial rows m, l, acc at part (store_part's layout).
  void run(const RowBlock& rb, std::int64_t k0, std::int64_t k1, T* part);
  // The work plan's interface (work.hpp): an item of a unit; a split unit's parts merged and
  // written; the end of the thread's share (releases the tiles).
  void run(const WorkUnit& u, const WorkItem& it, T* parts) {
    run(u.rows, it.k0, it.k1, it.part < 0 ? nullptr : parts + it.part);
  }
  void finish(const WorkUnit& u, std::span<const PartRows<T>> parts);
  void end() const {
    if (plan_.amx) tiles().done();
  }

 private:
  // K^T of kv head (b, hk) as B panels of tile_cols keys: block jb, panel c, row d holds keys
  // j0 + c*nr .. + nr - 1 at dimension d. V as B panels of tile_cols columns: block jb, panel c,
  // row j holds V[j0 + j, c*tile_cols .. + tile_cols - 1]. Zero past the key length L[b] and Dv. A block is
  // packed when a query block first computes it (blocks past L[b] are hidden, never visited:
  // K/V past L[b] are never read, and a large, mostly empty KV cache costs only its used part),
  // its rows prefetched while the block before it is computed. Block jb lives in slot jb %
  // k_slots (FusedPlan). The rows come from the key source run by run (a paged cache's blocks).
  void start_kv(std::int64_t b, std::int64_t hk);
  std::int64_t slot(std::int64_t jb) const { return jb % plan_.k_slots; }
  bool packed(std::int64_t jb) const { return packed_[slot(jb)] == T(jb + 1); }
  void pack_block(std::int64_t jb);
  // pack_block for 8-bit K/V codes: the block's code rows dequantized into conv_ (f32, one K
  // panel or the V block at a time), packed from there.
  void pack_block_codes(std::int64_t jb);
  // The rows of key block jb, if it holds keys below L[b] and is not packed yet, become the
  // next prefetches of the micro-kernels.
  void prefetch_block(std::int64_t jb);
  // K and V rows j0 .. j0 + rows - 1 of kv head (b, hk) become the next prefetches.
  void prefetch_kv(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t rows);
  // Query head h's kv head.
  std::int64_t kv_head(std::int64_t h) const { return h / (prob_.H / prob_.Hkv); }
  // The runs of the current kv head's keys [j0, j0 + n): f(offset from j0, run), in key order.
  template <class F>
  void for_runs(std::int64_t j0, std::int64_t n, F&& f) const {
    for (std::int64_t j = j0; j < j0 + n;) {
      const KeyRun r = prob_.key_run(packed_b_, j, j0 + n);
      f(j - j0, r);
      j += r.n;
    }
  }
  // A run's first K and V rows in the current kv head (8-bit codes: their bytes, and scales).
  const S* k_rows(const KeyRun& r) const { return static_cast<const S*>(prob_.k) + prob_.k_at(r, packed_hk_); }
  const S* v_rows(const KeyRun& r) const { return static_cast<const S*>(prob_.v) + prob_.v_at(r, packed_hk_); }
  const std::uint8_t* k_codes(const KeyRun& r) const { return static_cast<const std::uint8_t*>(prob_.k) + prob_.k_at(r, packed_hk_); }
  const std::uint8_t* v_codes(const KeyRun& r) const { return static_cast<const std::uint8_t*>(prob_.v) + prob_.v_at(r, packed_hk_); }
  const float* k_scales(const KeyRun& r) const { return prob_.k_scale + prob_.k_scale_at(r, packed_hk_); }
  const float* v_scales(const KeyRun& r) const { return prob_.v_scale + prob_.v_scale_at(r, packed_hk_); }

  // The Q rows the next query block of head (b, h) reads in place and the output rows it
  // writes (from row i1 on), after any K/V rows: prefetched while the current block's first
  // key block is computed (one head's rows only).
  void prefetch_next_rows(std::int64_t b, std::int64_t h, std::int64_t i1);

  // K and V of the first key block of the kv head that the item after head (b, h)'s last query
  // block starts, if another: prefetched while that last block is computed, so that a call whose
  // operands are not in cache (a service's request, after other requests ran) does not wait on
  // memory at the start of each head. (Its Q and O rows too, or the K/V of the next head already
  // from the first query block on, were slower: the micro-kernels' prefetch budget is spent on
  // lines needed later.)
  void prefetch_next_head(std::int64_t b, std::int64_t h);

  // The block's Q rows as a pointer and row stride the micro-kernel can read in place: Q itself
  // when they are one head's rows contiguous in D, else a copy (stacked heads: gathered).
  void prepare_q(const RowBlock& rb, std::int64_t br);

  // S[0:br, a:a + round_up(n, lanes)] = Q_blk K^T for keys a .. a + n - 1 of key block jb
  // (unscaled; a is a multiple of the vector width). Each panel runs only the vectors it has
  // keys for: the first from vector offset o (aligned: the panel's rows are), the last up to
  // its last key.
  void scores(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br);

  // Scale and mask S, then the online softmax step for the block's rows (VectorKernels::
  // softmax_rows): P = exp(S - m_new) in place, l and O rescaled where the row max grew.
  // Keys j0 .. j0 + nk - 1 sit at column a of S. Fully visible blocks are scaled inside that
  // step; the others are scaled and masked row by row first.
  void softmax_update(const RowBlock& rb, std::int64_t br, std::int64_t j0, std::int64_t a, std::int64_t nk, Cover cover,
                      bool first);

  // How the softmax step sees rows r0 .. r0 + rows - 1 of the block for keys j0 .. j0 + nk - 1
  // (at column a of S): all keys at the call's scale, or (key lengths, causal and windows
  // only) one visible interval per row, which the softmax step itself keeps to, or (masks,
  // sparse patterns and score modifiers) scaled, modified and masked here, row by row. A soft
  // cap alone (no ALiBi, T5 bias, mask or sparse pattern) is the step's own where it takes one
  // (step_cap: the f32 and f64 step; the AMX step does not). Score modifiers come with one
  // head's rows only (the decode paths, which stack heads, do not apply them).
  struct StepRows {
    T scale;
    T cap;
    const std::int64_t* lo;
    const std::int64_t* hi;
  };
  StepRows step_rows(const RowBlock& rb, std::int64_t r0, std::int64_t rows, std::int64_t j0, std::int64_t a,
                     std::int64_t nk, Cover cover, bool step_cap);

  // O rows r0 .. r0 + rows - 1 rescaled by the softmax step's alpha where it is not 1.
  void rescale_out(std::int64_t r0, std::int64_t rows);

  // O[0:br, :] = P[0:br, a:a + n] V_blk[a:a + n, :] + beta * O
  void accumulate(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br, T beta);

  // The block's output rows from O, m and l: sinks and lse (finish_row), normalised, narrowed.
  void write_out(const RowBlock& rb, std::int64_t br);

  // ---- AMX (FusedPlan::amx; S is bfloat16) ----
  static std::uint16_t bits_at(const S* p) {
    std::uint16_t u;
    std::memcpy(&u, p, 2);
    return u;
  }
  const simd::TileAttentionKernels& tiles() const { return plan_.kt.tile_attention; }
  std::uint16_t* k16_panel(std::int64_t jb, std::int64_t c) const {
    return k16_ + (slot(jb) * (plan_.k_keys / 32) + c) * plan_.dp * 32;
  }
  std::uint16_t* v16_panel(std::int64_t jb, std::int64_t c) const {
    return v16_ + (slot(jb) * round_up(prob_.Dv, 32) / 32 + c) * plan_.k_keys * 32;
  }
  // K of block jb: per panel of 32 keys, pair-row r holds (K[j, 2r], K[j, 2r + 1]) of its 32 keys;
  // V: per panel of 32 columns, pair-row r holds (V[2r, c], V[2r + 1, c]) of its 32 columns. Zero
  // past the key length, D and Dv.
  void pack_block_amx(std::int64_t jb);
  // pack_block_amx from the block's runs of rows: runs(f) calls f(offset in the block, rows, K's
  // first row, its row and element strides, V's first row, its strides) for each run, in key
  // order.
  template <class Runs>
  void pack_block_amx_runs(std::int64_t jb, Runs&& runs);
  // The Q block as tiles: per group of 32 rows and step of 32 of D, 32 rows of 32 bf16 (one
  // head's rows, or stacked heads' rows each gathered from where it lies).
  void prepare_q_amx(const RowBlock& rb, std::int64_t br);
  // One step (keys a .. a + n - 1 of key block jb) on tiles, three phases for each of the block's
  // groups of 32 query rows: S = Q K^T over the panels of 32 keys covering the keys (unscaled);
  // the softmax step writing P as bf16 tiles over those panels (zeros outside the keys), and O's
  // rows rescaled; O (+)= P V. Software-pipelined over the groups (group g's softmax between group
  // g + 1's S products and group g - 1's PV products): each buffer is read a group after the other
  // unit wrote it (docs/matrix-kernels.md).
  void step_amx(const RowBlock& rb, std::int64_t br, std::int64_t jb, std::int64_t a, std::int64_t n, Cover cover,
                bool first);

  // rows x cols 8-bit codes (rows rs bytes apart, elements cs apart) times their rows' scales (ss
  // apart) to f32 rows of dst, ld apart.
  void dequantize_rows(const std::uint8_t* src, std::int64_t rs, std::int64_t cs, const float* sc, std::int64_t ss,
                       std::int64_t rows, std::int64_t cols, float* dst, std::int64_t ld) const {
    const simd::Quant8Kernels& q8 = plan_.kt.code8(code8_of(prob_.kv_dtype));
    for (std::int64_t r = 0; r < rows; ++r) {
      if (cs == 1) {
        q8.dequantize(src + r * rs, cols, sc[r * ss], dst + r * ld);
        continue;
      }
      for (std::int64_t c = 0; c < cols; ++c) dst[r * ld + c] = code8_value(prob_.kv_dtype, src[r * rs + c * cs]) * sc[r * ss];
    }
  }
  // The code rows of keys [j0, j0 + n) (K: kv 0, V: 1) of the current kv head dequantized to
  // rows of dst, ld apart.
  void dequantize_keys(int kv, std::int64_t j0, std::int64_t n, float* dst, std::int64_t ld) const {
    const Shape4& st = kv == 0 ? prob_.k_strides : prob_.v_strides;
    const std::int64_t ss = kv == 0 ? prob_.k_scale_strides[2] : prob_.v_scale_strides[2];
    const std::int64_t width = kv == 0 ? prob_.D : prob_.Dv;
    for_runs(j0, n, [&](std::int64_t off, const KeyRun& r) {
      dequantize_rows(kv == 0 ? k_codes(r) : v_codes(r), st[2], st[3], kv == 0 ? k_scales(r) : v_scales(r), ss, r.n, width,
                      dst + off * ld, ld);
    });
  }

  // rows x cols elements of stored rows (strides rs, cs) widened to dst (row stride ld).
  static void widen_rows(const S* src, std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t cols, T* dst,
                         std::int64_t ld) {
    convert_matrix(src, dtype_of<S>(), rs, cs, rows, cols, dst, dtype_of<T>(), ld);
  }

  const FusedPlan<T, S>& plan_;
  const Problem& prob_;
  T *kp_, *vp_, *qp_, *sb_, *ob_, *m_, *l_, *alpha_;
  T* packed_;  // packed_[slot] = jb + 1: key block jb of the current kv head is packed there
  T* conv_;    // 16-bit storage: widened K rows of one panel
  std::uint16_t *k16_ = nullptr, *v16_ = nullptr, *q16_ = nullptr, *p16_ = nullptr;  // AMX (FusedPlan::amx)
  std::uint16_t* stage16_ = nullptr;  // tiles over 8-bit codes: a block's K then V rows in bf16
  std::array<const S*, kMaxBlockK> v_row_{};  // tiles: the block's V rows, where they lie
  std::int64_t key_len_ = 0;
  NextRows next_;
  std::array<std::int64_t, kMaxBlockQ> lo_{}, hi_{};  // visible key intervals of a block's rows
  std::array<T, kMaxBlockK + kMaxBlockQ> bias_line_{};  // ALiBi and T5 along a step's relative positions
  T* t5_by_rel_ = nullptr;                              // T5's bias of head t5_head_ by relative position
  std::int64_t t5_head_ = -1;
  const T* q_ = nullptr;   // the current Q block's rows, ldq_ apart
  // Causal, window, key lengths or a sparse pattern: mixed blocks may have hidden key panels.
  const bool structured_ = prob_.causal != Causal::none || prob_.has_window || prob_.key_lengths != nullptr || prob_.sparse();
  std::int64_t ldq_ = 0;
  std::int64_t packed_b_ = -1, packed_hk_ = -1;
};

template <class T, class S>
inline FusedWorker<T, S>::FusedWorker(const FusedPlan<T, S>& plan, T* scratch_base) : plan_(plan), prob_(plan.p) {
  T* s = scratch_base;
  kp_ = s, s += plan.k_size;
  vp_ = s, s += plan.v_size;
  qp_ = s, s += plan.q_size;
  sb_ = s, s += plan.s_size;
  ob_ = s, s += plan.o_size;
  m_ = s, s += plan.row_size;
  l_ = s, s += plan.row_size;
  alpha_ = s, s += plan.row_size;
  packed_ = s, s += plan.flag_size;
  conv_ = s, s += plan.conv_size;
  t5_by_rel_ = s, s += plan.t5_size;
  k16_ = reinterpret_cast<std::uint16_t*>(s), s += plan.k16_size;
  v16_ = reinterpret_cast<std::uint16_t*>(s), s += plan.v16_size;
  q16_ = reinterpret_cast<std::uint16_t*>(s), s += plan.q16_size;
  p16_ = reinterpret_cast<std::uint16_t*>(s), s += plan.p16_size;
  stage16_ = reinterpret_cast<std::uint16_t*>(s);
}

template <class T, class S>
inline void FusedWorker<T, S>::run(const RowBlock& rb, std::int64_t k0, std::int64_t k1, T* part) {
  const std::int64_t b = rb.b, br = rb.rows();
  const bool one_head = rb.heads == 1;
  if (b != packed_b_ || rb.hk != packed_hk_) start_kv(b, rb.hk);
  prepare_q(rb, br);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r = 0; r < br; ++r) m_[r] = neg_inf, l_[r] = T(0);
  const std::int64_t i0 = rb.i0, i1 = rb.i0 + rb.tokens;  // the block's tokens (every head's)
  const bool last_block = one_head && i1 >= prob_.query_len(b);

  // O is not cleared: the first computed block writes it (beta = 0); until then every row
  // max is -inf, so no rescale reads it. A query block with no visible key never reads it.
  bool first = true;
  // Keys [j0 + a, j0 + a + n) of key block jb (a a multiple of the vector width).
  auto step = [&](std::int64_t jb, std::int64_t a, std::int64_t n, Cover cover) {
    const std::int64_t j0 = jb * plan_.k_keys;
    if (!packed(jb)) pack_block(jb);
    prefetch_block(jb + 1);
    if (first && one_head) prefetch_next_rows(b, rb.h0, i1);
    if (last_block && (jb + 1) * plan_.k_keys >= k1) prefetch_next_head(b, rb.h0);
    if (plan_.amx) {
      step_amx(rb, br, jb, a, n, cover, first);
    } else {
      scores(jb, a, n, br);
      softmax_update(rb, br, j0 + a, a, n, cover, first);
      accumulate(jb, a, n, br, first ? T(0) : T(1));
    }
    first = false;
  };
  for (std::int64_t jb = k0 / plan_.k_keys; jb * plan_.k_keys < k1; ++jb) {
    const std::int64_t j0 = jb * plan_.k_keys, nk = std::min(plan_.k_keys, prob_.Sk - j0);
    const Cover cover = classify(prob_, b, i0, i1, j0, j0 + nk);
    if (cover == Cover::hidden) continue;
    if (cover == Cover::mixed && structured_) {
      // A block at the edge of the visible region (causal diagonal, window edge, key length,
      // block mask): its runs of one vector's width of keys that no row of the query block sees
      // are skipped; runs of the others go as one step. (Whole 64-key panels would compute
      // ~10% more keys than visible on long with window 512: sparse/native/long-window512.)
      const std::int64_t w = plan_.lanes;
      for (std::int64_t a = 0; a < nk;) {
        std::int64_t e = a;
        bool all_full = true;
        while (e < nk) {
          const std::int64_t n = std::min(w, nk - e);
          const Cover sub = classify(prob_, b, i0, i1, j0 + e, j0 + e + n);
          if (sub == Cover::hidden) break;
          all_full = all_full && sub == Cover::full;
          e += n;
        }
        if (e > a) step(jb, a, e - a, all_full ? Cover::full : Cover::mixed);
        a = e < nk ? e + std::min(w, nk - e) : e;  // past the hidden run
      }
      continue;
    }
    step(jb, 0, nk, cover);
  }
  if (part != nullptr) store_part(part, br, prob_.Dv, m_, l_, ob_, plan_.dv_padded);
  else write_out(rb, br);
}

template <class T, class S>
inline void FusedWorker<T, S>::finish(const WorkUnit& u, std::span<const PartRows<T>> parts) {
  const std::int64_t br = u.rows.rows();
  for (std::int64_t r = 0; r < br; ++r) m_[r] = merge_parts(parts, r, prob_.Dv, l_[r], ob_ + r * plan_.dv_padded);
  write_out(u.rows, br);
}

template <class T, class S>
inline void FusedWorker<T, S>::start_kv(std::int64_t b, std::int64_t hk) {
  key_len_ = prob_.key_len(b);
  std::fill(packed_, packed_ + plan_.k_slots, T(0));
  packed_b_ = b;
  packed_hk_ = hk;
}

template <class T, class S>
inline void FusedWorker<T, S>::prefetch_block(std::int64_t jb) {
  next_.clear();
  const std::int64_t j0 = jb * plan_.k_keys;
  if (jb >= plan_.k_blocks || j0 >= key_len_ || packed(jb)) return;
  prefetch_kv(packed_b_, packed_hk_, j0, std::min(plan_.k_keys, key_len_ - j0));
}

template <class T, class S>
inline void FusedWorker<T, S>::prefetch_kv(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t rows) {
  const bool codes = prob_.kv_codes();
  for (int kv = 0; kv < 2; ++kv)
    for (std::int64_t j = j0; j < j0 + rows;) {
      const KeyRun r = prob_.key_run(b, j, j0 + rows);
      const Shape4& st = kv == 0 ? prob_.k_strides : prob_.v_strides;
      const std::int64_t at = kv == 0 ? prob_.k_at(r, hk) : prob_.v_at(r, hk), width = kv == 0 ? prob_.D : prob_.Dv;
      if (codes) next_.add(static_cast<const std::uint8_t*>(kv == 0 ? prob_.k : prob_.v) + at, st[2], st[3], r.n, width);
      else next_.add(static_cast<const S*>(kv == 0 ? prob_.k : prob_.v) + at, st[2], st[3], r.n, width);
      j += r.n;
    }
}

template <class T, class S>
inline void FusedWorker<T, S>::prefetch_next_rows(std::int64_t b, std::int64_t h, std::int64_t i1) {
  if (i1 >= prob_.query_len(b)) return;
  const std::int64_t rows = std::min(plan_.q_rows, prob_.query_len(b) - i1);
  next_.add(static_cast<const S*>(prob_.q) + prob_.q_offset(b, h, i1), prob_.q_strides[2], prob_.q_strides[3], rows, prob_.D);
  next_.add(static_cast<const S*>(prob_.o) + prob_.o_offset(b, h, i1), prob_.o_strides[2], prob_.o_strides[3], rows, prob_.Dv);
}

template <class T, class S>
inline void FusedWorker<T, S>::prefetch_next_head(std::int64_t b, std::int64_t h) {
  std::int64_t nb = b, nh = h + 1;
  if (nh == prob_.H) nb = b + 1, nh = 0;
  if (nb >= prob_.B) return;
  const std::int64_t nhk = kv_head(nh);
  if (nb == packed_b_ && nhk == packed_hk_) return;
  const std::int64_t rows = std::min(plan_.k_keys, prob_.key_len(nb));
  if (rows > 0) prefetch_kv(nb, nhk, 0, rows);
}

template <class T, class S>
inline auto FusedWorker<T, S>::step_rows(const RowBlock& rb, std::int64_t r0, std::int64_t rows, std::int64_t j0,
                                         std::int64_t a, std::int64_t nk, Cover cover, bool step_cap) -> StepRows {
  StepRows sr{static_cast<T>(prob_.scale), T(0), nullptr, nullptr};
  const std::int64_t b = rb.b;
  const bool cap_in_step = step_cap && prob_.softcap > 0.0 && prob_.alibi == nullptr && prob_.t5_table == nullptr &&
                           !prob_.sparse() && prob_.mask_kind == MaskKind::none;
  const bool modified = prob_.scores_modified() && !cap_in_step;
  if (cap_in_step) sr.cap = static_cast<T>(prob_.softcap);
  if (cover == Cover::full && !modified) return sr;
  if (!prob_.sparse() && prob_.mask_kind == MaskKind::none && !modified) {
    for (std::int64_t r = r0; r < r0 + rows; ++r) {
      const KeyRange keys = row_keys_in(prob_, b, rb.token(r), j0, nk);
      lo_[r] = keys.lo, hi_[r] = keys.hi;
    }
    sr.lo = lo_.data() + r0, sr.hi = hi_.data() + r0;
    return sr;
  }
  // ALiBi and T5 (one head's rows): one line for these rows (row r reads it from r0 + rows - 1 - r on)
  const T* line = nullptr;
  if (prob_.alibi != nullptr || prob_.t5_table != nullptr) {
    const std::int64_t h = rb.h0, i0 = rb.i0;
    if (prob_.t5_table != nullptr && t5_head_ != h) {  // T5's bias by relative position, per head
      fill_t5_by_rel(prob_, h, plan_.t5_reach, t5_by_rel_);
      t5_head_ = h;
    }
    fill_bias_line(prob_, h, j0 - (i0 + r0 + rows - 1 + prob_.query_offset(b)), nk + rows - 1, bias_line_.data(),
                   prob_.t5_table != nullptr ? t5_by_rel_ : nullptr);
    line = bias_line_.data();
  }
  // Without a mask or sparse pattern, an edge block's rows keep to their visible interval in
  // the step too (not its -inf around it: half of a causal diagonal block)
  const bool intervals = cover != Cover::full && !prob_.sparse() && prob_.mask_kind == MaskKind::none;
  for (std::int64_t r = r0; r < r0 + rows; ++r) {
    scale_mask_row(prob_, plan_.vk, sb_ + r * plan_.k_keys + a, b, rb.head(r), rb.token(r), j0, nk, false,
                   line != nullptr ? line + (r0 + rows - 1 - r) : nullptr);
    if (intervals) {
      const KeyRange keys = row_keys_in(prob_, b, rb.token(r), j0, nk);
      lo_[r] = keys.lo, hi_[r] = keys.hi;
    }
  }
  if (intervals) sr.lo = lo_.data() + r0, sr.hi = hi_.data() + r0;
  sr.scale = T(1);
  return sr;
}

template <class T, class S>
inline void FusedWorker<T, S>::rescale_out(std::int64_t r0, std::int64_t rows) {
  for (std::int64_t r = r0; r < r0 + rows; ++r) {
    if (alpha_[r] == T(1)) continue;
    T* o = ob_ + r * plan_.dv_padded;
    // alpha = -1: the row's first visible key. What earlier blocks left in its O row is
    // 0 * V of keys it cannot see, which is NaN where such V is Inf or NaN: start from zeros.
    if (alpha_[r] < T(0)) std::fill(o, o + plan_.dv_computed, T(0));
    else plan_.vk.scale(o, plan_.dv_computed, alpha_[r]);
  }
}

template <class T, class S>
inline void FusedWorker<T, S>::write_out(const RowBlock& rb, std::int64_t br) {
  const std::int64_t b = rb.b;
  if (!prob_.online_softmax_only())  // sinks join l, lse written
    for (std::int64_t r = 0; r < br; ++r) finish_row(prob_, b, rb.head(r), rb.token(r), m_[r], l_[r]);
  if (rb.heads > 1) {  // stacked rows: each where it belongs
    for (std::int64_t r = 0; r < br; ++r) {
      T* acc = ob_ + r * plan_.dv_padded;
      S* dst = static_cast<S*>(prob_.o) + prob_.o_offset(b, rb.head(r), rb.token(r));
      if constexpr (kWiden) {
        plan_.vk.normalize_rows(acc, plan_.dv_padded, 1, prob_.Dv, l_ + r, acc, plan_.dv_padded);
        convert_matrix(acc, dtype_of<T>(), prob_.Dv, 1, 1, prob_.Dv, dst, dtype_of<S>(), prob_.o_strides[2], prob_.o_strides[3]);
      } else {
        write_output_row(prob_, plan_.vk, acc, l_[r], dst);
      }
    }
    return;
  }
  const std::int64_t h = rb.h0, i0 = rb.i0;
  if constexpr (kWiden) {
    // normalised in place, its rows packed Dv apart (rows with l == 0 become zeros), then
    // narrowed to nearest even: one conversion call where out's rows are dense too (sdcross's
    // 40-wide rows: a call per row took 13% of sdcross.bf16)
    S* o = static_cast<S*>(prob_.o) + prob_.o_offset(b, h, i0);
    plan_.vk.normalize_rows(ob_, plan_.dv_padded, br, prob_.Dv, l_, ob_, prob_.Dv);
    convert_matrix(ob_, dtype_of<T>(), prob_.Dv, 1, br, prob_.Dv, o, dtype_of<S>(), prob_.o_strides[2], prob_.o_strides[3]);
  } else {
    T* o = static_cast<T*>(prob_.o) + prob_.o_offset(b, h, i0);
    if (prob_.o_strides[3] == 1) {
      plan_.vk.normalize_rows(ob_, plan_.dv_padded, br, prob_.Dv, l_, o, prob_.o_strides[2]);
      return;
    }
    for (std::int64_t r = 0; r < br; ++r)
      write_output_row(prob_, plan_.vk, ob_ + r * plan_.dv_padded, l_[r], o + r * prob_.o_strides[2]);
  }
}

}  // namespace
}  // namespace simdattn::detail

// The native backend's decode paths (decode: f32/f64, decode16: bf16/f16 K and V, decode8: 8-bit
// K and V codes): a few query tokens a sequence (at most kDecodeMaxTokens: a new token against a
// KV cache, a speculative step's drafts), bound by reading K and V. Per (sequence, kv head) the
// group's query heads are one block of rows (RowBlock: heads x tokens, e.g. 8 x 1 for a
// grouped-query decode step, 128 x 1 for MLA's latent cache), so each K and V row is read once
// for the whole group:
//   a few rows     (up to 8: a grouped-query step of one token) S = Qg K^T, P = softmax(S),
//                  acc = P V on the few-rows kernels (RowsKernels), which read each K and V row
//                  where it lies, once for all the rows, nothing packed (FewRows, below)
//   more rows      (MQA's 32 heads, MLA's 16-128) the fused path's worker over stacked rows
//                  (fused/worker.hpp): each key block packed once (widened, or dequantized from
//                  codes) and S = Qg K^T, the online softmax and O += P V on the in-place-A
//                  micro-kernel: grouped heads make such a step compute-bound. bf16 q on a
//                  table with tile kernels (fused_on_tiles): the block packed as the tiles' bf16
//                  pairs and both products on AMX tiles or vdpbf16ps (tile_steps.hpp), Q's
//                  stacked rows gathered into tiles
// A sequence's keys are split when the (sequence, kv head) units are few (work.hpp): a long
// sequence's step spreads over every thread and its parts merge in key order. Keys come from the
// key source (dense, or a paged cache's blocks) run by run.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <xmmintrin.h>

#include "attention/native/fused/plan.hpp"
#include "attention/native/fused/tile_steps.hpp"
#include "attention/native/fused/vector_steps.hpp"
#include "attention/native/fused/worker.hpp"
#include "attention/native/paths.hpp"
#include "attention/native/rows.hpp"
#include "attention/native/work.hpp"
#include "core/element.hpp"
#include "core/partial.hpp"
#include "core/position_rule.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

namespace scratch {
struct DecodeRow : ScratchSlot {};  // FewRows' q rows, scores, outputs, m and l
}  // namespace scratch

namespace {

// The rows of V's first run fetched while K's last is read (FewRows::for_runs); within K's or V's
// runs the products fetch rows kGemvPrefetchRows (16) ahead, into the next run.
constexpr std::int64_t kRunPrefetchRows = 16;

// A few query rows (at most kMaxProductRows: a group's heads of one token, as a grouped-query
// decode step has) against a range of their keys: their scores from K's rows, each row's softmax,
// their outputs from V's rows, each K and V row read once for all of them, where it lies
// (RowsKernels: K's and V's rows streamed once, nothing packed). T: computed in (f32, f64); S:
// q's and out's dtype (T, or bf16 / f16); K and V of S, or 8-bit codes.
template <class T, class S>
class FewRows {
 public:
  FewRows(const Problem& p, const simd::KernelTable& kt, std::int64_t max_keys)
      : p_(p), kt_(kt), vk_(kt.vec<T>()), rows_(rows_kernels(p, kt)) {
    const std::int64_t q_size = round_up(simd::kMaxProductRows * p.D, kLineElems<T>);
    lds_max_ = round_up(std::max<std::int64_t>(1, max_keys), kLineElems<T>);
    const std::int64_t o_size = round_up(simd::kMaxProductRows * p.Dv, kLineElems<T>);
    q_ = thread_buffer<T, scratch::DecodeRow>().get(
        static_cast<std::size_t>(q_size + simd::kMaxProductRows * lds_max_ + o_size + 2 * simd::kMaxProductRows));
    s_ = q_ + q_size;
    acc_ = s_ + simd::kMaxProductRows * lds_max_;
    m_ = acc_ + o_size;
    l_ = m_ + simd::kMaxProductRows;
  }

  void run(const WorkUnit& u, const WorkItem& it, T* parts) {
    const RowBlock& rb = u.rows;
    const std::int64_t b = rb.b, hk = rb.hk, k0 = it.k0, n = it.k1 - it.k0, R = rb.rows();
    const std::int64_t lds = round_up(std::max<std::int64_t>(1, n), kLineElems<T>);
    const int m = static_cast<int>(R);
    bool any = false;
    for (std::int64_t r = 0; r < R; ++r) m_[r] = -std::numeric_limits<T>::infinity(), l_[r] = T(0);
    if (n > 0) {
      for (std::int64_t r = 0; r < R; ++r) {
        const S* q = static_cast<const S*>(p_.q) + p_.q_offset(b, rb.head(r), rb.token(r));
        for (std::int64_t d = 0; d < p_.D; ++d) q_[r * p_.D + d] = static_cast<T>(widen(q[d * p_.q_strides[3]]));
      }
      for_runs(b, hk, k0, n, 0, [&](std::int64_t off, const KeyRun& run, const void* next) {
        rows_.dot(m, run.n, p_.D, T(1), q_, p_.D, k_rows(run, hk), p_.k_strides[2], k_scales(run, hk), p_.k_scale_strides[2],
                  s_ + off, lds, next);
      });
      for (std::int64_t r = 0; r < R; ++r) {
        const std::int64_t i = rb.token(r);
        T* row = s_ + r * lds;
        const bool full = classify(p_, b, i, i + 1, k0, k0 + n) == Cover::full;
        m_[r] = scale_mask_row(p_, vk_, row, b, rb.head(r), i, k0, n, full);
        l_[r] = vk_.exp_sub_max_sum(row, n, m_[r]);  // no visible key: zeros, l = 0
        any = any || l_[r] != T(0);
      }
      if (any)
        for_runs(b, hk, k0, n, 1, [&](std::int64_t off, const KeyRun& run, const void* next) {
          rows_.weighted(m, p_.Dv, run.n, T(1), s_ + off, lds, v_rows(run, hk), p_.v_strides[2], v_scales(run, hk),
                         p_.v_scale_strides[2], off == 0 ? T(0) : T(1), acc_, p_.Dv, next);
        });
    }
    if (it.part >= 0) {
      store_part(parts + it.part, R, p_.Dv, m_, l_, acc_, p_.Dv);
      return;
    }
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t h = rb.head(r), i = rb.token(r);
      finish_row(p_, b, h, i, m_[r], l_[r]);  // the sink joins l; lse written
      S* dst = static_cast<S*>(p_.o) + p_.o_offset(b, h, i);
      T* acc = acc_ + r * p_.Dv;
      if constexpr (std::is_same_v<S, T>) {
        write_output_row(p_, vk_, acc, l_[r], dst);  // l == 0 (no visible key): zeros
      } else {
        const T inv = l_[r] == T(0) ? T(0) : T(1) / l_[r];
        for (std::int64_t d = 0; d < p_.Dv; ++d) dst[d * p_.o_strides[3]] = l_[r] == T(0) ? S{} : narrow<S>(acc[d] * inv);
      }
    }
  }

 private:
  static const simd::RowsKernels<T>& rows_kernels(const Problem& p, const simd::KernelTable& kt) {
    if constexpr (std::is_same_v<T, float>) {
      if (p.kv_codes()) return kt.code8(code8_of(p.kv_dtype)).rows;
      if constexpr (!std::is_same_v<S, T>) return std::is_same_v<S, float16> ? kt.rows_f16 : kt.rows_bf16;
    }
    return kt.gemm<T>().rows;
  }
  // A run's first K and V rows in kv head hk (the codes' bytes, or S's elements), and their
  // scales (8-bit codes; else null).
  const void* k_rows(const KeyRun& r, std::int64_t hk) const {
    return static_cast<const char*>(p_.k) + p_.k_at(r, hk) * element_bytes();
  }
  const void* v_rows(const KeyRun& r, std::int64_t hk) const {
    return static_cast<const char*>(p_.v) + p_.v_at(r, hk) * element_bytes();
  }
  const float* k_scales(const KeyRun& r, std::int64_t hk) const { return p_.kv_codes() ? p_.k_scale + p_.k_scale_at(r, hk) : nullptr; }
  const float* v_scales(const KeyRun& r, std::int64_t hk) const { return p_.kv_codes() ? p_.v_scale + p_.v_scale_at(r, hk) : nullptr; }
  std::int64_t element_bytes() const { return p_.kv_codes() ? 1 : static_cast<std::int64_t>(sizeof(S)); }

  // f(offset from j0, run, next) for the runs of keys [j0, j0 + n) of kv head (b, hk), K's (kv 0)
  // or V's, next the first row of the run after it (null after the last). A paged cache's next
  // block is a jump the hardware prefetcher would start over at: the products fetch the next
  // run's first rows as they read their own last ones, as they fetch their own rows ahead, and
  // K's last run is followed by V's first run's first rows and a run by its successor's scales
  // (guarded by attention/native/paged-decode*).
  template <class F>
  void for_runs(std::int64_t b, std::int64_t hk, std::int64_t j0, std::int64_t n, int kv, F&& f) const {
    KeyRun r = p_.key_run(b, j0, j0 + n);
    for (std::int64_t j = j0; j < j0 + n;) {
      const bool last = j + r.n == j0 + n;
      const KeyRun next = last ? KeyRun{} : p_.key_run(b, j + r.n, j0 + n);
      if (p_.paged()) {
        if (!last) prefetch_scales(next, hk, kv);
        else if (kv == 0) prefetch_run(p_.key_run(b, j0, j0 + n), hk, 1);
      }
      f(j - j0, r, last ? nullptr : (kv == 0 ? k_rows(next, hk) : v_rows(next, hk)));
      j += r.n;
      r = next;
    }
  }
  // Run r's first kRunPrefetchRows rows of K (kv 0) or V, and its scales.
  void prefetch_run(const KeyRun& r, std::int64_t hk, int kv) const {
    const Shape4& st = kv == 0 ? p_.k_strides : p_.v_strides;
    if (st[3] != 1) return;
    const std::int64_t es = element_bytes();
    const char* row = static_cast<const char*>(kv == 0 ? p_.k : p_.v) + (kv == 0 ? p_.k_at(r, hk) : p_.v_at(r, hk)) * es;
    const std::int64_t bytes = (kv == 0 ? p_.D : p_.Dv) * es, step = st[2] * es;
    for (std::int64_t x = 0; x < std::min(r.n, kRunPrefetchRows); ++x, row += step)
      for (std::int64_t off = 0; off < bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
    prefetch_scales(r, hk, kv);
  }
  void prefetch_scales(const KeyRun& r, std::int64_t hk, int kv) const {
    if (!p_.kv_codes() || (kv == 0 ? p_.k_scale_strides : p_.v_scale_strides)[2] != 1) return;
    const float* sc = kv == 0 ? k_scales(r, hk) : v_scales(r, hk);
    for (std::int64_t x = 0; x < r.n; x += 16) _mm_prefetch(reinterpret_cast<const char*>(sc + x), _MM_HINT_T0);
  }

  const Problem& p_;
  const simd::KernelTable& kt_;
  const simd::VectorKernels<T>& vk_;
  const simd::RowsKernels<T>& rows_;
  std::int64_t lds_max_ = 0;
  T *q_ = nullptr, *s_ = nullptr, *acc_ = nullptr, *m_ = nullptr, *l_ = nullptr;
};

// A decode path's worker: units of a few rows on FewRows, more on the fused path's worker over
// stacked rows, which also merges split units' parts (in key order) and writes them.
template <class T, class S>
class DecodeWorker {
 public:
  DecodeWorker(const FusedPlan<T, S>& plan, std::int64_t max_keys)
      : rows_(plan, thread_buffer<T, scratch::NativeAttention>().get(plan.scratch_size())), few_(plan.p, plan.kt, max_keys) {}
  void run(const WorkUnit& u, const WorkItem& it, T* parts) {
    if (u.rows.rows() <= simd::kMaxProductRows) few_.run(u, it, parts);
    else rows_.run(u, it, parts);
  }
  void finish(const WorkUnit& u, std::span<const PartRows<T>> parts) { rows_.finish(u, parts); }
  void end() const { rows_.end(); }

 private:
  FusedWorker<T, S> rows_;
  FewRows<T, S> few_;
};

template <class T, class S>
void decode_units(const Problem& p) {
  const FusedPlan<T, S> plan(p, simd::kernels(), RowLayout::stacked);
  WorkPlan& work = WorkPlan::of_this_thread();
  add_stacked_units(p, plan.q_rows, work);  // a group's heads of up to 8 rows: one unit (FewRows)
  work.cut(work.split_keys(plan.k_keys), p.Dv);
  // One row's scores, for the most keys this problem allows (Sk): a KV cache passes its capacity
  // as Sk, so decode steps whose lengths grow allocate nothing.
  const std::int64_t max_keys = p.Sk;
  // an item's cost: its rows times its keys, plus a fixed part (gathering q, writing the rows)
  const auto cost = [&](const WorkItem& it) {
    return work.units[static_cast<std::size_t>(it.unit)].rows.rows() * (it.k1 - it.k0 + 16);
  };
  // threads (kMinFlopsPerThread's threshold): a step is bound by reading K and V, so a row's work
  // on a key counts as two flops a byte of the key's D + Dv elements, never fewer than its FLOPs
  // (a 16-head f32 step over 513 keys ran on one thread of two when only FLOPs counted)
  const double key_bytes = double(p.D + p.Dv) * double(p.kv_codes() ? 1 : sizeof(S));
  run_plan<T>(p, work, 2.0 * key_bytes, [&] { return DecodeWorker<T, S>(plan, max_keys); }, cost);
}

// The checks the decode paths make: unmodified scores, at least one key, few query tokens, K and
// V unit-stride along D.
Refusal decode_shape_why_not(const Problem& p) {
  if (Refusal r = needs_modified_scores(p)) return r;
  if (p.Sk == 0) return {"no keys"};
  if (p.Sq > kDecodeMaxTokens) return {"{} query tokens > {}", p.Sq, kDecodeMaxTokens};
  if (p.k_strides[3] != 1 || p.v_strides[3] != 1)
    return {"K or V strided along D (inner strides {} and {})", p.k_strides[3], p.v_strides[3]};
  return {};
}

}  // namespace

Refusal decode8_why_not(const Problem& p) {
  if (!p.kv_codes()) return {"K and V of dtype {w} (8-bit codes only)", dtype_name(p.kv_dtype)};
  return decode_shape_why_not(p);
}

namespace {

// Every decode path runs decode_units in the problem's types (8-bit codes come with q of f32, bf16
// or f16: computed in f32).
void decode_any(const Problem& p) {
  visit_dtype(p.dtype, [&](auto s) { decode_units<compute_type<decltype(s)>, decltype(s)>(p); });
}

}  // namespace

void decode8_attention(const Problem& p) { decode_any(p); }

Refusal decode16_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (!is_16bit(p.dtype)) return {"dtype {w} (bf16 and f16 only)", dtype_name(p.dtype)};
  return decode_shape_why_not(p);
}

void decode16_attention(const Problem& p) { decode_any(p); }

Refusal decode_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (is_16bit(p.dtype)) return {"dtype {w} (the 16-bit decode paths take it)", dtype_name(p.dtype)};
  return decode_shape_why_not(p);
}

void decode_attention(const Problem& p) { decode_any(p); }

}  // namespace simdattn::detail

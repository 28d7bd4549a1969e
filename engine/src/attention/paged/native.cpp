// attention_paged() on the native backend: the keys and values are read where they lie, block by
// block, never gathered (a block's rows are one strided matrix per kv head).
//
// Work: a unit is (sequence, kv head, query block): the query block's rows are its tokens times
// the group's query heads, at most kMaxUnitRows, gathered once as an f32 matrix Qg. A unit's keys
// (those some row of it may see by position) are cut at absolute multiples of kPagedSplitKeys
// into chunks. A unit of a step of at most kPagedSplitMaxQueries tokens has one item per chunk
// (split-KV: a long sequence's decode spreads over every thread); a longer step's unit is one
// item that walks its chunks in order. Per chunk, per block piece:
//   S = Qg K^T        f32 GEMM / GEMV, or the 16-bit GEMV kernels on bf16/f16 K as stored
// then each row is scaled and masked (scale_mask_row: the position rule and the modifiers of a
// batch of one), the running max m and sum l updated, and
//   acc = acc * exp(m_old - m) + exp(S - m) V
// An item that is its unit writes the output; split items leave (m, l, acc) per row, and a second
// pass merges a unit's items in key order with the sink (the lse rule). Items are spread over the
// threads by their cost (parallel_shares). What an item computes depends only on the shapes, so
// the output is bitwise identical at any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <xmmintrin.h>

#include "attention/native/rows.hpp"
#include "attention/paged/paged.hpp"
#include "core/element.hpp"
#include "core/fp_env.hpp"
#include "core/position_rule.hpp"
#include "linalg/gemm.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

namespace scratch {
struct PagedItem : ScratchSlot {};   // a worker's Qg, S, acc and strided-block copies
struct PagedParts : ScratchSlot {};  // the calling thread's partial results of split units
}  // namespace scratch

namespace {

// Query rows of a unit: enough to make the score and PV products matrix products, few enough
// that S for a chunk (rows x kPagedSplitKeys f32) stays in L2.
constexpr std::int64_t kMaxUnitRows = 32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Unit {
  std::int64_t seq, hk, t0, t1;  // query tokens [t0, t1) of the sequence's step
  std::int64_t first_item, items;
  std::int64_t rows;             // (t1 - t0) x group
};

struct Item {
  std::int64_t unit;
  std::int64_t k0, k1;  // keys [k0, k1)
  std::int64_t part;    // offset of its (m, l, acc) rows in the parts buffer; -1: writes out
};

// One row's partial result: the max m, the sum l of exp(s - m) and acc = sum exp(s - m) v.
struct PartRows {
  float* m;
  float* l;
  float* acc;  // rows x Dv
};

template <class T>
class PagedWorker {
 public:
  PagedWorker(const PagedProblem& p, const simd::KernelTable& kt)
      : p_(p), kt_(kt), group_(p.H / p.Hkv), vk_(kt.vec<float>()),
        q8_(p.kv_codes() ? &kt.code8(code8_of(p.kv_dtype)) : nullptr) {
    const std::int64_t rows = std::max(kMaxUnitRows, group_);
    qg_size_ = round_up(rows * p.D, kLineElems<float>);
    s_size_ = round_up(rows * kPagedSplitKeys, kLineElems<float>);
    acc_size_ = round_up(rows * (p.Dv + 2), kLineElems<float>);
    copy_size_ = round_up(std::min(p.block_size, kPagedSplitKeys) * std::max(p.D, p.Dv), kLineElems<float>);
    const std::int64_t o_size = round_up(p.Dv, kLineElems<float>);
    float* base = thread_buffer<float, scratch::PagedItem>().get(
        static_cast<std::size_t>(qg_size_ + s_size_ + acc_size_ + copy_size_ + o_size));
    qg_ = base, s_ = base + qg_size_, own_ = s_ + s_size_, copy_ = own_ + acc_size_, o_ = copy_ + copy_size_;
  }

  // Computes item `it` of unit `u`; into `parts` at it.part, or the output.
  void run(const Unit& u, const Item& it, float* parts) {
    const Problem seq = p_.sequence(u.seq);
    gather_q(u);
    PartRows r = it.part < 0 ? PartRows{own_, own_ + u.rows, own_ + 2 * u.rows}
                             : PartRows{parts + it.part, parts + it.part + u.rows, parts + it.part + 2 * u.rows};
    std::fill(r.m, r.m + u.rows, kNegInf);
    std::fill(r.l, r.l + u.rows, 0.0f);
    bool first = true;
    for (std::int64_t a = it.k0; a < it.k1;) {
      const std::int64_t b = std::min(it.k1, (a / kPagedSplitKeys + 1) * kPagedSplitKeys);
      chunk(seq, u, a, b, r, first);
      first = false;
      a = b;
    }
    if (first) std::fill(r.acc, r.acc + u.rows * p_.Dv, 0.0f);
    if (it.part < 0) {
      const PartRows* one = &r;
      finish(u, {one, 1});
    }
  }

  // Output rows of unit u from its items' partial rows, merged in key order, with the sink.
  void finish(const Unit& u, std::span<const PartRows> parts) {
    const std::int64_t nq = u.t1 - u.t0;
    float* o = o_;
    for (std::int64_t r = 0; r < u.rows; ++r) {
      const std::int64_t h = u.hk * group_ + r / nq, t = u.t0 + r % nq;
      float mx = p_.sinks != nullptr ? p_.sinks[h] : kNegInf;
      bool nan = false;
      for (const PartRows& part : parts) mx = std::max(mx, part.m[r]), nan = nan || std::isnan(part.m[r]);
      T* dst = static_cast<T*>(p_.o) + (p_.query_start[u.seq] + t) * p_.o_strides[1] +
               h * p_.o_strides[2];
      float l = 0.0f;
      std::fill(o, o + p_.Dv, 0.0f);
      bool any = false;
      for (const PartRows& part : parts) {
        if (part.m[r] == kNegInf) continue;
        const float w = std::exp(part.m[r] - mx);
        l += part.l[r] * w;
        const float* acc = part.acc + r * p_.Dv;
        for (std::int64_t d = 0; d < p_.Dv; ++d) o[d] += acc[d] * w;
        any = true;
      }
      if (p_.sinks != nullptr) l += std::exp(p_.sinks[h] - mx);
      const float inv = any && l > 0.0f ? 1.0f / l : 0.0f;
      const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      for (std::int64_t d = 0; d < p_.Dv; ++d) dst[d * p_.o_strides[3]] = from_float(any && !nan ? o[d] * inv : fill);
    }
  }

 private:
  static T from_float(float x) {
    if constexpr (std::is_same_v<T, float>) return x;
    else return narrow<T>(x);
  }

  void gather_q(const Unit& u) {
    const std::int64_t nq = u.t1 - u.t0, q0 = p_.query_start[u.seq];
    for (std::int64_t r = 0; r < u.rows; ++r) {
      const std::int64_t h = u.hk * group_ + r / nq, t = u.t0 + r % nq;
      const T* src = static_cast<const T*>(p_.q) + (q0 + t) * p_.q_strides[1] + h * p_.q_strides[2];
      float* dst = qg_ + r * p_.D;
      for (std::int64_t d = 0; d < p_.D; ++d) dst[d] = static_cast<float>(widen(src[d * p_.q_strides[3]]));
    }
  }

  // Rows [slot, slot + n) of kv head hk in block blk of a cache: a pointer and a row stride,
  // copied to `to` when the cache is strided along D.
  const T* block_rows(const void* cache, const Shape4& st, std::int64_t width, std::int64_t blk, std::int64_t slot,
                      std::int64_t n, std::int64_t hk, T* to, std::int64_t& ld) const {
    const T* src = static_cast<const T*>(cache) + blk * st[0] + slot * st[1] + hk * st[2];
    if (st[3] == 1) {
      ld = st[1];
      return src;
    }
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t d = 0; d < width; ++d) to[j * width + d] = src[j * st[1] + d * st[3]];
    ld = width;
    return to;
  }

  // block_rows for 8-bit caches: n code rows (bytes), copied to copy_ when strided along D.
  const std::uint8_t* code_rows(const void* cache, const Shape4& st, std::int64_t width, std::int64_t blk,
                                std::int64_t slot, std::int64_t n, std::int64_t hk, std::int64_t& ld) const {
    const std::uint8_t* src = static_cast<const std::uint8_t*>(cache) + blk * st[0] + slot * st[1] + hk * st[2];
    if (st[3] == 1) {
      ld = st[1];
      return src;
    }
    auto* to = reinterpret_cast<std::uint8_t*>(copy_);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t d = 0; d < width; ++d) to[j * width + d] = src[j * st[1] + d * st[3]];
    ld = width;
    return to;
  }

  // Prefetches the rows of the block piece that starts at key j (of keys < b) of unit u's kv head:
  // each piece is a run of its own in memory (a block of another place), where the hardware
  // prefetcher would start over; so the next one is requested while the current one is read
  // (guarded by attention/native/paged-decode).
  void prefetch_piece(const void* cache, const Shape4& st, std::int64_t width, const Unit& u, std::int64_t j,
                      std::int64_t b) const {
    if (st[3] != 1) return;
    const std::int64_t slot = j % p_.block_size, n = std::min(b, j - slot + p_.block_size) - j;
    const std::int64_t es = p_.kv_codes() ? 1 : static_cast<std::int64_t>(sizeof(T));
    const char* row = static_cast<const char*>(cache) + (p_.block_of(u.seq, j) * st[0] + slot * st[1] + u.hk * st[2]) * es;
    const std::int64_t bytes = width * es, step = st[1] * es;
    for (std::int64_t r = 0; r < n; ++r, row += step)
      for (std::int64_t off = 0; off < bytes; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
  }

  // Keys [a, b) of unit u: scores, the row updates, and acc += P V.
  void chunk(const Problem& seq, const Unit& u, std::int64_t a, std::int64_t b, PartRows& r, bool first) {
    const std::int64_t nk = b - a, ldS = kPagedSplitKeys, nq = u.t1 - u.t0;
    T* tmp = reinterpret_cast<T*>(copy_);
    for (std::int64_t j = a; j < b;) {  // S = Qg K^T, block piece by block piece
      const std::int64_t slot = j % p_.block_size, n = std::min(b, j - slot + p_.block_size) - j;
      std::int64_t ld = 0;
      // the next piece (or V's first) on its way while this one is read
      if (j + n < b) prefetch_piece(p_.k, p_.k_strides, p_.D, u, j + n, b);
      else prefetch_piece(p_.v, p_.v_strides, p_.Dv, u, a, b);
      if (p_.kv_codes()) {
        const std::int64_t blk = p_.block_of(u.seq, j);
        const std::uint8_t* k = code_rows(p_.k, p_.k_strides, p_.D, blk, slot, n, u.hk, ld);
        const float* sc = p_.k_scale + blk * p_.k_scale_strides[0] + slot * p_.k_scale_strides[1] + u.hk * p_.k_scale_strides[2];
        for (std::int64_t row = 0; row < u.rows; ++row)
          q8_->gemv_t(n, p_.D, 1.0f, qg_ + row * p_.D, k, ld, sc, p_.k_scale_strides[1], s_ + (j - a) + row * ldS);
        j += n;
        continue;
      }
      const T* k = block_rows(p_.k, p_.k_strides, p_.D, p_.block_of(u.seq, j), slot, n, u.hk, tmp, ld);
      scores(u.rows, n, k, ld, s_ + (j - a));
      j += n;
    }
    for (std::int64_t row = 0; row < u.rows; ++row) {
      const std::int64_t h = u.hk * group_ + row / nq, t = u.t0 + row % nq;
      float* s = s_ + row * ldS;
      const bool full = classify(seq, 0, t, t + 1, a, b) == Cover::full;
      const float mc = scale_mask_row(seq, vk_, s, 0, h, t, a, nk, full);
      const float m_old = r.m[row], mx = std::isnan(mc) ? mc : std::max(m_old, mc);  // NaN flows on
      if (mx == kNegInf) {  // nothing visible yet
        std::fill(s, s + nk, 0.0f);
        continue;
      }
      const float lc = vk_.exp_sub_max_sum(s, nk, mx);
      const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - mx);
      r.l[row] = r.l[row] * alpha + lc;
      r.m[row] = mx;
      if (!first && alpha != 1.0f) vk_.scale(r.acc + row * p_.Dv, p_.Dv, alpha);
    }
    for (std::int64_t j = a; j < b;) {  // acc += P V
      const std::int64_t slot = j % p_.block_size, n = std::min(b, j - slot + p_.block_size) - j;
      std::int64_t ld = 0;
      if (j + n < b) prefetch_piece(p_.v, p_.v_strides, p_.Dv, u, j + n, b);
      if (p_.kv_codes()) {
        const std::int64_t blk = p_.block_of(u.seq, j);
        const std::uint8_t* v = code_rows(p_.v, p_.v_strides, p_.Dv, blk, slot, n, u.hk, ld);
        const float* sc = p_.v_scale + blk * p_.v_scale_strides[0] + slot * p_.v_scale_strides[1] + u.hk * p_.v_scale_strides[2];
        const bool set = first && j == a;
        for (std::int64_t row = 0; row < u.rows; ++row)
          q8_->gemv_n(p_.Dv, n, 1.0f, s_ + (j - a) + row * ldS, v, ld, sc, p_.v_scale_strides[1], set ? 0.0f : 1.0f,
                      r.acc + row * p_.Dv);
        j += n;
        continue;
      }
      const T* v = block_rows(p_.v, p_.v_strides, p_.Dv, p_.block_of(u.seq, j), slot, n, u.hk, tmp, ld);
      weighted_sum(u.rows, n, s_ + (j - a), v, ld, r.acc, first && j == a);
      j += n;
    }
  }

  // S[rows, 0:n] (row stride kPagedSplitKeys) = Qg K^T for n keys K (row stride ld).
  void scores(std::int64_t rows, std::int64_t n, const T* k, std::int64_t ld, float* s) const {
    if constexpr (std::is_same_v<T, float>) {
      if (rows == 1) {
        kt_.gemm_f32.gemv_t(n, p_.D, 1.0f, qg_, k, ld, 0.0f, s);
        return;
      }
      GemmArgs<float> g;
      g.trans_b = Trans::T;
      g.M = rows, g.N = n, g.K = p_.D;
      g.A = qg_, g.lda = p_.D, g.B = k, g.ldb = ld, g.C = s, g.ldc = kPagedSplitKeys;
      gemm(g, 1, &kt_);
    } else {
      const simd::Gemv16Kernels& g = std::is_same_v<T, bfloat16> ? kt_.gemv_bf16 : kt_.gemv_f16;
      const auto* k16 = reinterpret_cast<const std::uint16_t*>(k);
      for (std::int64_t r = 0; r < rows; ++r) g.gemv_t(n, p_.D, 1.0f, qg_ + r * p_.D, k16, ld, 0.0f, s + r * kPagedSplitKeys);
    }
  }

  // acc[rows, Dv] (+)= P[rows, 0:n] V for n values V (row stride ld); `set` overwrites acc.
  void weighted_sum(std::int64_t rows, std::int64_t n, const float* pw, const T* v, std::int64_t ld, float* acc,
                    bool set) const {
    if constexpr (std::is_same_v<T, float>) {
      if (rows == 1) {
        kt_.gemm_f32.gemv_n(p_.Dv, n, 1.0f, pw, v, ld, set ? 0.0f : 1.0f, acc);
        return;
      }
      GemmArgs<float> g;
      g.M = rows, g.N = p_.Dv, g.K = n;
      g.A = pw, g.lda = kPagedSplitKeys, g.B = v, g.ldb = ld, g.C = acc, g.ldc = p_.Dv, g.beta = set ? 0.0f : 1.0f;
      gemm(g, 1, &kt_);
    } else {
      const simd::Gemv16Kernels& g = std::is_same_v<T, bfloat16> ? kt_.gemv_bf16 : kt_.gemv_f16;
      const auto* v16 = reinterpret_cast<const std::uint16_t*>(v);
      for (std::int64_t r = 0; r < rows; ++r)
        g.gemv_n(p_.Dv, n, 1.0f, pw + r * kPagedSplitKeys, v16, ld, set ? 0.0f : 1.0f, acc + r * p_.Dv);
    }
  }

  const PagedProblem& p_;
  const simd::KernelTable& kt_;
  std::int64_t group_;
  const simd::VectorKernels<float>& vk_;
  const simd::Quant8Kernels* q8_;  // 8-bit caches: their code kernels
  std::int64_t qg_size_ = 0, s_size_ = 0, acc_size_ = 0, copy_size_ = 0;
  float* qg_ = nullptr;
  float* s_ = nullptr;
  float* own_ = nullptr;  // an unsplit item's m, l and acc
  float* copy_ = nullptr;
  float* o_ = nullptr;  // a merged output row
};

// Units and items of a problem (the shapes alone decide them).
void plan(const PagedProblem& p, std::vector<Unit>& units, std::vector<Item>& items, std::int64_t& part_floats) {
  const std::int64_t group = p.H / p.Hkv, q_tokens = std::max<std::int64_t>(1, kMaxUnitRows / group);
  part_floats = 0;
  for (std::int64_t i = 0; i < p.N; ++i) {
    const std::int64_t ql = p.query_len(i);
    const Problem seq = p.sequence(i);
    for (std::int64_t t0 = 0; t0 < ql; t0 += q_tokens) {
      const std::int64_t t1 = std::min(ql, t0 + q_tokens);
      const KeyRange keys = block_keys_union(seq, 0, t0, t1);
      const std::int64_t lo = std::max<std::int64_t>(0, keys.lo), hi = std::min(seq.Sk, keys.hi);
      const bool split = ql <= kPagedSplitMaxQueries && hi - lo > 0 &&
                         (hi - 1) / kPagedSplitKeys > lo / kPagedSplitKeys;
      for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
        Unit u{i, hk, t0, t1, static_cast<std::int64_t>(items.size()), 0, (t1 - t0) * group};
        if (!split) {
          items.push_back({static_cast<std::int64_t>(units.size()), lo, std::max(lo, hi), -1});
        } else {
          for (std::int64_t a = lo; a < hi; a = (a / kPagedSplitKeys + 1) * kPagedSplitKeys) {
            items.push_back({static_cast<std::int64_t>(units.size()), a,
                             std::min(hi, (a / kPagedSplitKeys + 1) * kPagedSplitKeys), part_floats});
            part_floats += u.rows * (p.Dv + 2);
          }
        }
        u.items = static_cast<std::int64_t>(items.size()) - u.first_item;
        units.push_back(u);
      }
    }
  }
}

template <class T>
void paged(const PagedProblem& p) {
  const simd::KernelTable& kt = simd::kernels();
  // The calling thread's lists, reached by the team through these references.
  thread_local std::vector<Unit> unit_storage;
  thread_local std::vector<Item> item_storage;
  thread_local std::vector<std::int64_t> prefix_storage, merged_storage;
  std::vector<Unit>& units = unit_storage;
  std::vector<Item>& items = item_storage;
  std::vector<std::int64_t>& prefix = prefix_storage;
  std::vector<std::int64_t>& merged = merged_storage;
  units.clear(), items.clear();
  std::int64_t part_floats = 0;
  plan(p, units, items, part_floats);
  if (items.empty()) return;
  float* parts = thread_buffer<float, scratch::PagedParts>().get(static_cast<std::size_t>(std::max<std::int64_t>(1, part_floats)));

  // Cost of an item: its rows times (its keys plus the fixed work of a unit's rows).
  prefix.assign(items.size() + 1, 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Unit& u = units[static_cast<std::size_t>(items[i].unit)];
    prefix[i + 1] = prefix[i] + u.rows * (items[i].k1 - items[i].k0 + 16);
  }
  const double flops = 2.0 * double(prefix.back()) * double(p.D + p.Dv);
  const auto nt = static_cast<int>(std::clamp<double>(flops / kMinFlopsPerThread, 1.0,
                                                       std::min<double>(resolve_threads(p.threads), double(items.size()))));
  RegionFailure failure;
  parallel_shares(prefix, nt, [&](auto next_run) {
    failure.guard([&] {
      const FlushDenormals ftz;
      PagedWorker<T> worker(p, kt);
      for (auto run = next_run(); run.first < run.second; run = next_run())
        for (std::int64_t it = run.first; it < run.second; ++it) {
          const Item& item = items[static_cast<std::size_t>(it)];
          worker.run(units[static_cast<std::size_t>(item.unit)], item, parts);
        }
    });
  });
  failure.rethrow();

  // Split units: merge their items' rows in key order.
  merged.clear();
  for (std::size_t u = 0; u < units.size(); ++u)
    if (units[u].items > 1) merged.push_back(static_cast<std::int64_t>(u));
  if (merged.empty()) return;
  parallel_for(static_cast<std::int64_t>(merged.size()), nt, 1, [&](std::int64_t u0, std::int64_t u1) {
    failure.guard([&] {
      const FlushDenormals ftz;
      PagedWorker<T> worker(p, kt);
      std::vector<PartRows> rows;
      for (std::int64_t x = u0; x < u1; ++x) {
        const Unit& u = units[static_cast<std::size_t>(merged[static_cast<std::size_t>(x)])];
        rows.clear();
        for (std::int64_t it = u.first_item; it < u.first_item + u.items; ++it) {
          float* base = parts + items[static_cast<std::size_t>(it)].part;
          rows.push_back({base, base + u.rows, base + 2 * u.rows});
        }
        worker.finish(u, rows);
      }
    });
  });
  failure.rethrow();
}

}  // namespace

void paged_native(const PagedProblem& p) {
  switch (p.dtype) {
    case DType::bf16: paged<bfloat16>(p); break;
    case DType::f16: paged<float16>(p); break;
    default: paged<float>(p);
  }
}

}  // namespace simdattn::detail

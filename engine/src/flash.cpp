// The native backend: fused flash-style attention on the simd/ micro-kernels.
//
// For each (batch b, head h, block of up to kBlockQ query rows):
//   Q block, read in place (rows copied only if D is strided)  [br, D]
//   for each key block of bk keys (128; up to 256 when that is all of them) that the mask does
//   not hide entirely:
//     S = Q_blk K_blk^T             (in-place-A micro-kernel)   [br, Bc]
//     scale, mask (only where the block is not fully visible), row max m_new
//     P = exp(S - m_new), row sums; O and l rescaled by exp(m_old - m_new) only when m grows
//     O += P V_blk                  (in-place-A micro-kernel)   [br, Dv]
//   out = O / l, with l == 0 (no visible key) giving a zero row.
// The Sq x Sk score matrix is never formed: S is one [br, Bc] block in the thread's scratch.
//
// Both GEMMs run the short, wide in-place-A tile (6 x 64 f32 on AVX-512), so neither Q nor P is
// packed. K^T and V are packed into the thread's scratch a key block at a time, when a query block
// first computes that block (its rows prefetched by the products of the block before), and every
// later query block (and every query head of a grouped-query group) of that kv head reuses them.
// The online-softmax step of a block's rows is one call (VectorKernels::softmax_rows). Threads
// own equal shares of the flattened (batch, head, query block) items by the number of key blocks
// each computes (so causal work splits evenly), walk them in order and steal from the fullest
// share when theirs is done. Every row is computed the same way whatever the thread count or
// schedule: results are bitwise identical for any count.
//
// Two other paths: decode (few query rows per kv head: GEMV over K and V) and short key rows
// without a mask (the transposed problem, queries on the vector lanes); see each below.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include <omp.h>

#include "gemm.hpp"
#include "panels.hpp"
#include "prefetch.hpp"
#include "problem.hpp"
#include "simdattn/simd/kernels.hpp"
#include "threading.hpp"
#include "workspace.hpp"

namespace simdattn::detail {
namespace {

// Query rows per block: a multiple of the AVX-512 tile heights (12 packed, 6 in place) so
// that full blocks have no short tiles; 96 rows x 128 keys of S is 48 KiB (f32), in L2 beside
// the packed K^T and V blocks.
constexpr std::int64_t kBlockQ = 96;
// Keys per block: a multiple of every ISA's panel width (32, 16, 8 f32 columns); also the
// granularity at which causal masks and windows skip whole blocks. Up to kMaxBlockK keys
// (vit's 197) go as one block: one online-softmax step and one pass over O per query block
// instead of two.
constexpr std::int64_t kBlockK = 128;
constexpr std::int64_t kMaxBlockK = 256;
// Largest register-tile height or panel width of any ISA (bounds the row-pointer arrays).
constexpr std::int64_t kMaxTile = 64;

enum class Cover { hidden, full, mixed };

// Structural visibility (key lengths, causal, window) of query rows [i0, i1) x keys [j0, j1)
// of batch b: hidden (no pair visible), full (every pair visible, and no explicit mask), or mixed.
Cover classify_structure(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t j0,
                         std::int64_t j1) {
  const std::int64_t L = p.key_len(b);
  if (j0 >= L) return Cover::hidden;
  bool full = j1 <= L && p.mask_kind == MaskKind::none;
  const std::int64_t off = p.query_offset(b);
  const std::int64_t first = i0 + off, last = i1 - 1 + off;  // positions of the first/last query
  if (p.causal != Causal::none) {
    if (j0 > last) return Cover::hidden;
    if (j1 - 1 > first) full = false;
  }
  if (p.has_window) {
    if (p.window_left >= 0) {
      if (j1 - 1 < first - p.window_left) return Cover::hidden;
      if (j0 < last - p.window_left) full = false;
    }
    if (p.window_right >= 0) {
      if (j0 > last + p.window_right) return Cover::hidden;
      if (j1 - 1 > first + p.window_right) full = false;
    }
  }
  return full ? Cover::full : Cover::mixed;
}

// classify_structure with the sparse patterns: a tile touching a global query or key is mixed
// (decided per element); otherwise the block mask hides it when none of the bs x bs blocks it
// overlaps is listed, and keeps it full only when all are.
Cover classify(const Problem& p, std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t j0,
               std::int64_t j1) {
  if (!p.sparse()) return classify_structure(p, b, i0, i1, j0, j1);
  const std::int64_t L = p.key_len(b);
  if (j0 >= L) return Cover::hidden;
  const std::int64_t first = i0 + p.query_offset(b), last = i1 - 1 + p.query_offset(b);
  if (j0 < p.global_tokens || (last >= 0 && first < p.global_tokens)) return Cover::mixed;
  const Cover base = classify_structure(p, b, i0, i1, j0, j1);
  if (base == Cover::hidden || p.block_mask == nullptr) return base;
  bool any = false, all = true;
  const std::int64_t bs = p.block_size, je = std::min(j1, L);
  for (std::int64_t bi = i0 / bs; bi <= (i1 - 1) / bs; ++bi)
    for (std::int64_t bj = j0 / bs; bj <= (je - 1) / bs; ++bj) {
      const bool v = p.block_mask[bi * p.bm_row + bj * p.bm_col] != 0;
      any = any || v;
      all = all && v;
    }
  if (!any) return Cover::hidden;
  return all ? base : Cover::mixed;
}

// The keys [lo, hi) of j0 .. j0 + nk - 1 (relative to j0) that query i of batch b may see by key
// length, causal and window, or with sparse patterns [0, key length) (checked key by key later).
inline void visible_interval(const Problem& p, std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t nk,
                             std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t pos = i + p.query_offset(b);
  lo = 0, hi = p.key_len(b);
  if (!p.sparse()) {
    if (p.causal != Causal::none) hi = std::min(hi, pos + 1);
    if (p.has_window && p.window_left >= 0) lo = std::max(lo, pos - p.window_left);
    if (p.has_window && p.window_right >= 0) hi = std::min(hi, pos + p.window_right + 1);
  }
  lo = std::clamp<std::int64_t>(lo - j0, 0, nk);
  hi = std::clamp<std::int64_t>(hi - j0, lo, nk);
}

// Scales row[0:nk] (the raw scores of query i of head (b, h) against keys j0 .. j0 + nk - 1),
// adds the additive mask, sets hidden keys to -inf and returns the row max. `full`: every key is
// visible and there is no explicit mask.
template <class T>
T mask_scale_max(const Problem& p, const simd::VectorKernels<T>& vk, T* row, std::int64_t b,
                 std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t nk, bool full) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = static_cast<T>(p.scale);
  if (full) return vk.scale_add_max(row, nk, scale, nullptr);
  // Key lengths, causal and window leave the row one interval [lo, hi) of visible keys: scale
  // it (adding the mask), fill the rest with -inf.
  // With sparse patterns the visible keys of a row are not one interval: [0, L) here, then
  // each key is checked below.
  const std::int64_t pos = i + p.query_offset(b);
  std::int64_t lo = 0, hi = 0;
  visible_interval(p, b, i, j0, nk, lo, hi);
  for (std::int64_t j = 0; j < lo; ++j) row[j] = neg_inf;
  for (std::int64_t j = hi; j < nk; ++j) row[j] = neg_inf;
  const T* add = nullptr;
  if (p.mask_kind == MaskKind::additive && p.mask_dtype == p.dtype && p.ms[3] == 1)
    add = static_cast<const T*>(p.mask) + p.mask_offset(b, h, i, j0);
  T bm = neg_inf;
  if (lo < hi) bm = vk.scale_add_max(row + lo, hi - lo, scale, add ? add + lo : nullptr);
  if ((p.mask_kind == MaskKind::additive && add == nullptr) || p.mask_kind == MaskKind::boolean) {
    for (std::int64_t j = lo; j < hi; ++j) {
      const std::int64_t key = j0 + j;
      if (p.mask_kind == MaskKind::boolean) {
        if (!p.mask_allows(b, h, i, key)) row[j] = neg_inf;
      } else if (p.mask_kind == MaskKind::additive && add == nullptr) {
        row[j] += static_cast<T>(p.mask_add(b, h, i, key));
      }
    }
    bm = lo < hi ? vk.max(row + lo, hi - lo) : neg_inf;
  }
  // After the explicit mask, so that a +inf or NaN mask value at a hidden key cannot reach it.
  if (p.sparse() && lo < hi && !(pos >= 0 && pos < p.global_tokens)) {
    // Not a global query: visible are the global keys (< G) and, inside the causal/window
    // interval [a, z), the keys of listed bs x bs blocks. Hide the rest segment by segment.
    std::int64_t a = 0, z = hi + j0;
    if (p.causal != Causal::none) z = std::min(z, pos + 1);
    if (p.has_window && p.window_left >= 0) a = std::max(a, pos - p.window_left);
    if (p.has_window && p.window_right >= 0) z = std::min(z, pos + p.window_right + 1);
    const std::int64_t bs = p.block_mask != nullptr ? p.block_size : nk + j0 + 1;
    for (std::int64_t s0 = j0 + lo; s0 < j0 + hi;) {
      const std::int64_t e0 = std::min(j0 + hi, (s0 / bs + 1) * bs);  // segment [s0, e0): one block
      const bool listed = p.block_mask == nullptr || p.block_allows(i, s0);
      const std::int64_t start = std::max(s0, std::min(e0, p.global_tokens));  // keys before are global
      const std::int64_t va = listed ? std::clamp(a, start, e0) : e0, vz = listed ? std::clamp(z, va, e0) : e0;
      for (std::int64_t j = start; j < va; ++j) row[j - j0] = neg_inf;
      for (std::int64_t j = vz; j < e0; ++j) row[j - j0] = neg_inf;
      s0 = e0;
    }
    bm = vk.max(row + lo, hi - lo);
  }
  return bm;
}

// Writes one output row: acc[0:Dv] / l to dst (stride os[3]); l == 0 (no visible key) writes
// zeros without reading acc, which then may never have been written. acc may be overwritten.
template <class T>
void write_row(const Problem& p, const simd::VectorKernels<T>& vk, T* acc, T l, T* dst) {
  if (l == T(0)) {
    for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.os[3]] = T(0);
    return;
  }
  if (p.os[3] == 1) {
    vk.scale_to(acc, dst, p.Dv, T(1) / l);
    return;
  }
  vk.scale(acc, p.Dv, T(1) / l);
  for (std::int64_t d = 0; d < p.Dv; ++d) dst[d * p.os[3]] = acc[d];
}

constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

// Everything one call needs to know, shared by its threads.
template <class T>
struct Plan {
  const Problem& p;
  const simd::GemmKernels<T>& gk;
  const simd::VectorKernels<T>& vk;
  std::int64_t dmr, dnr;   // the in-place-A tile both GEMMs run on
  std::int64_t lanes;      // elements per vector
  std::int64_t dvu;        // Dv rounded up to a vector: the columns of O that are computed
  std::int64_t dvp;        // Dv rounded up to dnr
  std::int64_t nqb, nkb;   // query blocks per head, key blocks
  std::int64_t bq;         // query rows per block (the last may have fewer)
  std::int64_t bk;         // keys per block (the last may have fewer)
  // Scratch layout (elements, each part 64-byte aligned): packed K^T and V of one kv head,
  // packed Q block, S block, O block, row max m, row sum l and rescale factor, which key blocks
  // are packed.
  std::int64_t k_size, v_size, q_size, s_size, o_size, row_size, flag_size;

  Plan(const Problem& prob, const simd::KernelTable& kt)
      : p(prob), gk(kt.gemm<T>()), vk(kt.vec<T>()) {
    dmr = gk.direct_blocking.mr;
    dnr = gk.direct_blocking.nr;
    lanes = gk.direct_blocking.lanes;
    dvu = round_up(p.Dv, lanes);
    if (dnr > kMaxTile || kBlockK % dnr != 0) std::abort();  // ISA table invariant
    bk = p.Sk > kBlockK && p.Sk <= kMaxBlockK ? round_up(p.Sk, dnr) : kBlockK;
    dvp = round_up(p.Dv, dnr);
    // Equal blocks of at most kBlockQ rows, rounded to the tile height: Sq = 128 gives 66 + 62
    // rather than 96 + 32.
    nqb = (p.Sq + kBlockQ - 1) / kBlockQ;
    bq = nqb > 0 ? std::min(kBlockQ, round_up((p.Sq + nqb - 1) / nqb, dmr)) : kBlockQ;
    // A block mask: query blocks inside one row of bs x bs blocks (bs or bs / 2 rows), so that
    // a query block's key panels are hidden or listed as a whole.
    // (Small blocks keep the default: row blocks of a few rows would starve the micro-kernel.)
    if (p.block_mask != nullptr && p.block_size >= 16 && p.block_size <= kBlockQ) bq = p.block_size;
    else if (p.block_mask != nullptr && p.block_size % 2 == 0 && p.block_size / 2 >= 16 && p.block_size / 2 <= kBlockQ)
      bq = p.block_size / 2;
    // A narrow window (left side bounded): each query block computes its own rows' span plus
    // the window; halving the block trims that span (long, window 512: 608 -> 560 keys; perf
    // sparse/native/long-window512 best of 4 alternating runs: t1 179 -> 173 ms, t2 95.9 -> 89.6).
    if (p.block_mask == nullptr && p.has_window && p.window_left >= 0 && p.window_left <= 8 * bk)
      bq = std::min(bq, round_up(kBlockQ / 2, dmr));
    nqb = nqb > 0 ? (p.Sq + bq - 1) / bq : 0;
    nkb = (p.Sk + bk - 1) / bk;
    const std::int64_t a = 64 / static_cast<std::int64_t>(sizeof(T));
    k_size = round_up(nkb * p.D * bk, a);
    v_size = round_up(nkb * bk * dvp, a);
    q_size = round_up(kBlockQ * p.D, a);
    s_size = round_up(kBlockQ * bk, a);
    o_size = round_up(kBlockQ * dvp, a);
    row_size = round_up(kBlockQ, a);
    flag_size = round_up(nkb, a);
  }
  std::size_t scratch_size() const {
    return static_cast<std::size_t>(k_size + v_size + q_size + s_size + o_size + 3 * row_size + flag_size);
  }
};

template <class T>
class Worker {
 public:
  Worker(const Plan<T>& plan, T* scratch_base) : P_(plan), p_(plan.p) {
    T* s = scratch_base;
    kp_ = s, s += plan.k_size;
    vp_ = s, s += plan.v_size;
    qp_ = s, s += plan.q_size;
    sb_ = s, s += plan.s_size;
    ob_ = s, s += plan.o_size;
    m_ = s, s += plan.row_size;
    l_ = s, s += plan.row_size;
    alpha_ = s, s += plan.row_size;
    packed_ = s;
  }

  // Computes item (b, h, query block qb).
  void run(std::int64_t b, std::int64_t h, std::int64_t qb) {
    const std::int64_t hk = h / (p_.H / p_.Hkv);
    if (b != packed_b_ || hk != packed_hk_) start_kv(b, hk);
    const std::int64_t i0 = qb * P_.bq, br = std::min(P_.bq, p_.Sq - i0);
    prepare_q(b, h, i0, br);
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (std::int64_t r = 0; r < br; ++r) m_[r] = neg_inf, l_[r] = T(0);

    // O is not cleared: the first computed block writes it (beta = 0); until then every row
    // max is -inf, so no rescale reads it. A query block with no visible key never reads it.
    bool first = true;
    // Keys [j0 + a, j0 + a + n) of key block jb (a a multiple of the vector width).
    auto step = [&](std::int64_t jb, std::int64_t a, std::int64_t n, Cover cover) {
      const std::int64_t j0 = jb * P_.bk;
      if (packed_[jb] == T(0)) pack_block(jb);
      prefetch_block(jb + 1);
      if (first) prefetch_next_rows(b, h, i0 + br);
      scores(jb, a, n, br);
      softmax_update(b, h, i0, br, j0 + a, a, n, cover, first);
      accumulate(jb, a, n, br, first ? T(0) : T(1));
      first = false;
    };
    for (std::int64_t jb = 0; jb < P_.nkb; ++jb) {
      const std::int64_t j0 = jb * P_.bk, nk = std::min(P_.bk, p_.Sk - j0);
      const Cover cover = classify(p_, b, i0, i0 + br, j0, j0 + nk);
      if (cover == Cover::hidden) continue;
      if (cover == Cover::mixed && structured_) {
        // A block at the edge of the visible region (causal diagonal, window edge, key length,
        // block mask): its runs of one vector's width of keys that no row of the query block sees
        // are skipped; runs of the others go as one step. (Skipping whole 64-key panels instead
        // computed ~10% more keys than visible on long, window 512.)
        const std::int64_t w = P_.lanes;
        for (std::int64_t a = 0; a < nk;) {
          std::int64_t e = a;
          bool all_full = true;
          while (e < nk) {
            const std::int64_t n = std::min(w, nk - e);
            const Cover sub = classify(p_, b, i0, i0 + br, j0 + e, j0 + e + n);
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
    write_out(b, h, i0, br);
  }

 private:
  // K^T of kv head (b, hk) as B panels of dnr keys: block jb, panel c, row d holds keys
  // j0 + c*nr .. + nr - 1 at dimension d. V as B panels of dnr columns: block jb, panel c,
  // row j holds V[j0 + j, c*dnr .. + dnr - 1]. Zero past the key length L[b] and Dv. A block is
  // packed when a query block first computes it (blocks past L[b] are hidden, never visited:
  // K/V past L[b] are never read, and a large, mostly empty KV cache costs only its used part),
  // its rows prefetched while the block before it is computed.
  void start_kv(std::int64_t b, std::int64_t hk) {
    k_ = static_cast<const T*>(p_.k) + b * p_.ks[0] + hk * p_.ks[1];
    v_ = static_cast<const T*>(p_.v) + b * p_.vs[0] + hk * p_.vs[1];
    key_len_ = p_.key_len(b);
    std::fill(packed_, packed_ + P_.nkb, T(0));
    packed_b_ = b;
    packed_hk_ = hk;
  }
  void pack_block(std::int64_t jb) {
    const std::int64_t nr = P_.dnr, dnr = P_.dnr, D = p_.D;
    T* kb = kp_ + jb * D * P_.bk;
    for (std::int64_t c = 0; c < P_.bk / nr; ++c) {
      T* panel = kb + c * D * nr;
      const std::int64_t j0 = jb * P_.bk + c * nr;
      const std::int64_t n = std::max<std::int64_t>(0, std::min(nr, key_len_ - j0));
      if (p_.ks[3] == 1) {
        P_.vk.pack_transpose(n > 0 ? k_ + j0 * p_.ks[2] : k_, p_.ks[2], n, D, panel, nr, nr);
        continue;
      }
      for (std::int64_t d = 0; d < D; ++d)
        for (std::int64_t q = 0; q < nr; ++q) panel[d * nr + q] = q < n ? k_[(j0 + q) * p_.ks[2] + d * p_.ks[3]] : T(0);
    }
    // keys past L[b] are never read: V there may hold anything (a cache tail)
    const std::int64_t rows = std::min(P_.bk, key_len_ - jb * P_.bk);
    pack_row_panels(v_ + jb * P_.bk * p_.vs[2], p_.vs[2], p_.vs[3], rows, P_.bk, p_.Dv, dnr, P_.dvp / dnr,
                    vp_ + jb * P_.bk * P_.dvp);
    packed_[jb] = T(1);
  }
  // The rows of key block jb, if it holds keys below L[b] and is not packed yet, become the
  // next prefetches of the micro-kernels.
  void prefetch_block(std::int64_t jb) {
    next_.clear();
    const std::int64_t j0 = jb * P_.bk;
    if (jb >= P_.nkb || j0 >= key_len_ || packed_[jb] != T(0)) return;
    const std::int64_t rows = std::min(P_.bk, key_len_ - j0);
    next_.add(k_ + j0 * p_.ks[2], p_.ks[2], p_.ks[3], rows, p_.D);
    next_.add(v_ + j0 * p_.vs[2], p_.vs[2], p_.vs[3], rows, p_.Dv);
  }

  // The Q rows the next query block of head (b, h) reads in place and the output rows it
  // writes (from row i1 on), after any K/V rows: prefetched while the current block's first
  // key block is computed.
  void prefetch_next_rows(std::int64_t b, std::int64_t h, std::int64_t i1) {
    if (i1 >= p_.Sq) return;
    const std::int64_t rows = std::min(P_.bq, p_.Sq - i1);
    next_.add(static_cast<const T*>(p_.q) + b * p_.qs[0] + h * p_.qs[1] + i1 * p_.qs[2], p_.qs[2], p_.qs[3], rows,
              p_.D);
    next_.add(static_cast<const T*>(p_.o) + b * p_.os[0] + h * p_.os[1] + i1 * p_.os[2], p_.os[2], p_.os[3], rows,
              p_.Dv);
  }

  // Q rows i0 .. i0 + br - 1 of head (b, h), as a pointer and row stride the micro-kernel can
  // read in place: Q itself when its rows are contiguous in D, else a copy.
  void prepare_q(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
    const T* q = static_cast<const T*>(p_.q) + b * p_.qs[0] + h * p_.qs[1] + i0 * p_.qs[2];
    if (p_.qs[3] == 1) {
      q_ = q;
      ldq_ = p_.qs[2];
      return;
    }
    for (std::int64_t r = 0; r < br; ++r)
      for (std::int64_t d = 0; d < p_.D; ++d) qp_[r * p_.D + d] = q[r * p_.qs[2] + d * p_.qs[3]];
    q_ = qp_;
    ldq_ = p_.D;
  }

  // S[0:br, a:a + round_up(n, lanes)] = Q_blk K^T for keys a .. a + n - 1 of key block jb
  // (unscaled; a is a multiple of the vector width). Each panel runs only the vectors it has
  // keys for: the first from vector offset o (aligned: the panel's rows are), the last up to
  // its last key.
  void scores(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br) {
    const std::int64_t dmr = P_.dmr, dnr = P_.dnr, D = p_.D, nk = a + n;
    const T* kb = kp_ + jb * D * P_.bk;
    for (std::int64_t c = a / dnr; c * dnr < nk; ++c) {
      const std::int64_t o = std::max<std::int64_t>(0, a - c * dnr);
      const std::int64_t nv = (std::min(dnr, nk - c * dnr) - o + P_.lanes - 1) / P_.lanes;
      const std::int64_t rows = nv == 1 ? 2 * dmr : dmr;  // one-vector tiles are twice as tall
      for (std::int64_t r0 = 0; r0 < br; r0 += rows) {
        const std::int64_t m = std::min(rows, br - r0);
        const NextRows::Run pf = next_.take(D);
        P_.gk.ukernel_direct_a_pf[nv][m](D, q_ + r0 * ldq_, ldq_, kb + c * D * dnr + o, dnr,
                                         sb_ + r0 * P_.bk + c * dnr + o, P_.bk, T(1), T(0), pf.at, pf.lines);
      }
    }
  }

  // Scale and mask S, then the online softmax step for the block's rows (VectorKernels::
  // softmax_rows): P = exp(S - m_new) in place, l and O rescaled where the row max grew.
  // Keys j0 .. j0 + nk - 1 sit at column a of S. Fully visible blocks are scaled inside that
  // step; the others are scaled and masked row by row first.
  void softmax_update(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br, std::int64_t j0,
                      std::int64_t a, std::int64_t nk, Cover cover, bool first) {
    T scale = static_cast<T>(p_.scale);
    const std::int64_t *lo = nullptr, *hi = nullptr;
    if (cover != Cover::full && !p_.sparse() && p_.mask_kind == MaskKind::none) {
      // Only key lengths, causal and window: one visible interval per row, which the softmax
      // step itself keeps to (no masking pass).
      for (std::int64_t r = 0; r < br; ++r) visible_interval(p_, b, i0 + r, j0, nk, lo_[r], hi_[r]);
      lo = lo_.data(), hi = hi_.data();
    } else if (cover != Cover::full) {
      for (std::int64_t r = 0; r < br; ++r)
        mask_scale_max(p_, P_.vk, sb_ + r * P_.bk + a, b, h, i0 + r, j0, nk, false);
      scale = T(1);
    }
    // NaN scores do not raise the max; they reach l and O through P instead.
    P_.vk.softmax_rows(sb_ + a, P_.bk, br, nk, scale, lo, hi, m_, l_, alpha_);
    if (first) return;  // O is written (beta = 0) by this block's product
    for (std::int64_t r = 0; r < br; ++r) {
      if (alpha_[r] == T(1)) continue;
      T* o = ob_ + r * P_.dvp;
      // alpha = -1: the row's first visible key. What earlier blocks left in its O row is
      // 0 * V of keys it cannot see, which is NaN where such V is Inf or NaN: start from zeros.
      if (alpha_[r] < T(0)) std::fill(o, o + P_.dvu, T(0));
      else P_.vk.scale(o, P_.dvu, alpha_[r]);
    }
  }

  // O[0:br, :] = P[0:br, a:a + n] V_blk[a:a + n, :] + beta * O
  void accumulate(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br, T beta) {
    const std::int64_t dmr = P_.dmr, dnr = P_.dnr;
    const T* vb = vp_ + jb * P_.bk * P_.dvp;
    for (std::int64_t c = 0; c < P_.dvp / dnr; ++c) {
      const std::int64_t nv = (std::min(dnr, p_.Dv - c * dnr) + P_.lanes - 1) / P_.lanes;
      for (std::int64_t r0 = 0; r0 < br; r0 += dmr) {
        const std::int64_t m = std::min(dmr, br - r0);
        const NextRows::Run pf = next_.take(n);
        P_.gk.ukernel_direct_a_pf[nv][m](n, sb_ + r0 * P_.bk + a, P_.bk, vb + c * P_.bk * dnr + a * dnr, dnr,
                                         ob_ + r0 * P_.dvp + c * dnr, P_.dvp, T(1), beta, pf.at, pf.lines);
      }
    }
  }

  void write_out(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
    T* o = static_cast<T*>(p_.o) + b * p_.os[0] + h * p_.os[1];
    if (p_.os[3] == 1) {
      P_.vk.normalize_rows(ob_, P_.dvp, br, p_.Dv, l_, o + i0 * p_.os[2], p_.os[2]);
      return;
    }
    for (std::int64_t r = 0; r < br; ++r) write_row(p_, P_.vk, ob_ + r * P_.dvp, l_[r], o + (i0 + r) * p_.os[2]);
  }

  const Plan<T>& P_;
  const Problem& p_;
  T *kp_, *vp_, *qp_, *sb_, *ob_, *m_, *l_, *alpha_;
  T* packed_;  // packed_[jb] != 0: key block jb of the current kv head is packed
  const T *k_ = nullptr, *v_ = nullptr;  // the current kv head's K and V
  std::int64_t key_len_ = 0;
  NextRows next_;
  std::array<std::int64_t, kBlockQ> lo_{}, hi_{};  // visible key intervals of a block's rows
  const T* q_ = nullptr;   // the current Q block's rows, ldq_ apart
  // Causal, window, key lengths or a sparse pattern: mixed blocks may have hidden key panels.
  const bool structured_ = p_.causal != Causal::none || p_.has_window || p_.key_lengths != nullptr || p_.sparse();
  std::int64_t ldq_ = 0;
  std::int64_t packed_b_ = -1, packed_hk_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Decode: few query rows per kv head (Sq * H / Hkv <= kDecodeMaxRows), e.g. one new token
// against a KV cache. The work is a few matrix-vector products per head, bound by reading K and
// V: with one row per kv head nothing is packed and the GEMV kernels stream K (scores) and then
// V (weighted sum) exactly once; 2-8 rows take the GEMM driver's small-M path.
// Per (batch, kv head): the group's query rows are gathered into one small matrix Qg, then
//   S = Qg K^T (all keys; a few rows of Sk scores), softmax per row, O = S V / l.

constexpr std::int64_t kDecodeMaxRows = 8;

template <class T>
void decode(const Problem& p, const simd::KernelTable& kt) {
  const std::int64_t group = p.H / p.Hkv, rows = group * p.Sq;
  const simd::VectorKernels<T>& vk = kt.vec<T>();
  const auto a = static_cast<std::int64_t>(64 / sizeof(T));
  const std::int64_t q_size = round_up(rows * p.D, a), s_size = round_up(rows * p.Sk, a);
  const std::int64_t o_size = round_up(rows * p.Dv, a);
  const std::int64_t items = p.B * p.Hkv;
  const double bytes = double(p.Sk) * double(p.D + p.Dv) * sizeof(T);  // per item
  const auto min_items = static_cast<std::int64_t>(kMinFlopsPerThread / (2.0 * bytes)) + 1;

  bool failed = false;
  parallel_for(items, p.threads, min_items, [&](std::int64_t it0, std::int64_t it1) {
    T* base = nullptr;
    try {
      base = thread_buffer<T, kAttention>().get(static_cast<std::size_t>(q_size + s_size + o_size));
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
      return;
    }
    T* qg = base;
    T* sc = qg + q_size;
    T* og = sc + s_size;
    try {  // gemm may need to grow its packing buffers: no exception may leave the region
      // Packing buffers for the largest key length this problem allows (Sk): a KV cache passes
      // its capacity as Sk, so decode steps whose lengths grow allocate nothing.
      GemmArgs<T> bound;
      bound.trans_b = Trans::T;
      bound.M = rows, bound.N = std::max(p.Sk, p.Dv), bound.K = std::max(p.D, p.Sk);
      gemm_reserve(bound, &kt);
      for (std::int64_t it = it0; it < it1; ++it) {
        const std::int64_t b = it / p.Hkv, hk = it % p.Hkv;
        // Qg: row r = (head h0 + r / Sq, query r % Sq)
        for (std::int64_t r = 0; r < rows; ++r) {
          const T* src = static_cast<const T*>(p.q) + b * p.qs[0] + (hk * group + r / p.Sq) * p.qs[1] +
                         (r % p.Sq) * p.qs[2];
          std::memcpy(qg + r * p.D, src, sizeof(T) * static_cast<std::size_t>(p.D));
        }
        const T* k = static_cast<const T*>(p.k) + b * p.ks[0] + hk * p.ks[1];
        const T* v = static_cast<const T*>(p.v) + b * p.vs[0] + hk * p.vs[1];
        GemmArgs<T> qk;  // S = Qg K^T
        qk.trans_b = Trans::T;
        // Keys past L[b] are never read (V there may be a cache tail holding anything).
        const std::int64_t L = p.key_len(b);
        qk.M = rows, qk.N = L, qk.K = p.D;
        qk.A = qg, qk.lda = p.D, qk.B = k, qk.ldb = p.ks[2], qk.C = sc, qk.ldc = p.Sk;
        gemm(qk, 1, &kt);  // L == 0: nothing
        std::int64_t visible_rows = 0;
        T l[kDecodeMaxRows];
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t h = hk * group + r / p.Sq, i = r % p.Sq;
          T* row = sc + r * p.Sk;
          const bool full = classify(p, b, i, i + 1, 0, L) == Cover::full;
          const T m = mask_scale_max(p, vk, row, b, h, i, 0, L, full);
          l[r] = vk.exp_sub_max_sum(row, L, m);
          visible_rows += l[r] != T(0);
        }
        if (visible_rows > 0) {
          GemmArgs<T> pv;  // O = P V
          pv.M = rows, pv.N = p.Dv, pv.K = L;
          pv.A = sc, pv.lda = p.Sk, pv.B = v, pv.ldb = p.vs[2], pv.C = og, pv.ldc = p.Dv;
          gemm(pv, 1, &kt);
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t h = hk * group + r / p.Sq, i = r % p.Sq;
          T* dst = static_cast<T*>(p.o) + b * p.os[0] + h * p.os[1] + i * p.os[2];
          write_row(p, vk, og + r * p.Dv, l[r], dst);
        }
      }
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
  });
  if (failed) throw std::bad_alloc();
}

// ---------------------------------------------------------------------------------------------
// Short key rows (sdcross: 77 keys, D = Dv = 40), no mask: the transposed problem, with queries
// on the vector lanes. Per (batch, head, block of bq queries), for each panel of dnr queries:
//   Q^T panel        = the Q rows, transposed                        [D, dnr]
//   S^T              = K Q^T       (in-place-A tile over K's rows)   [L, dnr]
//   P^T              = exp(S^T - column max), the column sums l  (one call: softmax_cols)
//   O^T              = V^T P^T / l (in-place-A tile over V^T's rows) [Dv, dnr]
//   out rows         = O^T, transposed
// Keys and Dv are the tile rows, where a remainder costs a short tile, not lanes: the row-major
// form computes 80 lanes for 77 keys and 48 for 40 output columns (12% of its FLOPs idle), and
// softmax needs no horizontal reductions and no tails. All keys are one block, so the softmax
// is the plain one (max, then exp and sum, then O / l: Dv rows normalised rather than L). V^T
// is packed when a thread's item is of another kv head than its previous one (items of a head
// are claimed mostly in a row, one at a time: a thread slowed by a neighbour leaves items to the
// other).
constexpr std::int64_t kShortMaxKeys = 96;

template <class T>
bool short_keys_fit(const Problem& p, const simd::GemmKernels<T>& gk) {
  const std::int64_t lanes = gk.direct_blocking.lanes, dnr = gk.direct_blocking.nr;
  return p.Sk >= 1 && p.Sk <= kShortMaxKeys && p.mask_kind == MaskKind::none && p.causal == Causal::none &&
         !p.has_window && !p.sparse() && p.qs[3] == 1 && p.ks[3] == 1 && p.vs[3] == 1 && p.os[3] == 1 &&
         p.Sq >= dnr && (p.Sk % lanes != 0 || p.Dv % lanes != 0);
}

template <class T>
void short_keys(const Problem& p, const simd::KernelTable& kt) {
  const simd::GemmKernels<T>& gk = kt.gemm<T>();
  const simd::VectorKernels<T>& vk = kt.vec<T>();
  const std::int64_t dmr = gk.direct_blocking.mr, dnr = gk.direct_blocking.nr, lanes = gk.direct_blocking.lanes;
  const std::int64_t bq = 4 * dnr, nqb = (p.Sq + bq - 1) / bq, items = p.B * p.H * nqb;
  const auto a = static_cast<std::int64_t>(64 / sizeof(T));
  const std::int64_t ldvt = round_up(p.Sk, lanes);
  const std::int64_t vt_size = round_up(p.Dv * ldvt, a), qt_size = round_up(p.D * bq, a);
  const std::int64_t st_size = round_up(p.Sk * bq, a), ot_size = round_up(p.Dv * bq, a), l_size = round_up(bq, a);
  const double flops_per_item = 2.0 * double(bq) * double(p.Sk) * double(p.D + p.Dv);
  const auto min_items = static_cast<std::int64_t>(kMinFlopsPerThread / flops_per_item) + 1;
  const T scale = static_cast<T>(p.scale);

  auto run = [&](std::int64_t it, T* vt, T* qt, T* st, T* ot, T* l, std::int64_t& cached) {
    const std::int64_t qb = it % nqb, h = (it / nqb) % p.H, b = it / (nqb * p.H), hk = h / (p.H / p.Hkv);
    const std::int64_t L = p.key_len(b), i0 = qb * bq, nq = std::min(bq, p.Sq - i0);
    T* o = static_cast<T*>(p.o) + b * p.os[0] + h * p.os[1] + i0 * p.os[2];
    if (L == 0) {  // no visible key: zero rows
      for (std::int64_t r = 0; r < nq; ++r) std::fill(o + r * p.os[2], o + r * p.os[2] + p.Dv, T(0));
      return;
    }
    if (cached != b * p.Hkv + hk) {  // V^T of kv head (b, hk): row d holds V[0:L, d]
      vk.pack_transpose(static_cast<const T*>(p.v) + b * p.vs[0] + hk * p.vs[1], p.vs[2], L, p.Dv, vt, ldvt, L);
      cached = b * p.Hkv + hk;
    }
    const T* q = static_cast<const T*>(p.q) + b * p.qs[0] + h * p.qs[1] + i0 * p.qs[2];
    const T* k = static_cast<const T*>(p.k) + b * p.ks[0] + hk * p.ks[1];
    NextRows next;
    for (std::int64_t c = 0; c * dnr < nq; ++c) {
      const std::int64_t qn = std::min(dnr, nq - c * dnr), nv = (qn + lanes - 1) / lanes;
      // The next panel's Q rows and output rows, prefetched by this panel's products (the
      // transposes that read and write them otherwise wait on memory).
      next.clear();
      if ((c + 1) * dnr < nq) {
        const std::int64_t qn1 = std::min(dnr, nq - (c + 1) * dnr);
        next.add(o + (c + 1) * dnr * p.os[2], p.os[2], p.os[3], qn1, p.Dv);
        next.add(q + (c + 1) * dnr * p.qs[2], p.qs[2], p.qs[3], qn1, p.D);
      }
      const std::int64_t rows_t = nv == 1 ? 2 * dmr : dmr;  // one-vector tiles are twice as tall
      T* qtc = qt + c * p.D * dnr;
      T* stc = st + c * p.Sk * dnr;
      T* otc = ot + c * p.Dv * dnr;
      vk.pack_transpose(q + c * dnr * p.qs[2], p.qs[2], qn, p.D, qtc, dnr, nv * lanes);
      for (std::int64_t r0 = 0; r0 < L; r0 += rows_t) {
        const NextRows::Run pf = next.take(p.D);
        gk.ukernel_direct_a_pf[nv][std::min(rows_t, L - r0)](p.D, k + r0 * p.ks[2], p.ks[2], qtc, dnr, stc + r0 * dnr,
                                                             dnr, T(1), T(0), pf.at, pf.lines);
      }
      vk.softmax_cols(stc, dnr, L, nv * lanes, scale, l + c * dnr);
      for (std::int64_t r0 = 0; r0 < p.Dv; r0 += rows_t) {
        const NextRows::Run pf = next.take(L);
        gk.ukernel_direct_a_pf[nv][std::min(rows_t, p.Dv - r0)](L, vt + r0 * ldvt, ldvt, stc, dnr, otc + r0 * dnr,
                                                                dnr, T(1), T(0), pf.at, pf.lines);
      }
      vk.normalize_cols(otc, dnr, p.Dv, nv * lanes, l + c * dnr);
      T* oc = o + c * dnr * p.os[2];
      vk.pack_transpose(otc, dnr, p.Dv, qn, oc, p.os[2], p.Dv);
      // A query with no finite score has zero weights, and 0 * an infinite V is NaN: zeros, as
      // the row-major kernel writes for a row with l == 0.
      for (std::int64_t r = 0; r < qn; ++r)
        if (l[c * dnr + r] == T(0)) std::fill(oc + r * p.os[2], oc + r * p.os[2] + p.Dv, T(0));
    }
  };

  const auto scratch = static_cast<std::size_t>(vt_size + qt_size + st_size + ot_size + l_size);
  bool failed = false;
  parallel_claims(items, p.threads, min_items, [&](auto next_item) {
    try {
      T* base = thread_buffer<T, kAttention>().get(scratch);
      T* vt = base;
      T* qt = vt + vt_size;
      T* st = qt + qt_size;
      T* ot = st + st_size;
      T* l = ot + ot_size;
      std::int64_t cached = -1;  // the kv head (b * Hkv + hk) whose V^T is in vt
      for (std::int64_t it = next_item(); it < items; it = next_item()) run(it, vt, qt, st, ot, l, cached);
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
  });
  if (failed) throw std::bad_alloc();
}

template <class T>
void flash(const Problem& p) {
  if (p.Sk > 0 && (p.H / p.Hkv) * p.Sq <= kDecodeMaxRows && p.qs[3] == 1 && p.ks[3] == 1 &&
      p.vs[3] == 1) {
    decode<T>(p, simd::kernels());
    return;
  }
  if (short_keys_fit<T>(p, simd::kernels().gemm<T>())) {
    short_keys<T>(p, simd::kernels());
    return;
  }
  const Plan<T> plan(p, simd::kernels());
  const std::int64_t items = p.B * p.H * plan.nqb;
  if (items == 0) return;

  // Cost of each item in key blocks, prefix-summed: threads take equal shares of the total.
  // (thread_local storage of the calling thread; the workers reach it through this reference,
  // not by name, which would give each worker its own empty vector)
  thread_local std::vector<std::int64_t> prefix_storage;
  std::vector<std::int64_t>& prefix = prefix_storage;
  prefix.resize(static_cast<std::size_t>(items) + 1);
  prefix[0] = 0;
  for (std::int64_t it = 0; it < items; ++it) {
    const std::int64_t qb = it % plan.nqb, b = it / (plan.nqb * p.H);
    const std::int64_t i0 = qb * plan.bq, i1 = std::min(p.Sq, i0 + plan.bq);
    std::int64_t cost = 1;  // packing Q and writing O
    for (std::int64_t jb = 0; jb < plan.nkb; ++jb)
      cost += classify(p, b, i0, i1, jb * plan.bk, std::min(p.Sk, (jb + 1) * plan.bk)) != Cover::hidden;
    prefix[static_cast<std::size_t>(it) + 1] = prefix[static_cast<std::size_t>(it)] + cost;
  }
  const std::int64_t total = prefix.back();
  const double flops_per_block = 2.0 * double(plan.bq) * double(plan.bk) * double(p.D + p.Dv);
  const auto nt = static_cast<int>(std::max<double>(
      1.0, std::min<double>(resolve_threads(p.threads), std::min<double>(double(items), double(total) * flops_per_block / kMinFlopsPerThread))));

  auto run_items = [](Worker<T>& w, const Plan<T>& pl, std::int64_t begin, std::int64_t end) {
    for (std::int64_t it = begin; it < end; ++it) {
      const std::int64_t qb = it % pl.nqb, h = (it / pl.nqb) % pl.p.H, b = it / (pl.nqb * pl.p.H);
      w.run(b, h, qb);
    }
  };
  if (nt == 1) {
    Worker<T> w(plan, thread_buffer<T, kAttention>().get(plan.scratch_size()));
    run_items(w, plan, 0, items);
    return;
  }

  // Each thread owns the items whose cost prefix starts in its equal share of the total, and
  // takes them from the front in runs of about an eighth of the share; a thread whose share is
  // done takes the back half of what is left of the fullest other share. A thread slowed down
  // (another process on its core, a VM's noisy neighbour) then leaves work to the others instead
  // of keeping them waiting at the join (a static split spent 7.7% of sdcross at 2 threads
  // spinning in libgomp), while each share is still walked in order, so K/V blocks packed for
  // one query block serve the next. Every item is computed the same way by whichever thread
  // takes it: the output does not depend on the schedule.
  thread_local std::vector<std::int64_t> share_storage;
  std::vector<std::int64_t>& share = share_storage;  // [2t]: next item of share t, [2t + 1]: its end
  share.resize(2 * static_cast<std::size_t>(nt));
  for (int t = 0; t < nt; ++t) {
    share[2 * t] = std::lower_bound(prefix.begin(), prefix.end() - 1, total * t / nt) - prefix.begin();
    share[2 * t + 1] = std::lower_bound(prefix.begin(), prefix.end() - 1, total * (t + 1) / nt) - prefix.begin();
  }
  bool failed = false;
#pragma omp parallel num_threads(nt)
  {
    try {
      Worker<T> w(plan, thread_buffer<T, kAttention>().get(plan.scratch_size()));
      const int t = omp_get_thread_num(), threads = omp_get_num_threads();
      const std::int64_t run = std::max<std::int64_t>(1, (share[2 * t + 1] - share[2 * t]) / 8);
      for (;;) {
        std::int64_t begin = 0, end = 0;
#pragma omp critical(simdattn_flash_claim)
        {
          std::int64_t& own = share[2 * static_cast<std::size_t>(t)];
          const std::int64_t own_end = share[2 * static_cast<std::size_t>(t) + 1];
          if (own < own_end) {
            begin = own;
            end = std::min(own_end, own + run);
            own = end;
          } else {
            int victim = -1;
            std::int64_t most = 0;
            for (int v = 0; v < threads; ++v) {
              const std::int64_t left = share[2 * static_cast<std::size_t>(v) + 1] - share[2 * static_cast<std::size_t>(v)];
              if (left > most) most = left, victim = v;
            }
            if (victim >= 0) {
              std::int64_t& victim_end = share[2 * static_cast<std::size_t>(victim) + 1];
              end = victim_end;
              begin = end - (most + 1) / 2;
              victim_end = begin;
            }
          }
        }
        if (begin >= end) break;
        run_items(w, plan, begin, end);
      }
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      failed = true;
    }
  }
  if (failed) throw std::bad_alloc();
}

}  // namespace

void attention_native(const Problem& p) {
  if (p.dtype == DType::f32) flash<float>(p);
  else flash<double>(p);
}

}  // namespace simdattn::detail

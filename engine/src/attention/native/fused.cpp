// The native backend's fused path (flash attention) on the simd/ micro-kernels.
//
// For each (batch b, head h, block of up to kBlockQ query rows):
//   Q block, read in place (rows copied only if D is strided)  [br, D]
//   for each key block of k_keys keys (128; up to 256 when that is all of them) that the
//   visibility rule does not hide entirely:
//     S = Q_blk K_blk^T             (in-place-A micro-kernel)   [br, Bc]
//     scale, mask (only where the block is not fully visible), row max m_new
//     P = exp(S - m_new), row sums; O and l rescaled by exp(m_old - m_new) only when m grows
//     O += P V_blk                  (in-place-A micro-kernel)   [br, Dv]
//   out = O / l, with l == 0 (no visible key) giving a zero row.
// The Sq x Sk score matrix is never formed: S is one [br, Bc] block in the thread's scratch.
//
// Both GEMMs run the short, wide in-place-A tile (6 x 64 f32 on AVX-512), so neither Q nor P is
// packed. K^T and V are packed into the thread's scratch a key block at a time, when a query block
// first computes that block (its rows prefetched by the products of the block before, or for a
// kv head's first block by the last products of the head before), and every
// later query block (and every query head of a grouped-query group) of that kv head reuses them.
// The online-softmax step of a block's rows is one call (VectorKernels::softmax_rows). Threads
// own equal shares of the flattened (batch, head, query block) items by the number of key blocks
// each computes (so causal work splits evenly) and steal when theirs is done (parallel_shares).
// Every row is computed the same way whatever the thread count or schedule: results are bitwise
// identical for any count.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "attention/native/paths.hpp"
#include "attention/native/rows.hpp"
#include "core/element.hpp"
#include "core/fp_env.hpp"
#include "core/position_rule.hpp"
#include "linalg/convert.hpp"
#include "linalg/panels.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

// Query rows per block: a multiple of the in-place tile heights (6 on AVX-512) so that full
// blocks have no short tiles; 96 rows x 128 keys of S is 48 KiB (f32), in L2 beside
// the packed K^T and V blocks.
constexpr std::int64_t kBlockQ = 96;
// Keys per block: a multiple of every ISA's panel width (32, 16, 8 f32 columns); also the
// granularity at which causal masks and windows skip whole blocks. Up to kMaxBlockK keys
// (vit's 197) go as one block: one online-softmax step and one pass over O per query block
// instead of two.
constexpr std::int64_t kBlockK = 128;
constexpr std::int64_t kMaxBlockK = 256;
// On AMX tiles (FusedPlan::amx): query blocks of up to 128 rows (four groups of 32 tile rows),
// their rows a multiple of 16 (one tile's), and key blocks of kMaxBlockK keys (round_up(Sk, 32)
// when fewer): half as many softmax steps and passes over O per key as 128 (gpt.bf16/t1 21.7 ms
// against 24.7, batch.bf16/t1 15.7 against 19.2; 512 keys: 22.4 and 15.8).
constexpr std::int64_t kBlockQTiles = 128;
constexpr std::int64_t kMaxBlockQ = std::max(kBlockQ, kBlockQTiles);
// Largest register-tile height or panel width of any ISA (bounds the row-pointer arrays).
constexpr std::int64_t kMaxTile = 64;

// Everything one call needs to know, shared by its threads.
// T: the type computed in (f32 or f64); S: the type q, k, v and out are stored in (T, or bf16 /
// f16 computed in f32: K and V rows widened while they are packed, Q rows while they are copied,
// and the normalised output narrowed to nearest even as it is written).
template <class T, class S>
struct FusedPlan {
  const Problem& p;
  const simd::KernelTable& kt;
  const simd::GemmKernels<T>& gk;
  const simd::VectorKernels<T>& vk;
  std::int64_t tile_rows, tile_cols;  // the in-place-A tile both GEMMs run on
  std::int64_t lanes;                 // elements per vector
  std::int64_t dv_computed;           // Dv rounded up to a vector: the columns of O computed
  std::int64_t dv_padded;             // Dv rounded up to tile_cols: O's row stride in scratch
  std::int64_t q_blocks, k_blocks;    // query blocks per head, key blocks
  std::int64_t q_rows;                // query rows per block (the last may have fewer)
  std::int64_t k_keys;                // keys per block (the last may have fewer)
  // Scratch layout (elements, each part 64-byte aligned): packed K^T and V of one kv head,
  // packed Q block, S block, O block, row max m, row sum l and rescale factor, which key blocks
  // are packed.
  std::int64_t k_size, v_size, q_size, s_size, o_size, row_size, flag_size;
  std::int64_t conv_size;  // 16-bit storage: a panel of K rows, or a block of V rows, widened
  std::int64_t t5_reach = 0, t5_size = 0;  // T5's bias by relative position in [-reach, reach]
  // AMX (bf16 on a table with tile kernels, D <= 256): both products on tiles. K packed as pairs
  // along D per panel of 32 keys, V as pairs along the keys per panel of 32 columns, the Q block
  // and the probabilities P as tiles of 32 x 32 bf16 (elements of uint16 held in T's scratch).
  bool amx = false;
  std::int64_t max_rows;  // the most rows of a query block: kBlockQ, or kBlockQTiles on tiles
  std::int64_t dp = 0;  // D rounded up to 32
  std::int64_t k16_size = 0, v16_size = 0, q16_size = 0, p16_size = 0;

  FusedPlan(const Problem& prob, const simd::KernelTable& table)
      : p(prob), kt(table), gk(table.gemm<T>()), vk(table.vec<T>()) {
    tile_rows = gk.blocking_a_in_place.mr;
    tile_cols = gk.blocking_a_in_place.nr;
    lanes = gk.blocking_a_in_place.lanes;
    dv_computed = round_up(p.Dv, lanes);
    if (tile_cols > kMaxTile || kBlockK % tile_cols != 0) std::abort();  // ISA table invariant
    amx = fused_on_tiles(p);
    max_rows = amx ? kBlockQTiles : kBlockQ;
    const std::int64_t row_unit = amx ? 16 : tile_rows;
    if (amx) k_keys = std::min(kMaxBlockK, round_up(std::max<std::int64_t>(p.Sk, 1), 32));  // Sk = 0: one empty block
    else k_keys = p.Sk > kBlockK && p.Sk <= kMaxBlockK ? round_up(p.Sk, tile_cols) : kBlockK;
    dv_padded = round_up(p.Dv, tile_cols);
    // Equal blocks of at most max_rows rows, rounded to the tile height: Sq = 128 gives 66 + 62
    // rather than 96 + 32.
    q_blocks = (p.Sq + max_rows - 1) / max_rows;
    q_rows = q_blocks > 0 ? std::min(max_rows, round_up((p.Sq + q_blocks - 1) / q_blocks, row_unit)) : max_rows;
    // A block mask: query blocks inside one row of bs x bs blocks (bs or bs / 2 rows), so that
    // a query block's key panels are hidden or listed as a whole.
    // (Small blocks keep the default: row blocks of a few rows would starve the micro-kernel.)
    if (p.block_mask != nullptr && p.block_size >= 16 && p.block_size <= kBlockQ) q_rows = p.block_size;
    else if (p.block_mask != nullptr && p.block_size % 2 == 0 && p.block_size / 2 >= 16 && p.block_size / 2 <= kBlockQ)
      q_rows = p.block_size / 2;
    // A narrow window (left side bounded): each query block computes its own rows' span plus
    // the window; halving the block trims that span (long with window 512: 560 keys a block
    // instead of 608). Guarded by sparse/native/long-window512.
    if (p.block_mask == nullptr && p.has_window && p.window_left >= 0 && p.window_left <= 8 * k_keys)
      q_rows = std::min(q_rows, round_up(kBlockQ / 2, row_unit));
    q_blocks = q_blocks > 0 ? (p.Sq + q_rows - 1) / q_rows : 0;
    k_blocks = (p.Sk + k_keys - 1) / k_keys;
    const std::int64_t a = kLineElems<T>;
    k_size = round_up(k_blocks * p.D * k_keys, a);
    v_size = round_up(k_blocks * k_keys * dv_padded, a);
    q_size = round_up(max_rows * p.D, a);
    s_size = round_up(max_rows * k_keys, a);
    o_size = round_up(max_rows * dv_padded, a);
    row_size = round_up(max_rows, a);
    flag_size = round_up(k_blocks, a);
    conv_size = std::is_same_v<S, T> ? 0 : round_up(std::max(tile_cols * p.D, k_keys * p.Dv), a);
    t5_reach = t5_table_reach(p);
    t5_size = p.t5_table != nullptr ? round_up(2 * t5_reach + 1, a) : 0;
    if constexpr (std::is_same_v<S, bfloat16> && std::is_same_v<T, float>) {
      if (amx) {
        dp = round_up(p.D, 32);
        const std::int64_t groups = (max_rows + 31) / 32;
        k16_size = round_up(k_blocks * k_keys * dp / 2, a);
        v16_size = round_up(k_blocks * k_keys * round_up(p.Dv, 32) / 2, a);
        q16_size = round_up(groups * 32 * dp / 2, a);
        p16_size = round_up(groups * 32 * k_keys / 2, a);
        k_size = v_size = conv_size = 0;  // the f32 panels and the widening buffer are not used
      }
    }
  }
  std::size_t scratch_size() const {
    return static_cast<std::size_t>(k_size + v_size + q_size + s_size + o_size + 3 * row_size + flag_size + conv_size +
                                    t5_size + k16_size + v16_size + q16_size + p16_size);
  }
};

template <class T, class S>
class FusedWorker {
  static constexpr bool kWiden = !std::is_same_v<S, T>;

 public:
  FusedWorker(const FusedPlan<T, S>& plan, T* scratch_base) : plan_(plan), prob_(plan.p) {
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
    p16_ = reinterpret_cast<std::uint16_t*>(s);
  }

  // Computes item (b, h, query block qb).
  void run(std::int64_t b, std::int64_t h, std::int64_t qb) {
    const std::int64_t hk = kv_head(h);
    if (b != packed_b_ || hk != packed_hk_) start_kv(b, hk);
    const std::int64_t i0 = qb * plan_.q_rows, br = std::min(plan_.q_rows, prob_.Sq - i0);
    prepare_q(b, h, i0, br);
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (std::int64_t r = 0; r < br; ++r) m_[r] = neg_inf, l_[r] = T(0);

    // O is not cleared: the first computed block writes it (beta = 0); until then every row
    // max is -inf, so no rescale reads it. A query block with no visible key never reads it.
    bool first = true;
    // Keys [j0 + a, j0 + a + n) of key block jb (a a multiple of the vector width).
    auto step = [&](std::int64_t jb, std::int64_t a, std::int64_t n, Cover cover) {
      const std::int64_t j0 = jb * plan_.k_keys;
      if (packed_[jb] == T(0)) pack_block(jb);
      prefetch_block(jb + 1);
      if (first) prefetch_next_rows(b, h, i0 + br);
      if (jb + 1 == plan_.k_blocks && qb + 1 == plan_.q_blocks) prefetch_next_head(b, h);
      if (plan_.amx) {
        step_amx(b, h, i0, br, jb, a, n, cover, first);
      } else {
        scores(jb, a, n, br);
        softmax_update(b, h, i0, br, j0 + a, a, n, cover, first);
        accumulate(jb, a, n, br, first ? T(0) : T(1));
      }
      first = false;
    };
    for (std::int64_t jb = 0; jb < plan_.k_blocks; ++jb) {
      const std::int64_t j0 = jb * plan_.k_keys, nk = std::min(plan_.k_keys, prob_.Sk - j0);
      const Cover cover = classify(prob_, b, i0, i0 + br, j0, j0 + nk);
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
            const Cover sub = classify(prob_, b, i0, i0 + br, j0 + e, j0 + e + n);
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
  // K^T of kv head (b, hk) as B panels of tile_cols keys: block jb, panel c, row d holds keys
  // j0 + c*nr .. + nr - 1 at dimension d. V as B panels of tile_cols columns: block jb, panel c,
  // row j holds V[j0 + j, c*tile_cols .. + tile_cols - 1]. Zero past the key length L[b] and Dv. A block is
  // packed when a query block first computes it (blocks past L[b] are hidden, never visited:
  // K/V past L[b] are never read, and a large, mostly empty KV cache costs only its used part),
  // its rows prefetched while the block before it is computed.
  void start_kv(std::int64_t b, std::int64_t hk) {
    k_ = k_head(b, hk);
    v_ = v_head(b, hk);
    key_len_ = prob_.key_len(b);
    std::fill(packed_, packed_ + plan_.k_blocks, T(0));
    packed_b_ = b;
    packed_hk_ = hk;
  }
  void pack_block(std::int64_t jb) {
    if (plan_.amx) {
      pack_block_amx(jb);
      return;
    }
    const std::int64_t nr = plan_.tile_cols, tile_cols = plan_.tile_cols, D = prob_.D;
    T* kb = kp_ + jb * D * plan_.k_keys;
    for (std::int64_t c = 0; c < plan_.k_keys / nr; ++c) {
      T* panel = kb + c * D * nr;
      const std::int64_t j0 = jb * plan_.k_keys + c * nr;
      const std::int64_t n = std::max<std::int64_t>(0, std::min(nr, key_len_ - j0));
      if constexpr (kWiden) {
        if (prob_.k_strides[3] == 1) {  // widened as the transpose loads them
          const simd::Convert16Kernels& cv = std::is_same_v<S, bfloat16> ? plan_.kt.convert_bf16 : plan_.kt.convert_f16;
          cv.pack_transpose(reinterpret_cast<const std::uint16_t*>(n > 0 ? k_ + j0 * prob_.k_strides[2] : k_), prob_.k_strides[2], n, D,
                            panel, nr, nr);
        } else {  // the panel's n key rows widened to conv_ (n x D), then transposed from there
          widen_rows(k_ + j0 * prob_.k_strides[2], prob_.k_strides[2], prob_.k_strides[3], n, D, conv_, D);
          plan_.vk.pack_transpose(conv_, D, n, D, panel, nr, nr);
        }
      } else if (prob_.k_strides[3] == 1) {
        plan_.vk.pack_transpose(n > 0 ? k_ + j0 * prob_.k_strides[2] : k_, prob_.k_strides[2], n, D, panel, nr, nr);
      } else {
        for (std::int64_t d = 0; d < D; ++d)
          for (std::int64_t q = 0; q < nr; ++q) panel[d * nr + q] = q < n ? k_[(j0 + q) * prob_.k_strides[2] + d * prob_.k_strides[3]] : T(0);
      }
    }
    // keys past L[b] are never read: V there may hold anything (a cache tail)
    const std::int64_t rows = std::min(plan_.k_keys, key_len_ - jb * plan_.k_keys);
    T* vb = vp_ + jb * plan_.k_keys * plan_.dv_padded;
    const S* vsrc = v_ + jb * plan_.k_keys * prob_.v_strides[2];
    if constexpr (kWiden) {
      if (plan_.dv_padded == tile_cols && prob_.Dv == tile_cols) {  // one full panel: rows back to back
        widen_rows(vsrc, prob_.v_strides[2], prob_.v_strides[3], rows, tile_cols, vb, tile_cols);
        std::fill(vb + rows * tile_cols, vb + plan_.k_keys * tile_cols, T(0));
      } else {  // the block's rows widened (one call when dense), then cut into panels
        widen_rows(vsrc, prob_.v_strides[2], prob_.v_strides[3], rows, prob_.Dv, conv_, prob_.Dv);
        pack_row_panels(conv_, prob_.Dv, std::int64_t{1}, rows, plan_.k_keys, prob_.Dv, tile_cols,
                        plan_.dv_padded / tile_cols, vb);
      }
    } else {
      pack_row_panels(vsrc, prob_.v_strides[2], prob_.v_strides[3], rows, plan_.k_keys, prob_.Dv, tile_cols, plan_.dv_padded / tile_cols, vb);
    }
    packed_[jb] = T(1);
  }
  // The rows of key block jb, if it holds keys below L[b] and is not packed yet, become the
  // next prefetches of the micro-kernels.
  void prefetch_block(std::int64_t jb) {
    next_.clear();
    const std::int64_t j0 = jb * plan_.k_keys;
    if (jb >= plan_.k_blocks || j0 >= key_len_ || packed_[jb] != T(0)) return;
    prefetch_kv(k_, v_, j0, std::min(plan_.k_keys, key_len_ - j0));
  }
  // K and V rows j0 .. j0 + rows - 1 of the kv head whose rows start at k and v become the next
  // prefetches.
  void prefetch_kv(const S* k, const S* v, std::int64_t j0, std::int64_t rows) {
    next_.add(k + j0 * prob_.k_strides[2], prob_.k_strides[2], prob_.k_strides[3], rows, prob_.D);
    next_.add(v + j0 * prob_.v_strides[2], prob_.v_strides[2], prob_.v_strides[3], rows, prob_.Dv);
  }
  // Query head h's kv head, and the first K and V rows of kv head (b, hk).
  std::int64_t kv_head(std::int64_t h) const { return h / (prob_.H / prob_.Hkv); }
  const S* k_head(std::int64_t b, std::int64_t hk) const {
    return static_cast<const S*>(prob_.k) + b * prob_.k_strides[0] + hk * prob_.k_strides[1];
  }
  const S* v_head(std::int64_t b, std::int64_t hk) const {
    return static_cast<const S*>(prob_.v) + b * prob_.v_strides[0] + hk * prob_.v_strides[1];
  }

  // The Q rows the next query block of head (b, h) reads in place and the output rows it
  // writes (from row i1 on), after any K/V rows: prefetched while the current block's first
  // key block is computed.
  void prefetch_next_rows(std::int64_t b, std::int64_t h, std::int64_t i1) {
    if (i1 >= prob_.Sq) return;
    const std::int64_t rows = std::min(plan_.q_rows, prob_.Sq - i1);
    next_.add(static_cast<const S*>(prob_.q) + b * prob_.q_strides[0] + h * prob_.q_strides[1] + i1 * prob_.q_strides[2], prob_.q_strides[2], prob_.q_strides[3], rows,
              prob_.D);
    next_.add(static_cast<const S*>(prob_.o) + b * prob_.o_strides[0] + h * prob_.o_strides[1] + i1 * prob_.o_strides[2], prob_.o_strides[2], prob_.o_strides[3], rows,
              prob_.Dv);
  }

  // K and V of the first key block of the kv head that the item after head (b, h)'s last query
  // block starts, if another: prefetched while that last block is computed, so that a call whose
  // operands are not in cache (a service's request, after other requests ran) does not wait on
  // memory at the start of each head. (Its Q and O rows too, or the K/V of the next head already
  // from the first query block on, were slower: the micro-kernels' prefetch budget is spent on
  // lines needed later.)
  void prefetch_next_head(std::int64_t b, std::int64_t h) {
    std::int64_t nb = b, nh = h + 1;
    if (nh == prob_.H) nb = b + 1, nh = 0;
    if (nb >= prob_.B) return;
    const std::int64_t nhk = kv_head(nh);
    if (nb == packed_b_ && nhk == packed_hk_) return;
    const std::int64_t rows = std::min(plan_.k_keys, prob_.key_len(nb));
    if (rows > 0) prefetch_kv(k_head(nb, nhk), v_head(nb, nhk), 0, rows);
  }

  // Q rows i0 .. i0 + br - 1 of head (b, h), as a pointer and row stride the micro-kernel can
  // read in place: Q itself when its rows are contiguous in D, else a copy.
  void prepare_q(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
    if (plan_.amx) {
      prepare_q_amx(b, h, i0, br);
      return;
    }
    const S* q = static_cast<const S*>(prob_.q) + b * prob_.q_strides[0] + h * prob_.q_strides[1] + i0 * prob_.q_strides[2];
    if constexpr (kWiden) {
      widen_rows(q, prob_.q_strides[2], prob_.q_strides[3], br, prob_.D, qp_, prob_.D);
    } else {
      if (prob_.q_strides[3] == 1) {
        q_ = q;
        ldq_ = prob_.q_strides[2];
        return;
      }
      for (std::int64_t r = 0; r < br; ++r)
        for (std::int64_t d = 0; d < prob_.D; ++d) qp_[r * prob_.D + d] = q[r * prob_.q_strides[2] + d * prob_.q_strides[3]];
    }
    q_ = qp_;
    ldq_ = prob_.D;
  }

  // S[0:br, a:a + round_up(n, lanes)] = Q_blk K^T for keys a .. a + n - 1 of key block jb
  // (unscaled; a is a multiple of the vector width). Each panel runs only the vectors it has
  // keys for: the first from vector offset o (aligned: the panel's rows are), the last up to
  // its last key.
  void scores(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br) {
    const std::int64_t tile_rows = plan_.tile_rows, tile_cols = plan_.tile_cols, D = prob_.D, nk = a + n;
    const T* kb = kp_ + jb * D * plan_.k_keys;
    for (std::int64_t c = a / tile_cols; c * tile_cols < nk; ++c) {
      const std::int64_t o = std::max<std::int64_t>(0, a - c * tile_cols);
      const std::int64_t nv = (std::min(tile_cols, nk - c * tile_cols) - o + plan_.lanes - 1) / plan_.lanes;
      const std::int64_t rows = nv == 1 ? 2 * tile_rows : tile_rows;  // one-vector tiles are twice as tall
      for (std::int64_t r0 = 0; r0 < br; r0 += rows) {
        const std::int64_t m = std::min(rows, br - r0);
        const NextRows::Run pf = next_.take(D);
        plan_.gk.ukernel_a_in_place_pf[nv][m](D, q_ + r0 * ldq_, ldq_, kb + c * D * tile_cols + o, tile_cols,
                                         sb_ + r0 * plan_.k_keys + c * tile_cols + o, plan_.k_keys, T(1), T(0), pf.at, pf.lines);
      }
    }
  }

  // Scale and mask S, then the online softmax step for the block's rows (VectorKernels::
  // softmax_rows): P = exp(S - m_new) in place, l and O rescaled where the row max grew.
  // Keys j0 .. j0 + nk - 1 sit at column a of S. Fully visible blocks are scaled inside that
  // step; the others are scaled and masked row by row first.
  void softmax_update(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br, std::int64_t j0,
                      std::int64_t a, std::int64_t nk, Cover cover, bool first) {
    const StepRows sr = step_rows(b, h, i0, 0, br, j0, a, nk, cover, true);
    // NaN scores do not raise the max; they reach l and O through P instead.
    plan_.vk.softmax_rows(sb_ + a, plan_.k_keys, br, nk, sr.scale, sr.cap, sr.lo, sr.hi, m_, l_, alpha_);
    if (!first) rescale_out(0, br);  // else O is written (beta = 0) by this block's product
  }

  // How the softmax step sees rows r0 .. r0 + rows - 1 of the block for keys j0 .. j0 + nk - 1
  // (at column a of S): all keys at the call's scale, or (key lengths, causal and windows
  // only) one visible interval per row, which the softmax step itself keeps to, or (masks,
  // sparse patterns and score modifiers) scaled, modified and masked here, row by row. A soft
  // cap alone (no ALiBi, T5 bias, mask or sparse pattern) is the step's own where it takes one
  // (step_cap: the f32 and f64 step; the AMX step does not).
  struct StepRows {
    T scale;
    T cap;
    const std::int64_t* lo;
    const std::int64_t* hi;
  };
  StepRows step_rows(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t r0, std::int64_t rows, std::int64_t j0,
                     std::int64_t a, std::int64_t nk, Cover cover, bool step_cap) {
    StepRows sr{static_cast<T>(prob_.scale), T(0), nullptr, nullptr};
    const bool cap_in_step = step_cap && prob_.softcap > 0.0 && prob_.alibi == nullptr && prob_.t5_table == nullptr &&
                             !prob_.sparse() && prob_.mask_kind == MaskKind::none;
    const bool modified = prob_.scores_modified() && !cap_in_step;
    if (cap_in_step) sr.cap = static_cast<T>(prob_.softcap);
    if (cover == Cover::full && !modified) return sr;
    if (!prob_.sparse() && prob_.mask_kind == MaskKind::none && !modified) {
      for (std::int64_t r = r0; r < r0 + rows; ++r) {
        const KeyRange keys = row_keys_in(prob_, b, i0 + r, j0, nk);
        lo_[r] = keys.lo, hi_[r] = keys.hi;
      }
      sr.lo = lo_.data() + r0, sr.hi = hi_.data() + r0;
      return sr;
    }
    // ALiBi and T5: one line for these rows (row r reads it from r0 + rows - 1 - r on)
    const T* line = nullptr;
    if (prob_.alibi != nullptr || prob_.t5_table != nullptr) {
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
      scale_mask_row(prob_, plan_.vk, sb_ + r * plan_.k_keys + a, b, h, i0 + r, j0, nk, false,
                     line != nullptr ? line + (r0 + rows - 1 - r) : nullptr);
      if (intervals) {
        const KeyRange keys = row_keys_in(prob_, b, i0 + r, j0, nk);
        lo_[r] = keys.lo, hi_[r] = keys.hi;
      }
    }
    if (intervals) sr.lo = lo_.data() + r0, sr.hi = hi_.data() + r0;
    sr.scale = T(1);
    return sr;
  }

  // O rows r0 .. r0 + rows - 1 rescaled by the softmax step's alpha where it is not 1.
  void rescale_out(std::int64_t r0, std::int64_t rows) {
    for (std::int64_t r = r0; r < r0 + rows; ++r) {
      if (alpha_[r] == T(1)) continue;
      T* o = ob_ + r * plan_.dv_padded;
      // alpha = -1: the row's first visible key. What earlier blocks left in its O row is
      // 0 * V of keys it cannot see, which is NaN where such V is Inf or NaN: start from zeros.
      if (alpha_[r] < T(0)) std::fill(o, o + plan_.dv_computed, T(0));
      else plan_.vk.scale(o, plan_.dv_computed, alpha_[r]);
    }
  }

  // O[0:br, :] = P[0:br, a:a + n] V_blk[a:a + n, :] + beta * O
  void accumulate(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br, T beta) {
    const std::int64_t tile_rows = plan_.tile_rows, tile_cols = plan_.tile_cols;
    const T* vb = vp_ + jb * plan_.k_keys * plan_.dv_padded;
    for (std::int64_t c = 0; c < plan_.dv_padded / tile_cols; ++c) {
      const std::int64_t nv = (std::min(tile_cols, prob_.Dv - c * tile_cols) + plan_.lanes - 1) / plan_.lanes;
      for (std::int64_t r0 = 0; r0 < br; r0 += tile_rows) {
        const std::int64_t m = std::min(tile_rows, br - r0);
        const NextRows::Run pf = next_.take(n);
        plan_.gk.ukernel_a_in_place_pf[nv][m](n, sb_ + r0 * plan_.k_keys + a, plan_.k_keys, vb + c * plan_.k_keys * tile_cols + a * tile_cols, tile_cols,
                                         ob_ + r0 * plan_.dv_padded + c * tile_cols, plan_.dv_padded, T(1), beta, pf.at, pf.lines);
      }
    }
  }

  void write_out(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
    if (!prob_.online_softmax_only())  // sinks join l, lse written
      for (std::int64_t r = 0; r < br; ++r) finish_row(prob_, b, h, i0 + r, m_[r], l_[r]);
    if constexpr (kWiden) {
      // normalised in place, its rows packed Dv apart (rows with l == 0 become zeros), then
      // narrowed to nearest even: one conversion call where out's rows are dense too (sdcross's
      // 40-wide rows: a call per row took 13% of sdcross.bf16)
      S* o = static_cast<S*>(prob_.o) + b * prob_.o_strides[0] + h * prob_.o_strides[1] + i0 * prob_.o_strides[2];
      plan_.vk.normalize_rows(ob_, plan_.dv_padded, br, prob_.Dv, l_, ob_, prob_.Dv);
      convert_matrix(ob_, dtype_of<T>(), prob_.Dv, 1, br, prob_.Dv, o, dtype_of<S>(), prob_.o_strides[2], prob_.o_strides[3]);
    } else {
      T* o = static_cast<T*>(prob_.o) + b * prob_.o_strides[0] + h * prob_.o_strides[1];
      if (prob_.o_strides[3] == 1) {
        plan_.vk.normalize_rows(ob_, plan_.dv_padded, br, prob_.Dv, l_, o + i0 * prob_.o_strides[2], prob_.o_strides[2]);
        return;
      }
      for (std::int64_t r = 0; r < br; ++r)
        write_output_row(prob_, plan_.vk, ob_ + r * plan_.dv_padded, l_[r], o + (i0 + r) * prob_.o_strides[2]);
    }
  }

  // ---- AMX (FusedPlan::amx; S is bfloat16) ----
  static std::uint16_t bits_at(const S* p) {
    std::uint16_t u;
    std::memcpy(&u, p, 2);
    return u;
  }
  const simd::Gemm16Kernels& amx() const { return plan_.kt.gemm_bf16; }
  std::uint16_t* k16_panel(std::int64_t jb, std::int64_t c) const {
    return k16_ + (jb * (plan_.k_keys / 32) + c) * plan_.dp * 32;
  }
  std::uint16_t* v16_panel(std::int64_t jb, std::int64_t c) const {
    return v16_ + (jb * round_up(prob_.Dv, 32) / 32 + c) * plan_.k_keys * 32;
  }
  // K of block jb: per panel of 32 keys, pair-row r holds (K[j, 2r], K[j, 2r + 1]) of its 32 keys;
  // V: per panel of 32 columns, pair-row r holds (V[2r, c], V[2r + 1, c]) of its 32 columns. Zero
  // past the key length, D and Dv.
  void pack_block_amx(std::int64_t jb) {
    const std::int64_t D = prob_.D, dp = plan_.dp, kk = plan_.k_keys, j00 = jb * kk;
    const std::int64_t rows = std::clamp<std::int64_t>(key_len_ - j00, 0, kk);
    // Pairs of D are 32-bit words: K's rows (as words) transposed by the f32 transposing pack
    // when they are (even D, unit inner stride, even row stride, 4-byte aligned).
    const bool words = D % 2 == 0 && prob_.k_strides[3] == 1 && prob_.k_strides[2] % 2 == 0 &&
                       reinterpret_cast<std::uintptr_t>(k_) % 4 == 0;
    for (std::int64_t c = 0; c < kk / 32; ++c) {
      std::uint16_t* dst = k16_panel(jb, c);
      const std::int64_t n = std::clamp<std::int64_t>(rows - c * 32, 0, 32);
      if (words) {
        // rows past n are zero; words past D / 2 (up to dp / 2) are zeroed after
        plan_.vk.pack_transpose(reinterpret_cast<const T*>(k_ + (j00 + c * 32) * prob_.k_strides[2]), prob_.k_strides[2] / 2, n, D / 2,
                                reinterpret_cast<T*>(dst), 32, 32);
        std::fill(dst + (D / 2) * 64, dst + dp * 32, std::uint16_t{0});
        continue;
      }
      std::fill(dst, dst + dp * 32, std::uint16_t{0});
      for (std::int64_t q = 0; q < n; ++q) {
        const S* src = k_ + (j00 + c * 32 + q) * prob_.k_strides[2];
        for (std::int64_t d = 0; d < D; ++d) dst[(d / 2) * 64 + 2 * q + (d & 1)] = bits_at(src + d * prob_.k_strides[3]);
      }
    }
    const std::int64_t vpanels = round_up(prob_.Dv, 32) / 32;
    for (std::int64_t c = 0; c < vpanels; ++c) {
      std::uint16_t* dst = v16_panel(jb, c);
      std::fill(dst, dst + kk * 32, std::uint16_t{0});
      const std::int64_t nc = std::min<std::int64_t>(32, prob_.Dv - c * 32);
      if (prob_.v_strides[3] == 1) {  // two rows into one row of 32-bit pairs (a loop the compiler vectorises)
        for (std::int64_t r = 0; r < rows; r += 2) {
          const auto* s0 = reinterpret_cast<const std::uint16_t*>(v_ + (j00 + r) * prob_.v_strides[2] + c * 32);
          const auto* s1 = r + 1 < rows ? s0 + prob_.v_strides[2] : nullptr;
          auto* out = reinterpret_cast<std::uint32_t*>(dst + (r / 2) * 64);
          if (s1 != nullptr)
            for (std::int64_t x = 0; x < nc; ++x) out[x] = std::uint32_t{s0[x]} | std::uint32_t{s1[x]} << 16;
          else
            for (std::int64_t x = 0; x < nc; ++x) out[x] = s0[x];
        }
        continue;
      }
      for (std::int64_t r = 0; r < rows; r += 2) {  // two rows into one row of 32-bit pairs
        const S* s0 = v_ + (j00 + r) * prob_.v_strides[2] + c * 32 * prob_.v_strides[3];
        const S* s1 = r + 1 < rows ? s0 + prob_.v_strides[2] : nullptr;
        auto* out = reinterpret_cast<std::uint32_t*>(dst + (r / 2) * 64);
        for (std::int64_t x = 0; x < nc; ++x)
          out[x] = bits_at(s0 + x * prob_.v_strides[3]) | (s1 ? std::uint32_t{bits_at(s1 + x * prob_.v_strides[3])} << 16 : 0u);
      }
    }
    packed_[jb] = T(1);
  }
  // The Q block as tiles: per group of 32 rows and step of 32 of D, 32 rows of 32 bf16.
  void prepare_q_amx(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
    const S* q = static_cast<const S*>(prob_.q) + b * prob_.q_strides[0] + h * prob_.q_strides[1] + i0 * prob_.q_strides[2];
    const std::int64_t dp = plan_.dp, groups = (br + 31) / 32, D = prob_.D;
    if (prob_.q_strides[3] == 1) {  // rows past br are never read by a tile (its rows are configured to br's)
      for (std::int64_t r0 = 0; r0 < br; r0 += 32)
        amx().amx_pack_a(reinterpret_cast<const std::uint16_t*>(q + r0 * prob_.q_strides[2]), prob_.q_strides[2],
                         static_cast<int>(std::min<std::int64_t>(32, br - r0)), D, q16_ + r0 * dp);
      return;
    }
    std::fill(q16_, q16_ + groups * 32 * dp, std::uint16_t{0});
    for (std::int64_t r = 0; r < br; ++r) {
      std::uint16_t* g = q16_ + (r / 32) * 32 * dp + (r % 32) * 32;
      for (std::int64_t d = 0; d < D; ++d) g[(d / 32) * 1024 + d % 32] = bits_at(q + r * prob_.q_strides[2] + d * prob_.q_strides[3]);
    }
  }
  // One step (keys a .. a + n - 1 of key block jb) on tiles, in three phases over the block's
  // groups of 32 query rows: S = Q K^T over the panels of 32 keys covering the keys (unscaled);
  // the softmax step writing P as bf16 tiles over those panels (zeros outside the keys), and O's
  // rows rescaled; O (+)= P V. Phase by phase rather than group by group: the tile stores of S
  // and the vector stores of P have drained by the time the other unit reads them (sdcross.bf16
  // 4.5-4.7 ms against 4.8-5.1 at t1, vit.bf16 0.30-0.32 against 0.31-0.33).
  void step_amx(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br, std::int64_t jb, std::int64_t a,
                std::int64_t n, Cover cover, bool first) {
    if constexpr (std::is_same_v<T, float>) {
      const std::int64_t dp = plan_.dp, kk = plan_.k_keys, a32 = a / 32 * 32, e32 = round_up(a + n, 32);
      auto rows_of = [&](std::int64_t r0) { return static_cast<int>(std::min<std::int64_t>(32, br - r0)); };
      for (std::int64_t r0 = 0; r0 < br; r0 += 32)
        amx().amx_block(dp, q16_ + r0 * dp, 1024, 512, 64, rows_of(r0), k16_panel(jb, a32 / 32), dp * 32,
                        static_cast<int>(e32 - a32), sb_ + r0 * kk + a32, kk, false);
      for (std::int64_t r0 = 0; r0 < br; r0 += 32) {
        const StepRows sr = step_rows(b, h, i0, r0, rows_of(r0), jb * kk + a, a, n, cover, false);
        plan_.kt.amx_attention.softmax_rows(sb_ + r0 * kk + a, kk, rows_of(r0), n, sr.scale, sr.lo, sr.hi, m_ + r0, l_ + r0,
                                            alpha_ + r0, p16_ + r0 * kk + a32 * 32, a - a32);
      }
      if (!first) rescale_out(0, br);
      for (std::int64_t r0 = 0; r0 < br; r0 += 32)
        amx().amx_block(e32 - a32, p16_ + r0 * kk + a32 * 32, 1024, 512, 64, rows_of(r0), v16_panel(jb, 0) + (a32 / 2) * 64,
                        kk * 32, static_cast<int>(prob_.Dv), ob_ + r0 * plan_.dv_padded, plan_.dv_padded, !first);
    }
  }

  // rows x cols elements of stored rows (strides rs, cs) widened to dst (row stride ld).
  static void widen_rows(const S* src, std::int64_t rs, std::int64_t cs, std::int64_t rows, std::int64_t cols, T* dst,
                         std::int64_t ld) {
    convert_matrix(src, dtype_of<S>(), rs, cs, rows, cols, dst, dtype_of<T>(), ld);
  }

  const FusedPlan<T, S>& plan_;
  const Problem& prob_;
  T *kp_, *vp_, *qp_, *sb_, *ob_, *m_, *l_, *alpha_;
  T* packed_;  // packed_[jb] != 0: key block jb of the current kv head is packed
  T* conv_;    // 16-bit storage: widened K rows of one panel
  std::uint16_t *k16_ = nullptr, *v16_ = nullptr, *q16_ = nullptr, *p16_ = nullptr;  // AMX (FusedPlan::amx)
  const S *k_ = nullptr, *v_ = nullptr;  // the current kv head's K and V
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
void fused(const Problem& p) {
  const FusedPlan<T, S> plan(p, simd::kernels());
  const std::int64_t items = p.B * p.H * plan.q_blocks;
  if (items == 0) return;

  // Cost of each item in key blocks, prefix-summed: threads take equal shares of the total.
  thread_local std::vector<std::int64_t> prefix;
  prefix.resize(static_cast<std::size_t>(items) + 1);
  prefix[0] = 0;
  for (std::int64_t it = 0; it < items; ++it) {
    const std::int64_t qb = it % plan.q_blocks, b = it / (plan.q_blocks * p.H);
    const std::int64_t i0 = qb * plan.q_rows, i1 = std::min(p.Sq, i0 + plan.q_rows);
    std::int64_t cost = 1;  // packing Q and writing O
    for (std::int64_t jb = 0; jb < plan.k_blocks; ++jb)
      cost += classify(p, b, i0, i1, jb * plan.k_keys, std::min(p.Sk, (jb + 1) * plan.k_keys)) != Cover::hidden;
    prefix[static_cast<std::size_t>(it) + 1] = prefix[static_cast<std::size_t>(it)] + cost;
  }
  const double flops_per_block = 2.0 * double(plan.q_rows) * double(plan.k_keys) * double(p.D + p.Dv);
  const double useful = std::min(double(items), double(prefix.back()) * flops_per_block / kMinFlopsPerThread);
  const auto nt = static_cast<int>(std::max(1.0, std::min<double>(resolve_threads(p.threads), useful)));

  RegionFailure failure;
  parallel_shares(prefix, nt, [&](auto next_run) {
    failure.guard([&] {
      const FlushDenormals ftz;
      FusedWorker<T, S> worker(plan, thread_buffer<T, scratch::NativeAttention>().get(plan.scratch_size()));
      for (auto run = next_run(); run.first < run.second; run = next_run())
        for (std::int64_t it = run.first; it < run.second; ++it) {
          const std::int64_t qb = it % plan.q_blocks, h = (it / plan.q_blocks) % p.H;
          worker.run(it / (plan.q_blocks * p.H), h, qb);
        }
      if (plan.amx) plan.kt.gemm_bf16.amx_done();
    });
  });
  failure.rethrow();
}

}  // namespace

Refusal fused_tiles_why_not(const Problem& p) {
  const simd::KernelTable& table = simd::kernels();
  if (p.dtype != DType::bf16) return {"dtype {w} (bf16 only)", dtype_name(p.dtype)};
  if (table.gemm_bf16.amx_block == nullptr || table.amx_attention.softmax_rows == nullptr)
    return {"ISA {w} has no AMX tiles", simd::isa_name(table.isa)};
  if (p.D > 256) return {"D = {} > 256", p.D};
  return {};
}

void fused_attention(const Problem& p) {
  switch (p.dtype) {
    case DType::f64: fused<double, double>(p); break;
    case DType::bf16: fused<float, bfloat16>(p); break;
    case DType::f16: fused<float, float16>(p); break;
    default: fused<float, float>(p);
  }
}

}  // namespace simdattn::detail

// The native backend's short-key path (sdcross: 77 keys, D = Dv = 40), no mask: the transposed
// problem, with queries on the vector lanes. Per (batch, head, block of 4 panels of queries),
// for each panel of tile_cols queries:
//   Q^T panel        = the Q rows, transposed                        [D, tile_cols]
//   S^T              = K Q^T       (in-place-A tile over K's rows)   [L, tile_cols]
//   P^T              = exp(S^T - column max), the column sums l  (one call: softmax_cols)
//   O^T              = V^T P^T / l (in-place-A tile over V^T's rows) [Dv, tile_cols]
//   out rows         = O^T, transposed
// Keys and Dv are the tile rows, where a remainder costs a short tile, not lanes: the row-major
// form computes 80 lanes for 77 keys and 48 for 40 output columns (12% of its FLOPs idle), and
// softmax needs no horizontal reductions and no tails. All keys are one block, so the softmax
// is the plain one (max, then exp and sum, then O / l: Dv rows normalised rather than L). V^T
// is packed when a thread's item is of another kv head than its previous one (items of a head
// are claimed mostly in a row, one at a time: a thread slowed by a neighbour leaves items to the
// other). Guarded by attention/native/sdcross.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/native/paths.hpp"
#include "core/element.hpp"
#include "linalg/convert.hpp"
#include "runtime/prefetch.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {
namespace {

constexpr std::int64_t kShortMaxKeys = 96;
constexpr std::int64_t kPanelsPerItem = 4;

// T: the type computed in; S: the type q, k, v and out are stored in (T, or bf16 / f16 computed
// in f32: K of a kv head widened when V^T is packed, V and Q widened by their transposes, the
// output narrowed after its transpose).
template <class T, class S>
class ShortKeys {
  static constexpr bool kWiden = !std::is_same_v<S, T>;

 public:
  explicit ShortKeys(const Problem& p)
      : p_(p), gk_(simd::kernels().gemm<T>()), vk_(simd::kernels().vec<T>()) {
    tile_rows_ = gk_.blocking_a_in_place.mr, tile_cols_ = gk_.blocking_a_in_place.nr, lanes_ = gk_.blocking_a_in_place.lanes;
    q_rows_ = kPanelsPerItem * tile_cols_;
    q_blocks_ = (p.Sq + q_rows_ - 1) / q_rows_;
    ldvt_ = round_up(p.Sk, lanes_);
    vt_size_ = round_up(p.Dv * ldvt_, kLineElems<T>);
    qt_size_ = round_up(p.D * q_rows_, kLineElems<T>);
    st_size_ = round_up(p.Sk * q_rows_, kLineElems<T>);
    ot_size_ = round_up(p.Dv * q_rows_, kLineElems<T>);
    if (kWiden) {
      kw_size_ = round_up(p.Sk * p.D, kLineElems<T>);
      tmp_size_ = round_up(tile_cols_ * p.Dv, kLineElems<T>);
    }
  }

  std::int64_t items() const { return p_.B * p_.H * q_blocks_; }
  std::int64_t min_items_per_thread() const {
    const double flops_per_item = 2.0 * double(q_rows_) * double(p_.Sk) * double(p_.D + p_.Dv);
    return static_cast<std::int64_t>(kMinFlopsPerThread / flops_per_item) + 1;
  }
  std::size_t scratch_size() const {
    return static_cast<std::size_t>(vt_size_ + qt_size_ + st_size_ + ot_size_ + round_up(q_rows_, kLineElems<T>) + kw_size_ +
                                    tmp_size_);
  }

  // Per-thread state: the scratch parts and the kv head whose V^T is packed.
  struct State {
    T *vt, *qt, *st, *ot, *l;
    T *kw, *tmp;  // 16-bit storage: K of the kv head widened; output rows before they are narrowed
    std::int64_t packed_head = -1;  // b * Hkv + hk
  };
  State scratch(T* base) const {
    T* vt = base;
    T* qt = vt + vt_size_;
    T* st = qt + qt_size_;
    T* ot = st + st_size_;
    T* l = ot + ot_size_;
    T* kw = l + round_up(q_rows_, kLineElems<T>);
    return {vt, qt, st, ot, l, kw, kw + kw_size_};
  }

  // Item it = (batch b, head h, query block qb).
  void run(std::int64_t it, State& s) const {
    const std::int64_t qb = it % q_blocks_, h = (it / q_blocks_) % p_.H, b = it / (q_blocks_ * p_.H);
    const std::int64_t hk = h / (p_.H / p_.Hkv), L = p_.key_len(b);
    const std::int64_t i0 = qb * q_rows_, nq = std::min(q_rows_, p_.Sq - i0);
    S* o = static_cast<S*>(p_.o) + b * p_.o_strides[0] + h * p_.o_strides[1] + i0 * p_.o_strides[2];
    if (L == 0) {  // no visible key: zero rows
      for (std::int64_t r = 0; r < nq; ++r) std::fill(o + r * p_.o_strides[2], o + r * p_.o_strides[2] + p_.Dv, S{});
      return;
    }
    const S* v = static_cast<const S*>(p_.v) + b * p_.v_strides[0] + hk * p_.v_strides[1];
    const S* ks = static_cast<const S*>(p_.k) + b * p_.k_strides[0] + hk * p_.k_strides[1];
    if (s.packed_head != b * p_.Hkv + hk) {  // V^T of kv head (b, hk): row d holds V[0:L, d]
      if constexpr (kWiden) {
        convert16_kernels().pack_transpose(reinterpret_cast<const std::uint16_t*>(v), p_.v_strides[2], L, p_.Dv, s.vt, ldvt_, L);
        convert_matrix(ks, dtype_of<S>(), p_.k_strides[2], 1, L, p_.D, s.kw, dtype_of<T>(), p_.D);
      } else {
        vk_.pack_transpose(v, p_.v_strides[2], L, p_.Dv, s.vt, ldvt_, L);
      }
      s.packed_head = b * p_.Hkv + hk;
    }
    const S* q = static_cast<const S*>(p_.q) + b * p_.q_strides[0] + h * p_.q_strides[1] + i0 * p_.q_strides[2];
    const T* k;
    std::int64_t ldk;
    if constexpr (kWiden) k = s.kw, ldk = p_.D;
    else k = ks, ldk = p_.k_strides[2];
    for (std::int64_t c = 0; c * tile_cols_ < nq; ++c) panel(q, k, ldk, o, L, nq, c, s);
  }

 private:
  // Queries c * tile_cols .. of the item (q, o at its first row; nq rows in all).
  void panel(const S* q, const T* k, std::int64_t ldk, S* o, std::int64_t L, std::int64_t nq, std::int64_t c,
             const State& s) const {
    const std::int64_t qn = std::min(tile_cols_, nq - c * tile_cols_), nv = (qn + lanes_ - 1) / lanes_;
    // The next panel's Q rows and output rows, prefetched by this panel's products (the
    // transposes that read and write them otherwise wait on memory).
    NextRows next;
    if ((c + 1) * tile_cols_ < nq) {
      const std::int64_t qn1 = std::min(tile_cols_, nq - (c + 1) * tile_cols_);
      next.add(o + (c + 1) * tile_cols_ * p_.o_strides[2], p_.o_strides[2], p_.o_strides[3], qn1, p_.Dv);
      next.add(q + (c + 1) * tile_cols_ * p_.q_strides[2], p_.q_strides[2], p_.q_strides[3], qn1, p_.D);
    }
    const std::int64_t rows_t = nv == 1 ? 2 * tile_rows_ : tile_rows_;  // one-vector tiles are twice as tall
    T* qtc = s.qt + c * p_.D * tile_cols_;
    T* stc = s.st + c * p_.Sk * tile_cols_;
    T* otc = s.ot + c * p_.Dv * tile_cols_;
    T* l = s.l + c * tile_cols_;
    if constexpr (kWiden) {
      convert16_kernels().pack_transpose(reinterpret_cast<const std::uint16_t*>(q + c * tile_cols_ * p_.q_strides[2]), p_.q_strides[2], qn,
                                    p_.D, qtc, tile_cols_, nv * lanes_);
    } else {
      vk_.pack_transpose(q + c * tile_cols_ * p_.q_strides[2], p_.q_strides[2], qn, p_.D, qtc, tile_cols_, nv * lanes_);
    }
    for (std::int64_t r0 = 0; r0 < L; r0 += rows_t) {
      const NextRows::Run pf = next.take(p_.D);
      gk_.ukernel_a_in_place_pf[nv][std::min(rows_t, L - r0)](p_.D, k + r0 * ldk, ldk, qtc, tile_cols_,
                                                            stc + r0 * tile_cols_, tile_cols_, T(1), T(0), pf.at,
                                                            pf.lines);
    }
    vk_.softmax_cols(stc, tile_cols_, L, nv * lanes_, static_cast<T>(p_.scale), l);
    for (std::int64_t r0 = 0; r0 < p_.Dv; r0 += rows_t) {
      const NextRows::Run pf = next.take(L);
      gk_.ukernel_a_in_place_pf[nv][std::min(rows_t, p_.Dv - r0)](L, s.vt + r0 * ldvt_, ldvt_, stc, tile_cols_,
                                                                otc + r0 * tile_cols_, tile_cols_, T(1), T(0),
                                                                pf.at, pf.lines);
    }
    vk_.normalize_cols(otc, tile_cols_, p_.Dv, nv * lanes_, l);
    S* oc = o + c * tile_cols_ * p_.o_strides[2];
    if constexpr (kWiden) {
      vk_.pack_transpose(otc, tile_cols_, p_.Dv, qn, s.tmp, p_.Dv, p_.Dv);
      convert_matrix(s.tmp, dtype_of<T>(), p_.Dv, 1, qn, p_.Dv, oc, dtype_of<S>(), p_.o_strides[2]);
    } else {
      vk_.pack_transpose(otc, tile_cols_, p_.Dv, qn, oc, p_.o_strides[2], p_.Dv);
    }
    // A query with no finite score has zero weights, and 0 * an infinite V is NaN: zeros, as
    // the row-major kernel writes for a row with l == 0.
    for (std::int64_t r = 0; r < qn; ++r)
      if (l[r] == T(0)) std::fill(oc + r * p_.o_strides[2], oc + r * p_.o_strides[2] + p_.Dv, S{});
  }

  // The transposing packs of 16-bit storage (widening as they load).
  static const simd::Convert16Kernels& convert16_kernels() {
    return std::is_same_v<S, bfloat16> ? simd::kernels().convert_bf16 : simd::kernels().convert_f16;
  }

  const Problem& p_;
  const simd::GemmKernels<T>& gk_;
  const simd::VectorKernels<T>& vk_;
  std::int64_t tile_rows_, tile_cols_, lanes_;  // the in-place-A tile
  std::int64_t q_rows_, q_blocks_;               // queries per item, items per head
  std::int64_t ldvt_;                            // row stride of V^T: Sk rounded up to a vector
  std::int64_t vt_size_, qt_size_, st_size_, ot_size_;
  std::int64_t kw_size_ = 0, tmp_size_ = 0;
};

template <class T>
Refusal why_not(const Problem& p) {
  const simd::GemmKernels<T>& gk = simd::kernels().gemm<T>();
  const std::int64_t lanes = gk.blocking_a_in_place.lanes, panel = gk.blocking_a_in_place.nr;
  if (Refusal r = needs_more_than_softmax(p)) return r;
  if (p.Sk < 1 || p.Sk > kShortMaxKeys) return {"{} keys (1 to {} only)", p.Sk, kShortMaxKeys};
  if (p.mask_kind != MaskKind::none || p.causal != Causal::none || p.has_window || p.sparse())
    return {"a mask, causal, a window or a sparse pattern"};
  if (p.q_strides[3] != 1 || p.k_strides[3] != 1 || p.v_strides[3] != 1 || p.o_strides[3] != 1)
    return {"an operand strided along its last dimension"};
  if (p.Sq < panel) return {"Sq = {} < one panel of {} queries", p.Sq, panel};
  if (p.Sk % lanes == 0 && p.Dv % lanes == 0)
    return {"Sk = {} and Dv = {} are whole vectors (the row-major fused path has no idle lanes)", p.Sk, p.Dv};
  return {};
}

template <class T, class S>
void short_keys(const Problem& p) {
  const ShortKeys<T, S> path(p);
  const std::int64_t items = path.items();
  RegionFailure failure;
  parallel_claims(items, p.threads, path.min_items_per_thread(), [&](auto next_item) {
    failure.guard([&] {
      auto s = path.scratch(thread_buffer<T, scratch::NativeAttention>().get(path.scratch_size()));
      for (std::int64_t it = next_item(); it < items; it = next_item()) path.run(it, s);
    });
  });
  failure.rethrow();
}

}  // namespace

Refusal short_keys_why_not(const Problem& p) {
  if (p.kv_codes()) return {"K and V of dtype {w} (the 8-bit paths take them)", dtype_name(p.kv_dtype)};
  if (Refusal r = needs_dense_keys(p)) return r;
  return p.dtype == DType::f64 ? why_not<double>(p) : why_not<float>(p);
}

void short_keys_attention(const Problem& p) {
  visit_dtype(p.dtype, [&](auto s) { short_keys<compute_type<decltype(s)>, decltype(s)>(p); });
}

}  // namespace simdattn::detail

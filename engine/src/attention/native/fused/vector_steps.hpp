// The fused path's steps on the vector unit (FusedWorker, worker.hpp): K^T and V packed as
// panels from the key source's runs, the Q block, S = Q K^T and O += P V on the in-place-A
// micro-kernel, the online softmax.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/native/fused/worker.hpp"
#include "linalg/panels.hpp"

namespace simdattn::detail {
// Part of the files that include it (fused.cpp, decode.cpp): internal linkage, as if written there.
namespace {

template <class T, class S>
inline void FusedWorker<T, S>::pack_block(std::int64_t jb) {
  if (plan_.amx) {
    pack_block_amx(jb);
    return;
  }
  if (prob_.kv_codes()) {
    pack_block_codes(jb);
    return;
  }
  const std::int64_t nr = plan_.tile_cols, tile_cols = plan_.tile_cols, D = prob_.D, kk = plan_.k_keys;
  const std::int64_t ks = prob_.k_strides[2], kcs = prob_.k_strides[3];
  T* kb = kp_ + slot(jb) * D * kk;
  for (std::int64_t c = 0; c < kk / nr; ++c) {
    T* panel = kb + c * D * nr;
    const std::int64_t j0 = jb * kk + c * nr;
    const std::int64_t n = std::max<std::int64_t>(0, std::min(nr, key_len_ - j0));
    if (n == 0) {  // past the key length: zeros (no row read)
      plan_.vk.pack_transpose(panel, 0, 0, D, panel, nr, nr);
      continue;
    }
    if constexpr (kWiden) {
      if (kcs != 1) {  // the panel's n key rows widened to conv_ (n x D), then transposed from there
        for_runs(j0, n, [&](std::int64_t off, const KeyRun& r) { widen_rows(k_rows(r), ks, kcs, r.n, D, conv_ + off * D, D); });
        plan_.vk.pack_transpose(conv_, D, n, D, panel, nr, nr);
        continue;
      }
    } else if (kcs != 1) {
      for_runs(j0, n, [&](std::int64_t off, const KeyRun& r) {
        const S* k = k_rows(r);
        for (std::int64_t d = 0; d < D; ++d)
          for (std::int64_t q = 0; q < r.n; ++q) panel[d * nr + off + q] = k[q * ks + d * kcs];
      });
      for (std::int64_t d = 0; d < D; ++d) std::fill(panel + d * nr + n, panel + d * nr + nr, T(0));
      continue;
    }
    // run by run (one, when dense), each transposed into its columns; the last zero-fills the panel
    for_runs(j0, n, [&](std::int64_t off, const KeyRun& r) {
      const std::int64_t width = off + r.n == n ? nr - off : r.n;
      if constexpr (kWiden) {  // widened as the transpose loads them
        const simd::Convert16Kernels& cv = std::is_same_v<S, bfloat16> ? plan_.kt.convert_bf16 : plan_.kt.convert_f16;
        cv.pack_transpose(reinterpret_cast<const std::uint16_t*>(k_rows(r)), ks, r.n, D, panel + off, nr, width);
      } else {
        plan_.vk.pack_transpose(k_rows(r), ks, r.n, D, panel + off, nr, width);
      }
    });
  }
  // keys past L[b] are never read: V there may hold anything (a cache tail)
  const std::int64_t rows = std::min(kk, key_len_ - jb * kk), j0 = jb * kk, panels = plan_.dv_padded / tile_cols;
  const std::int64_t vs = prob_.v_strides[2], vcs = prob_.v_strides[3];
  T* vb = vp_ + slot(jb) * kk * plan_.dv_padded;
  if constexpr (kWiden) {
    if (plan_.dv_padded == tile_cols && prob_.Dv == tile_cols) {  // one full panel: rows back to back
      for_runs(j0, rows, [&](std::int64_t off, const KeyRun& r) { widen_rows(v_rows(r), vs, vcs, r.n, tile_cols, vb + off * tile_cols, tile_cols); });
      std::fill(vb + rows * tile_cols, vb + kk * tile_cols, T(0));
    } else {  // the block's rows widened (one call a run), then cut into panels
      for_runs(j0, rows, [&](std::int64_t off, const KeyRun& r) { widen_rows(v_rows(r), vs, vcs, r.n, prob_.Dv, conv_ + off * prob_.Dv, prob_.Dv); });
      pack_row_panels(conv_, prob_.Dv, std::int64_t{1}, rows, kk, prob_.Dv, tile_cols, panels, vb);
    }
  } else {
    for_runs(j0, rows, [&](std::int64_t off, const KeyRun& r) {
      pack_row_panels(v_rows(r), vs, vcs, r.n, r.n, prob_.Dv, tile_cols, panels, vb + off * tile_cols, kk * tile_cols);
    });
    pack_row_panels(vb, 0, 1, 0, kk - rows, prob_.Dv, tile_cols, panels, vb + rows * tile_cols, kk * tile_cols);
  }
  packed_[slot(jb)] = T(jb + 1);
}

template <class T, class S>
inline void FusedWorker<T, S>::pack_block_codes(std::int64_t jb) {
  if constexpr (std::is_same_v<T, float>) {
    const std::int64_t nr = plan_.tile_cols, D = prob_.D, kk = plan_.k_keys;
    T* kb = kp_ + slot(jb) * D * kk;
    for (std::int64_t c = 0; c < kk / nr; ++c) {
      const std::int64_t j0 = jb * kk + c * nr;
      const std::int64_t n = std::max<std::int64_t>(0, std::min(nr, key_len_ - j0));
      dequantize_keys(0, j0, n, conv_, D);
      plan_.vk.pack_transpose(conv_, D, n, D, kb + c * D * nr, nr, nr);
    }
    // keys past L[b] are never read
    const std::int64_t rows = std::min(kk, key_len_ - jb * kk), j0 = jb * kk;
    dequantize_keys(1, j0, rows, conv_, prob_.Dv);
    pack_row_panels(conv_, prob_.Dv, std::int64_t{1}, rows, kk, prob_.Dv, plan_.tile_cols, plan_.dv_padded / plan_.tile_cols,
                    vp_ + slot(jb) * kk * plan_.dv_padded);
    packed_[slot(jb)] = T(jb + 1);
  } else {
    std::abort();  // 8-bit K/V come with f32, bf16 or f16 q (validate.cpp): computed in f32
  }
}

template <class T, class S>
inline void FusedWorker<T, S>::prepare_q(const RowBlock& rb, std::int64_t br) {
  const std::int64_t b = rb.b, D = prob_.D;
  if (plan_.amx) {
    prepare_q_amx(rb, br);
    return;
  }
  if (rb.heads > 1) {  // stacked heads: each row gathered (widened) from where it lies
    for (std::int64_t r = 0; r < br; ++r)
      widen_rows(static_cast<const S*>(prob_.q) + prob_.q_offset(b, rb.head(r), rb.token(r)), 0, prob_.q_strides[3], 1, D,
                 qp_ + r * D, D);
    q_ = qp_;
    ldq_ = D;
    return;
  }
  const S* q = static_cast<const S*>(prob_.q) + prob_.q_offset(b, rb.h0, rb.i0);
  if constexpr (kWiden) {
    widen_rows(q, prob_.q_strides[2], prob_.q_strides[3], br, D, qp_, D);
  } else {
    if (prob_.q_strides[3] == 1) {
      q_ = q;
      ldq_ = prob_.q_strides[2];
      return;
    }
    for (std::int64_t r = 0; r < br; ++r)
      for (std::int64_t d = 0; d < D; ++d) qp_[r * D + d] = q[r * prob_.q_strides[2] + d * prob_.q_strides[3]];
  }
  q_ = qp_;
  ldq_ = D;
}

template <class T, class S>
inline void FusedWorker<T, S>::scores(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br) {
  const std::int64_t tile_rows = plan_.tile_rows, tile_cols = plan_.tile_cols, D = prob_.D, nk = a + n;
  const T* kb = kp_ + slot(jb) * D * plan_.k_keys;
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

template <class T, class S>
inline void FusedWorker<T, S>::softmax_update(const RowBlock& rb, std::int64_t br, std::int64_t j0, std::int64_t a,
                                              std::int64_t nk, Cover cover, bool first) {
  const StepRows sr = step_rows(rb, 0, br, j0, a, nk, cover, true);
  // NaN scores do not raise the max; they reach l and O through P instead.
  plan_.vk.softmax_rows(sb_ + a, plan_.k_keys, br, nk, sr.scale, sr.cap, sr.lo, sr.hi, m_, l_, alpha_);
  if (!first) rescale_out(0, br);  // else O is written (beta = 0) by this block's product
}

template <class T, class S>
inline void FusedWorker<T, S>::accumulate(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br, T beta) {
  const std::int64_t tile_rows = plan_.tile_rows, tile_cols = plan_.tile_cols;
  const T* vb = vp_ + slot(jb) * plan_.k_keys * plan_.dv_padded;
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

}  // namespace
}  // namespace simdattn::detail

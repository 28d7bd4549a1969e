// The fused path's steps on the vector unit (FusedWorker, worker.hpp): K^T and V packed as
// panels, the Q block, S = Q K^T and O += P V on the in-place-A micro-kernel, the online softmax.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention/native/fused/worker.hpp"
#include "linalg/panels.hpp"

namespace simdattn::detail {
// Part of fused.cpp, the one file that includes it: internal linkage, as if written there.
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

template <class T, class S>
inline void FusedWorker<T, S>::pack_block_codes(std::int64_t jb) {
  if constexpr (std::is_same_v<T, float>) {
    const std::int64_t nr = plan_.tile_cols, D = prob_.D;
    T* kb = kp_ + jb * D * plan_.k_keys;
    for (std::int64_t c = 0; c < plan_.k_keys / nr; ++c) {
      const std::int64_t j0 = jb * plan_.k_keys + c * nr;
      const std::int64_t n = std::max<std::int64_t>(0, std::min(nr, key_len_ - j0));
      dequantize_rows(k8_ + j0 * prob_.k_strides[2], prob_.k_strides[2], prob_.k_strides[3], ks_ + j0 * prob_.k_scale_strides[2],
                      prob_.k_scale_strides[2], n, D, conv_, D);
      plan_.vk.pack_transpose(conv_, D, n, D, kb + c * D * nr, nr, nr);
    }
    // keys past L[b] are never read
    const std::int64_t rows = std::min(plan_.k_keys, key_len_ - jb * plan_.k_keys), j0 = jb * plan_.k_keys;
    dequantize_rows(v8_ + j0 * prob_.v_strides[2], prob_.v_strides[2], prob_.v_strides[3], vs_ + j0 * prob_.v_scale_strides[2],
                    prob_.v_scale_strides[2], rows, prob_.Dv, conv_, prob_.Dv);
    pack_row_panels(conv_, prob_.Dv, std::int64_t{1}, rows, plan_.k_keys, prob_.Dv, plan_.tile_cols,
                    plan_.dv_padded / plan_.tile_cols, vp_ + jb * plan_.k_keys * plan_.dv_padded);
    packed_[jb] = T(1);
  } else {
    std::abort();  // 8-bit K/V come with f32, bf16 or f16 q (validate.cpp): computed in f32
  }
}

template <class T, class S>
inline void FusedWorker<T, S>::prepare_q(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br) {
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

template <class T, class S>
inline void FusedWorker<T, S>::scores(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br) {
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

template <class T, class S>
inline void FusedWorker<T, S>::softmax_update(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t br,
                                       std::int64_t j0, std::int64_t a, std::int64_t nk, Cover cover, bool first) {
  const StepRows sr = step_rows(b, h, i0, 0, br, j0, a, nk, cover, true);
  // NaN scores do not raise the max; they reach l and O through P instead.
  plan_.vk.softmax_rows(sb_ + a, plan_.k_keys, br, nk, sr.scale, sr.cap, sr.lo, sr.hi, m_, l_, alpha_);
  if (!first) rescale_out(0, br);  // else O is written (beta = 0) by this block's product
}

template <class T, class S>
inline void FusedWorker<T, S>::accumulate(std::int64_t jb, std::int64_t a, std::int64_t n, std::int64_t br, T beta) {
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

}  // namespace
}  // namespace simdattn::detail

// The fused path's steps on AMX tiles (FusedWorker, worker.hpp; FusedPlan::amx, S is
// bfloat16): K and V packed as bf16 pairs, the Q block as tiles, and a step's S products,
// softmax and PV products, software-pipelined over the block's groups of 32 rows.
#pragma once

#include <algorithm>
#include <array>
#include <tuple>
#include <cstdint>
#include <type_traits>

#include "attention/native/fused/worker.hpp"

namespace simdattn::detail {
// Part of the files that include it (fused.cpp, decode.cpp): internal linkage, as if written there.
namespace {

template <class T, class S>
inline void FusedWorker<T, S>::pack_block_amx(std::int64_t jb) {
  const std::int64_t kk = plan_.k_keys, j00 = jb * kk;
  const std::int64_t rows = std::clamp<std::int64_t>(key_len_ - j00, 0, kk);
  const std::int64_t D = prob_.D, Dv = prob_.Dv;
  if (!prob_.kv_codes()) {  // the key source's runs (one, when dense), packed where they lie
    pack_block_amx_runs(jb, [&](auto&& f) {
      for_runs(j00, rows, [&](std::int64_t off, const KeyRun& r) {
        f(off, r.n, k_rows(r), prob_.k_strides[2], prob_.k_strides[3], v_rows(r), prob_.v_strides[2], prob_.v_strides[3]);
      });
    });
    return;
  }
  // 8-bit codes: the block's rows dequantized (f32, in conv_) and rounded to bf16 (in stage16_),
  // K's rows then V's, packed from there as one run
  for (int kv = 0; kv < 2; ++kv) {
    const std::int64_t width = kv == 0 ? D : Dv;
    auto* f = reinterpret_cast<float*>(conv_);
    dequantize_keys(kv, j00, rows, f, width);
    plan_.kt.convert_bf16.narrow(f, stage16_ + (kv == 0 ? 0 : kk * D), rows * width);
  }
  const auto* kd = reinterpret_cast<const S*>(stage16_);
  const auto* vd = reinterpret_cast<const S*>(stage16_ + kk * D);
  pack_block_amx_runs(jb, [&](auto&& f) {
    if (rows > 0) f(std::int64_t{0}, rows, kd, D, std::int64_t{1}, vd, Dv, std::int64_t{1});
  });
}

template <class T, class S>
template <class Runs>
inline void FusedWorker<T, S>::pack_block_amx_runs(std::int64_t jb, Runs&& runs) {
  const std::int64_t D = prob_.D, dp = plan_.dp, kk = plan_.k_keys, j00 = jb * kk;
  const std::int64_t rows = std::clamp<std::int64_t>(key_len_ - j00, 0, kk);
  const simd::TileAttentionKernels& tk = tiles();
  // K: panel c's pair-row d / 2 holds its 32 keys' (K[j, d], K[j, d + 1]). Runs whose rows are
  // 32-bit words (even D, unit inner stride, even row stride, 4-byte aligned) go through the f32
  // transposing pack, segment by panel, each segment into its columns; the segment that ends a
  // panel's keys zero-fills the panel's columns past them. Else value by value over zeros.
  const std::int64_t panels = kk / 32;
  bool words = D % 2 == 0;
  runs([&](std::int64_t, std::int64_t, const S* k, std::int64_t krs, std::int64_t kcs, const S*, std::int64_t, std::int64_t) {
    words = words && kcs == 1 && krs % 2 == 0 && reinterpret_cast<std::uintptr_t>(k) % 4 == 0;
  });
  std::int64_t filled = 0;  // panels whose K columns are all written
  if (!words) std::fill(k16_panel(jb, 0), k16_panel(jb, 0) + panels * dp * 32, std::uint16_t{0});
  runs([&](std::int64_t off, std::int64_t n, const S* k, std::int64_t krs, std::int64_t kcs, const S*, std::int64_t,
           std::int64_t) {
    if (!words) {
      for (std::int64_t q = 0; q < n; ++q) {
        const std::int64_t j = off + q;
        std::uint16_t* dst = k16_panel(jb, j / 32);
        for (std::int64_t d = 0; d < D; ++d) dst[(d / 2) * 64 + 2 * (j % 32) + (d & 1)] = bits_at(k + q * krs + d * kcs);
      }
      return;
    }
    for (std::int64_t q = 0; q < n;) {
      const std::int64_t j = off + q, col = j % 32, seg = std::min(n - q, 32 - col);
      const bool ends = j + seg == rows || col + seg == 32;  // the panel's last keys
      std::uint16_t* panel = k16_panel(jb, j / 32);
      plan_.vk.pack_transpose(reinterpret_cast<const T*>(k + q * krs), krs / 2, seg, D / 2, reinterpret_cast<T*>(panel) + col, 32,
                              ends ? 32 - col : seg);
      if (ends) {
        std::fill(panel + (D / 2) * 64, panel + dp * 32, std::uint16_t{0});
        filled = j / 32 + 1;
      }
      q += seg;
    }
  });
  if (words)  // panels past the keys: zeros
    std::fill(k16_panel(jb, filled), k16_panel(jb, 0) + panels * dp * 32, std::uint16_t{0});
  // V: panel c's pair-row r / 2 holds (V[r, c'], V[r + 1, c']) of its 32 columns: rows paired
  // through their pointers (a pair may straddle two runs), zeros past the keys and Dv.
  const std::int64_t vpanels = round_up(prob_.Dv, 32) / 32;
  std::int64_t vcs = 1;
  runs([&](std::int64_t off, std::int64_t n, const S*, std::int64_t, std::int64_t, const S* v, std::int64_t rs,
           std::int64_t cs) {
    for (std::int64_t q = 0; q < n; ++q) v_row_[static_cast<std::size_t>(off + q)] = v + q * rs;
    vcs = cs;  // (a key source's runs share their strides)
  });
  for (std::int64_t c = 0; c < vpanels; ++c) {
    std::uint16_t* dst = v16_panel(jb, c);
    const std::int64_t nc = std::min<std::int64_t>(32, prob_.Dv - c * 32);
    for (std::int64_t r = 0; r < rows; r += 2) {
      const S* s0 = v_row_[static_cast<std::size_t>(r)] + c * 32 * vcs;
      const S* s1 = r + 1 < rows ? v_row_[static_cast<std::size_t>(r + 1)] + c * 32 * vcs : nullptr;
      auto* out = reinterpret_cast<std::uint32_t*>(dst + (r / 2) * 64);
      if (vcs == 1) {
        tk.pair_rows(reinterpret_cast<const std::uint16_t*>(s0), reinterpret_cast<const std::uint16_t*>(s1), nc, out);
      } else {
        for (std::int64_t x = 0; x < nc; ++x)
          out[x] = bits_at(s0 + x * vcs) | (s1 != nullptr ? std::uint32_t{bits_at(s1 + x * vcs)} << 16 : 0u);
      }
      std::fill(out + nc, out + 32, 0u);
    }
    std::fill(dst + (rows + 1) / 2 * 64, dst + kk * 32, std::uint16_t{0});
  }
  packed_[slot(jb)] = T(jb + 1);
}

template <class T, class S>
inline void FusedWorker<T, S>::prepare_q_amx(const RowBlock& rb, std::int64_t br) {
  const std::int64_t b = rb.b, dp = plan_.dp, groups = (br + 31) / 32, D = prob_.D;
  const S* q = static_cast<const S*>(prob_.q);
  // rows past br are never read by a tile (its rows are configured to br's; the vdpbf16ps
  // products read br rows)
  if (prob_.q_strides[3] == 1 && rb.heads == 1) {  // one head's rows, q_strides[2] apart
    const S* q0 = q + prob_.q_offset(b, rb.h0, rb.i0);
    for (std::int64_t r0 = 0; r0 < br; r0 += 32)
      tiles().pack_a(reinterpret_cast<const std::uint16_t*>(q0 + r0 * prob_.q_strides[2]), prob_.q_strides[2],
                     static_cast<int>(std::min<std::int64_t>(32, br - r0)), D, q16_ + r0 * dp);
    return;
  }
  if (prob_.q_strides[3] == 1) {  // stacked heads: row by row, each into its place in its group
    for (std::int64_t r = 0; r < br; ++r)
      tiles().pack_a(reinterpret_cast<const std::uint16_t*>(q + prob_.q_offset(b, rb.head(r), rb.token(r))), 0, 1, D,
                     q16_ + (r / 32) * 32 * dp + (r % 32) * 32);
    return;
  }
  std::fill(q16_, q16_ + groups * 32 * dp, std::uint16_t{0});
  for (std::int64_t r = 0; r < br; ++r) {
    std::uint16_t* g = q16_ + (r / 32) * 32 * dp + (r % 32) * 32;
    const S* row = q + prob_.q_offset(b, rb.head(r), rb.token(r));
    for (std::int64_t d = 0; d < D; ++d) g[(d / 32) * 1024 + d % 32] = bits_at(row + d * prob_.q_strides[3]);
  }
}

template <class T, class S>
inline void FusedWorker<T, S>::step_amx(const RowBlock& rb, std::int64_t br, std::int64_t jb, std::int64_t a, std::int64_t n,
                                        Cover cover, bool first) {
  if constexpr (std::is_same_v<T, float>) {
    const std::int64_t dp = plan_.dp, kk = plan_.k_keys, a32 = a / 32 * 32;
    auto rows_of = [&](std::int64_t r0) { return static_cast<int>(std::min<std::int64_t>(32, br - r0)); };
    // The next key block's rows (prefetch_block), if it is still to be packed, prefetched into
    // L2 by the products, a share each: its K and V lines over the step's 2 x groups calls.
    const std::int64_t groups = (br + 31) / 32;
    if (groups == 0) return;
    // (NextRows::take_run: K's stray last line does not take the call that V's lines need)
    const std::int64_t share = (plan_.block_lines + 2 * groups - 1) / (2 * groups);
    // Each group's keys end where its rows' visible keys do (causal and window edges, key lengths:
    // a diagonal block's first groups skip the panels past their rows), at least one panel (its
    // products write O when first); masks, sparse patterns and modifiers read every key's score.
    const bool extents = cover != Cover::full && !prob_.sparse() && prob_.mask_kind == MaskKind::none && !prob_.scores_modified();
    // end: the group's S columns (whole panels); depth: its PV products' keys (the pair kernels
    // stop at its last pair: P is zero past them; on the tiles a step of 32 is whole anyway, the
    // V rows of hidden keys up to its end met by P's zeros: an Inf there gives NaN, docs/design.md)
    std::array<std::int64_t, (kMaxBlockQ + 31) / 32> end{}, depth{};
    for (std::int64_t r0 = 0; r0 < br; r0 += 32) {
      std::int64_t hi = n;
      if (extents) {
        hi = 0;
        for (std::int64_t r = r0; r < r0 + rows_of(r0); ++r)
          hi = std::max(hi, row_keys_in(prob_, rb.b, rb.token(r), jb * kk + a, n).hi);
      }
      end[static_cast<std::size_t>(r0 / 32)] = std::max(a32 + 32, round_up(a + hi, 32));
      depth[static_cast<std::size_t>(r0 / 32)] = std::max(a + hi, a32 + 1) - a32;
    }
    auto scores = [&](std::int64_t r0) {  // S = Q K^T, unscaled
      const NextRows::Run pf = next_.take_run(share);
      tiles().block(prob_.D, q16_ + r0 * dp, 1024, 512, 64, rows_of(r0), k16_panel(jb, a32 / 32), dp * 32,
                    static_cast<int>(end[static_cast<std::size_t>(r0 / 32)] - a32), sb_ + r0 * kk + a32, kk, false, pf.at,
                    pf.lines);
    };
    // (the weights to f32's accuracy where l gives the lse too, else to what P's bf16 needs)
    const auto softmax_rows = prob_.lse != nullptr ? tiles().softmax_rows_lse : tiles().softmax_rows;
    auto weights = [&](std::int64_t r0) {  // P's tiles, and O's rows rescaled where the reference moved
      const StepRows sr = step_rows(rb, r0, rows_of(r0), jb * kk + a, a, n, cover, false);
      softmax_rows(sb_ + r0 * kk + a, kk, rows_of(r0), n, sr.scale, sr.lo, sr.hi, m_ + r0, l_ + r0, alpha_ + r0,
                   p16_ + r0 * kk + a32 * 32, a - a32);
      if (!first) rescale_out(r0, rows_of(r0));
    };
    auto values = [&](std::int64_t r0) {  // O (+)= P V
      const NextRows::Run pf = next_.take_run(share);
      tiles().block(depth[static_cast<std::size_t>(r0 / 32)], p16_ + r0 * kk + a32 * 32, 1024, 512, 64, rows_of(r0),
                    v16_panel(jb, 0) + (a32 / 2) * 64, kk * 32, static_cast<int>(prob_.Dv), ob_ + r0 * plan_.dv_padded,
                    plan_.dv_padded, !first, pf.at, pf.lines);
    };
    // Software-pipelined over the groups: group g's weights between group g + 1's S products
    // and group g - 1's PV products, so that each buffer is read a group after the other unit
    // wrote it (S's tile stores, P's and O's vector stores drained by then) and the vector
    // unit's softmax has tile products on either side to run beside.
    scores(0);
    for (std::int64_t g = 0; g < groups; ++g) {
      if (g + 1 < groups) scores(32 * (g + 1));
      weights(32 * g);
      if (g > 0) values(32 * (g - 1));
    }
    values(32 * (groups - 1));
  }
}

}  // namespace
}  // namespace simdattn::detail

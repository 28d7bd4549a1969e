// The multi-head attention layer as built (layer/build.cpp): its resolved configuration and its
// weights of one dtype, W^T pre-packed for that dtype's GEMM, kept in a variant over the four
// dtypes. A built layer is immutable (the row-major copies for oneDNN are made once, under
// their own once_flag).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <variant>
#include <vector>

#include "layer/positions/rope_table.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/half.hpp"
#include "simdattn/mha.hpp"

namespace simdattn::detail {

namespace scratch {
struct MhaProjection : HugePagesSlot {};    // the q|k|v projection (q alone in cross-attention)
struct MhaProjectionKv : ScratchSlot {};    // the k and v projections in cross-attention
struct MhaAttentionOut : HugePagesSlot {};  // the attention output [B, Sq, H*hd]
struct MhaMask : ScratchSlot {};            // key padding combined with an additive mask
struct MhaPaddingMask : ScratchSlot {};     // key padding as a boolean mask
struct MhaProjectionF32 : ScratchSlot {};   // bf16/f16: a projection's f32 sums before rounding
struct MhaCacheQ : ScratchSlot {};          // a cache of another dtype: q and the output in the cache's dtype
struct MhaCacheOut : ScratchSlot {};
struct MhaWeights : ScratchSlot {};         // per-head attention weights before they are averaged
struct MhaBatchRows : ScratchSlot {};       // several steps: their query rows gathered, then the output rows
}  // namespace scratch

// bf16 and f16: weights and activations in 16 bits, every sum in f32.
template <class T>
constexpr bool kIs16Bit = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// A layer's weights, W^T packed once for its GEMM: the f32/f64 GEMM's panels, or the 16-bit
// GEMM's (bf16 and f16 layers keep their weights in their dtype).
template <class T>
using PackedWeights = std::conditional_t<kIs16Bit<T>, Packed16, PackedB<T>>;

// Weights of one dtype, transposed to [in, out] and pre-packed for the GEMM, and the resolved
// configuration.
template <class T>
struct LayerStorage {
  using Element = T;
  static constexpr DType dtype = dtype_of<T>();
  MhaConfig cfg;
  std::int64_t nq = 0, nkv = 0;  // rows of Wq (H*hd) and of Wk / Wv (Hkv*hd)
  bool fused_qkv = false;        // kdim == vdim == d_model: the input projections are one GEMM
  // Column groups Wq^T | Wg^T | Wk^T | Wv^T start at 0, g0, k0, v0, each padded to the GEMM's
  // panel width (so that each can also be multiplied alone; zeros in the padding); n_in columns
  // in all; the gate's group (cfg.output_gate) is empty without a gate (g0 = k0).
  // fused_qkv: w_in holds all of them, [d_model, n_in]; otherwise w_in holds Wq^T | Wg^T
  // [d_model, n_qg], w_k Wk^T [kdim, nkv], w_v Wv^T [vdim, nkv]. The biases b_in follow the
  // column groups. n_qg: the query side's columns (q and the gate, 0 .. g0 + nq with a gate).
  std::int64_t g0 = 0, k0 = 0, v0 = 0, n_in = 0, n_qg = 0;
  PackedWeights<T> w_in, w_k, w_v;
  std::vector<T> b_in;  // empty if no input bias was given
  PackedWeights<T> wo;  // Wo^T [nq, d_model]
  std::vector<T> bo;
  RopeTable rope;  // cfg.rope's frequencies (rotary_dim 0: no rope)
  // The weights as row-major W^T matrices (each packed one unpacked), for the onednn backend's
  // projections: made on the layer's first onednn call, never otherwise (layer/projection.cpp).
  struct RowMajor {
    std::once_flag once;
    std::vector<T> in, k, v, o;
  };
  std::unique_ptr<RowMajor> row_major = std::make_unique<RowMajor>();

  const PackedWeights<T>& wk() const { return fused_qkv ? w_in : w_k; }
  const PackedWeights<T>& wv() const { return fused_qkv ? w_in : w_v; }
  std::int64_t k_col() const { return fused_qkv ? k0 : 0; }
  std::int64_t v_col() const { return fused_qkv ? v0 : 0; }
  const T* bq() const { return b_in.empty() ? nullptr : b_in.data(); }
  bool gated() const { return cfg.output_gate; }
  const T* bk() const { return b_in.empty() ? nullptr : b_in.data() + k0; }
  const T* bv() const { return b_in.empty() ? nullptr : b_in.data() + v0; }
  const T* bo_or_null() const { return bo.empty() ? nullptr : bo.data(); }
};

using AnyLayerStorage =
    std::variant<LayerStorage<float>, LayerStorage<double>, LayerStorage<bfloat16>, LayerStorage<float16>>;

// The configuration with every 0 resolved, checked (Error naming the config field).
MhaConfig resolve_config(MhaConfig c);

// A layer of T's dtype: the configuration resolved and checked, the weights checked against it
// (Error naming the weight) and packed.
template <class T>
LayerStorage<T> build_layer(const MhaConfig& config, MhaWeights<T>&& weights);

}  // namespace simdattn::detail

// Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"): softmax replaced by a
// kernel feature map phi, so attention costs O(S D Dv) instead of O(S^2 D).
//
//   non-causal:  O_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)
//   causal:      the same sums over j <= i only (Sq == Sk required)
//
// phi: elu1(x) = elu(x) + 1 (x + 1 for x > 0, exp(x) otherwise; the paper's choice, default),
// relu(x) = max(x, 0), identity(x) = x. eps defaults to 1e-6. Shapes as attention():
// q [B, H, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], out [B, H, Sq, Dv], H % Hkv == 0,
// f32, f64, bf16 or f16 (one dtype for all four), any strides. bf16/f16: the reference sums the
// inputs widened to f64, native widens them to f32 (products and sums in f32); the output is
// rounded to nearest even once.
//
// The native backend computes the causal case chunk by chunk: inside a chunk of C rows a
// quadratic product masked to j <= i, across chunks a carried D x (Dv + 1) state (the sums
// above), both on the GEMM micro-kernels. The reference backend evaluates the sums directly in
// double precision. The onednn backend has no linear attention.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn {

enum class FeatureMap : std::uint8_t { elu1, relu, identity };

struct LinearAttentionOptions {
  bool causal = false;
  FeatureMap feature_map = FeatureMap::elu1;
  double eps = 1e-6;           // added to every denominator; finite, >= 0
  std::int64_t chunk = 64;     // rows per chunk of the native causal kernel (>= 1)
  int threads = 0;             // as in AttentionOptions
  Backend backend = Backend::native;  // reference or native
};

// Throws Error naming the argument on invalid input, before writing anything.
SIMDATTN_API void linear_attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                      const TensorView& out, const LinearAttentionOptions& options = {});

SIMDATTN_API std::string_view feature_map_name(FeatureMap f) noexcept;

// The recurrent form for decoding one token at a time: per (batch, key/value head) the state
// S = sum phi(k_j) v_j^T (D x Dv) and z = sum phi(k_j) (D) of every token seen so far.
// step() adds the new token's key and value, then outputs the causal result for its query:
// after N steps the outputs equal causal linear_attention() on the N tokens. O(D x Dv) per
// token and head; allocates nothing after construction.
class SIMDATTN_API LinearAttentionState {
 public:
  LinearAttentionState(DType dtype, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t value_dim, FeatureMap feature_map = FeatureMap::elu1,
                       double eps = 1e-6);

  // q [B, H, 1, D], k [B, Hkv, 1, D], v [B, Hkv, 1, Dv] -> out [B, H, 1, Dv] (the state's dtype:
  // f32, f64, bf16 or f16; the state itself is f64, each output rounded once).
  void step(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& out);

  void reset() noexcept;
  std::int64_t tokens() const noexcept { return tokens_; }

 private:
  DType dtype_;
  std::int64_t B_, H_, Hkv_, D_, Dv_, tokens_ = 0;
  FeatureMap phi_;
  double eps_;
  std::vector<double> s_;  // [B, Hkv, D, Dv + 1]: S with z as its last column, in double
  std::vector<double> fq_;  // phi(q) of one row, scratch
};

// The gated delta rule (Gated DeltaNet, Yang et al. 2024; flash-linear-attention's
// chunk_gated_delta_rule and fused_recurrent_gated_delta_rule, transformers'
// Qwen3NextGatedDeltaNet). q, k [B, T, H, Dk]; v [B, T, Hv, Dv] with Hv a multiple of H (value
// head h reads query/key head h / (Hv / H)); g, beta [B, T, Hv, 1] (g the log of each step's
// decay, <= 0); out [B, T, Hv, Dv]. Per batch b and value head h, S = initial_state[b, h] (zeros
// when empty), for t = 0 .. T-1:
//   qt, kt = q[b, t, h'], k[b, t, h']; with use_qk_l2norm each divided by sqrt(sum x^2 + 1e-6)
//   (fla's l2norm); qt *= scale (default Dk^-1/2)
//   S = exp(g[b, t, h]) S;  u = beta[b, t, h] (v[b, t, h] - S^T kt);  S = S + kt u^T
//   out[b, t, h] = S^T qt
// final_state (when given) = S after the last step. q, k, v and out f32, bf16 or f16 (one dtype;
// computed in f32), g and beta f32, bf16 or f16, the states f32 [B, Hv, Dk, Dv]; any strides. T
// = 1 runs the recurrence; longer sequences run in chunks of 32 (the WY / UT form: a chunk's
// updates as products with its start state and one forward substitution), equal to the
// recurrence within f32 rounding. Each (batch, key head) group of value heads (or a part of one)
// is one thread's work: bitwise the same at any thread count. Throws Error naming the argument (a
// shape, a dtype, a g > 0, a non-finite input) before writing anything; the states may not overlap
// out, and final_state overlaps initial_state only as the same view (the same data and strides: the
// state updated in place).
struct GatedDeltaRuleOptions {
  std::optional<double> scale = {};  // finite (any sign, as flash-linear-attention takes it)
  ConstTensorView initial_state = {};
  TensorView final_state = {};
  bool use_qk_l2norm = false;
  int threads = 0;
};
SIMDATTN_API void gated_delta_rule(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                                   const ConstTensorView& g, const ConstTensorView& beta, const TensorView& out,
                                   const GatedDeltaRuleOptions& options = {});

}  // namespace simdattn

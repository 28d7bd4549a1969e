// Scaled dot-product attention: the library's entry point.
//
//   O = softmax(Q K^T * scale + mask) V
//
// Shapes (all 4-D strided views, see tensor.hpp):
//   q   [B, H,   Sq, D ]   f32, f64, bf16 or f16 (simdattn/half.hpp)
//   k   [B, Hkv, Sk, D ]   same dtype as q, or 8-bit codes (below)
//   v   [B, Hkv, Sk, Dv]   same dtype as k
//   out [B, H,   Sq, Dv]   same dtype as q; must not overlap q, k, v or the mask
//
// 8-bit K and V: k and v of dtype int8, fp8_e4m3 or fp8_e5m2 (both the same; q f32, bf16 or
// f16) are codes, each row (one kv head of one key) with an f32 scale in options.k_scale and
// options.v_scale [B, Hkv, Sk, 1]: key j's values are decode(code) * scale, rounded to f32
// (quantize_kv below makes them; the formats are exact, docs/design.md "8-bit K and V"). The
// attention reads the codes in place: K's scale multiplies key j's score, V's key j's weight.
// H % Hkv == 0: Hkv == H is multi-head, 1 < Hkv < H grouped-query, Hkv == 1 multi-query.
// Query head h reads key/value head h / (H / Hkv).
//
// Visibility. Query i of batch b sits at key position p = i + offset, where offset =
// options.query_offsets[b] when given, else 0 for Causal::top_left and L[b] - Sq otherwise
// (Causal::bottom_right, and a window without causal). Key j is visible to query i iff every given restriction allows it:
//   key lengths     j < L[b]                       (L[b] = Sk when no key lengths are given)
//   causal          j <= p
//   window          p - left <= j <= p + right     (a side given as -1 is unbounded)
//   boolean mask    mask[b, h, i, j] != 0          (a mask of dtype u8)
// An additive mask (dtype f32, f64, bf16 or f16) is added to the scaled scores; -inf there gives exactly zero weight.
//
// Score modifiers, in this order, for query i at position p, key j, head h (each absent by
// default; docs/design.md, "Score modifiers"):
//   s = scale * q_i . k_j
//   s = cap * tanh(s / cap)                      softcap
//   s = s + slope[h] * (j - p)                   ALiBi
//   s = s + table[bucket(j - p), h]              T5's relative position bias
//   s = s + mask[b, h, i, j]                     the additive mask
//   w_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sink[h] - m))      sinks
//   lse_i = log(sum_j exp(s_j) + exp(sink[h]))   (optional output)
// A query row with no visible key (or whose every score is -inf) outputs zeros, in every
// backend. NaN in the inputs propagates to the affected rows as in the maths.
#pragma once

#include "simdattn/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "simdattn/tensor.hpp"

namespace simdattn {

enum class Causal : std::uint8_t { none, top_left, bottom_right };

enum class Backend : std::uint8_t {
  reference,  // double-precision plain loops: the oracle
  native,     // this library's kernels (the default)
  onednn,     // oneDNN primitives: cross-check and speed peer
};

// T5's relative position bias: s += table[bucket(j - p), h], with T5's bucket function
// (bidirectional: half the buckets for keys after the query; exact below num_buckets / 4 (or / 2
// one-way), logarithmic up to max_distance, the last bucket beyond).
struct RelativePositionBias {
  ConstTensorView table = {};  // [1, 1, num_buckets, H]: f32, f64, bf16 or f16; num_buckets >= 2
  bool bidirectional = true;        // T5's encoder: true; its decoder's self-attention: false
  std::int64_t max_distance = 128;  // > the exact buckets (num_buckets / 4, or / 2 one-way)
};

// The stage of the scores that AttentionOptions::scores receives: scaled (scale * q.k), capped
// (then the softcap), biased (then ALiBi, T5's bias and the additive mask; hidden keys -inf) or
// softmax (the weights: the sink's share left out of the row, zeros at hidden keys and on a row
// with no visible key, NaN on a row with a NaN score). scaled and capped hold every key's value.
enum class ScoreStage : std::uint8_t { scaled, capped, biased, softmax };

// Sliding window around each query's position p: keys p - left .. p + right are visible.
// -1 on a side means unbounded on that side.
struct Window {
  std::int64_t left = -1;
  std::int64_t right = -1;
};

// The options attention() and attention_paged() (paged.hpp) share, meaning the same in both: the
// scale, the window, the score modifiers that depend on a row's head and position, 8-bit K/V's
// scales, the threads and the backend. Each call's options add their own to these.
struct ScoreOptions {
  // Multiplies Q K^T. Default 1/sqrt(D). Must be finite.
  std::optional<double> scale;

  std::optional<Window> window;

  // Score modifiers (see the top of this file). softcap: cap > 0, finite. alibi_slopes: [H]
  // finite slopes (standard_alibi_slopes gives the usual ones). sinks: [H] finite logits.
  std::optional<double> softcap = {};
  std::span<const float> alibi_slopes = {};
  std::span<const float> sinks = {};
  // 8-bit K and V only (else empty): the scales of k's and v's rows, f32 of K's and V's shape
  // with a last dimension of 1 (attention(): [B, Hkv, Sk, 1]), each finite and >= 0.
  ConstTensorView k_scale = {};
  ConstTensorView v_scale = {};
  // Threads for this call: 0 = OpenMP's default count; 1 = run wholly on the calling thread,
  // starting no thread. Calls made inside an OpenMP parallel region or on one of the library's
  // worker threads run on the calling thread.
  int threads = 0;

  Backend backend = Backend::native;
};

struct AttentionOptions : ScoreOptions {
  Causal causal = Causal::none;

  // Mask, broadcastable to [B, H, Sq, Sk]: each dimension equals the target's or is 1 (e.g.
  // [1,1,Sq,Sk], [B,1,Sq,Sk], [B,H,Sq,Sk], [B,1,1,Sk]). Its dtype says how it is read: u8 is
  // boolean (nonzero = attend), f32, f64, bf16 or f16 additive (added to the scaled scores).
  // Empty (no data and no shape): none.
  ConstTensorView mask;

  // Per-batch key lengths L[b] in [0, Sk]; empty means L[b] = Sk. Size must be B.
  std::span<const std::int64_t> key_lengths;

  // Sparse patterns (docs/design.md, "Positions and visibility"). Global tokens: the first
  // `global_tokens` positions on the key axis are global: a query whose position p is in [0, G)
  // sees every key, and every query sees keys j < G, whatever causal, window or block mask hide (key lengths and an
  // explicit mask still apply). Block mask: u8 [ceil(Sq/bs), ceil(Sk/bs)] (nonzero = computed),
  // shared by every batch and head; query i and key j are visible only if block
  // [i / bs, j / bs] is listed (unless one of them is global). Given as a view of shape
  // [1, 1, ceil(Sq/bs), ceil(Sk/bs)]; empty = no block mask.
  std::int64_t global_tokens = 0;
  ConstTensorView block_mask;
  std::int64_t block_size = 64;

  // T5's relative position bias (a score modifier, after ALiBi).
  std::optional<RelativePositionBias> relative_bias = {};
  // Per-batch query positions: query i of batch b sits at p = i + query_offsets[b] (for causal,
  // windows, global tokens, ALiBi and the T5 bias) instead of the alignment's rule. Size B,
  // |offset| <= 2^40; empty: the rule above.
  std::span<const std::int64_t> query_offsets = {};
  // Optional output: the log-sum-exp of each row's modified scores, [B, H, Sq, 1] f32 (-inf for
  // a row with no visible key and no sink; NaN where the row's output is NaN). Empty: not
  // written. May not overlap any input or out.
  TensorView lse = {};
  // Optional output, the only one of size Sq x Sk: the scores at scores_stage, [B, H, Sq, Sk] in
  // f32, f64, bf16 or f16 (computed in double, as the reference backend computes them, and
  // rounded once), whatever the backend; the attention output is computed as without it. Empty:
  // not written. May not overlap any input, out or lse.
  TensorView scores = {};
  ScoreStage scores_stage = ScoreStage::softmax;
};

// Computes attention into `out`. Thread-safe: may be called concurrently from many threads.
// Throws simdattn::Error (naming the argument and the shapes) on invalid input, before
// anything is written; also Error("SIMDATTN_ISA", ...) when that environment variable names an
// unknown ISA or one this CPU lacks (as do every other entry point of the library).
SIMDATTN_API void attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
               const TensorView& out, const AttentionOptions& options = {});

// The shape attention() writes for these inputs, [B, H, Sq, Dv], checking their dtypes and
// shapes as attention() does (throws the same Error): a caller can validate before it allocates
// the output. Reads no data.
SIMDATTN_API Shape4 attention_output_shape(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v);

// 8-bit K and V codes, one f32 scale per row of D values (exact; tests outside the project check
// them bit for bit):
//   int8      s = max|x| / 127;   code = clamp(round_half_even(x / s), -127, 127)
//   fp8_e4m3  s = max|x| / 448;   code = x / s rounded to nearest even in OCP E4M3FN (bias 7, no
//             infinities, max 448, NaN 0x7F / 0xFF), saturating at +-448
//   fp8_e5m2  s = max|x| / 57344; code = x / s rounded to nearest even in OCP E5M2 (bias 15,
//             max 57344), saturating at +-57344 (never inf)
// Each division is one f32 division (x widened exactly to f32 first), rounded to nearest; the
// code rounds that quotient. A row whose s is 0 (all zeros) has codes 0. fp8 codes keep the
// quotient's sign, also at zero. A code's value is decode(code) * s rounded to f32.
//
// quantize_kv: x [.., .., .., D] (f32, f64, bf16 or f16; f64 rounded to f32 first) to codes of
// the same shape and dtype `code` (int8, fp8_e4m3 or fp8_e5m2) and scales [.., .., .., 1] f32.
// Throws Error("x") naming the row of a NaN or infinity, before anything is written.
SIMDATTN_API void quantize_kv(const ConstTensorView& x, DType code, const TensorView& codes, const TensorView& scales);
// dequantize_kv: out = decode(codes) * scales, f32 (or f64, bf16, f16: the f32 value rounded to it).
SIMDATTN_API void dequantize_kv(const ConstTensorView& codes, const ConstTensorView& scales, const TensorView& out);

// ALiBi's slopes for `heads` heads (Press et al.; as BLOOM and MPT build them): for the largest
// power of two n <= heads, 2^(-8 k / n) for k = 1 .. n, then, for the heads past n,
// 2^(-4 k / n) for odd k = 1, 3, .. . Throws Error("heads") unless heads >= 1.
SIMDATTN_API std::vector<float> standard_alibi_slopes(std::int64_t heads);

// T5's bucket for relative position j - p (computed in float32 as Hugging Face's
// T5Attention._relative_position_bucket does). Throws Error on num_buckets < 2 or max_distance
// too small.
SIMDATTN_API std::int64_t t5_relative_bucket(std::int64_t relative_position, bool bidirectional, std::int64_t num_buckets,
                                std::int64_t max_distance);

// Names used by the CLI and in messages.
SIMDATTN_API std::string_view backend_name(Backend b) noexcept;
SIMDATTN_API std::string_view causal_name(Causal c) noexcept;
SIMDATTN_API std::string_view score_stage_name(ScoreStage s) noexcept;  // "scaled", "capped", "biased", "softmax"

// True if this build contains the backend (onednn needs SIMDATTN_WITH_ONEDNN).
SIMDATTN_API bool backend_available(Backend b) noexcept;

// True if attention() on backend b takes inputs of this dtype here: reference and native take
// f32, f64, bf16 and f16; onednn (if built) f32, and bf16 / f16 where oneDNN has the matmuls for
// them on this CPU (oneDNN 2.6: bf16 on AVX-512 machines, f16 nowhere). Otherwise attention()
// throws Error("options.backend").
SIMDATTN_API bool backend_takes(Backend b, DType dtype) noexcept;

}  // namespace simdattn

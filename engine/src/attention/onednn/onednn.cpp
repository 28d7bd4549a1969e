// The onednn backend: attention from oneDNN 2.6 primitives, unfused, as an independent
// cross-check and speed peer of the native kernels.
//
// A call is cut into steps: one batch b, one block of query rows (at most kScoreBudget bytes of
// scores) and one group of heads. Each step runs three primitives:
//   S = (Q K^T) * scale + M    matmul; scale is the primitive's output scale, the mask M a
//                              binary-add post-op
//   S = softmax(S)             softmax along keys, in place
//   O = S V                    matmul, written straight into `out`
// M is one additive f32 mask (0 or -inf from key lengths, causal, window and a boolean mask, plus
// the values of an additive mask), built once per (batch, row block) and shared by every head:
// its head and row dimensions have size 1 whenever nothing depends on them, and the post-op
// broadcasts it. A block whose keys are all visible gets no mask and no post-op.
//
// Keys: only the range [jlo, jhi) that some row of the block can see goes to oneDNN, so keys at
// or past the batch's key length are never read and a causal block skips the keys after its
// last row. Heads: one step covers every head when Hkv == H or Hkv == 1 (the matmuls broadcast a
// single K/V head); grouped-query problems take one step per key/value head and its group of
// query heads. K and V are read in place through pointers and strides, never copied, unless a
// view's innermost stride is not 1 (then q, k, v or out go through a dense copy).
//
// bf16 and f16 (where oneDNN has the matmuls for them on the CPU): both matmuls take 16-bit
// operands and accumulate in f32; the scores and the softmax stay f32, and a reorder rounds the
// probabilities to the operands' dtype (to nearest even) for the PV matmul, which writes `out`
// in it. oneDNN 2.6 has bf16 matmuls on AVX-512 machines; where creating them fails (f16, or a
// CPU without them), the call fails with Error("options.backend") before anything is written.
//
// A row with no visible key gets NaN from softmax (exp(-inf - -inf)); such rows are known from
// M and overwritten with zeros after the PV matmul.
//
// Primitives are cached per step geometry (sizes, strides, mask shape, scale, threads): a second
// call with the same shapes creates nothing. Every primitive a call needs is created, and every
// buffer allocated, before the first one runs, so failing to create them leaves `out` untouched
// (oneDNN failing while its primitives run, which it does not do on valid descriptors, would
// leave the blocks already computed written).
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "attention/onednn/blocks.hpp"
#include "attention/onednn/primitives.hpp"
#include "core/backends.hpp"
#include "core/problem.hpp"
#include "linalg/onednn/common.hpp"
#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"
#include "simdattn/half.hpp"

namespace simdattn::detail {
namespace scratch {
struct OnednnScores : ScratchSlot {};  // scores of one step
struct OnednnProbs : ScratchSlot {};   // a bf16/f16 step's probabilities, rounded for the PV matmul
struct OnednnMask : ScratchSlot {};    // the step's mask and empty-row flags
struct OnednnDenseQ : ScratchSlot {};  // dense copies of inputs whose inner stride is not 1
struct OnednnDenseK : ScratchSlot {};
struct OnednnDenseV : ScratchSlot {};
struct OnednnDenseOut : ScratchSlot {};
}  // namespace scratch

namespace {

using namespace onednn_attention;

// Scores held at once per step: bounds the memory of long sequences (e.g. 128 query rows of the
// `long` workload) while keeping each matmul large enough for oneDNN to run at speed.
constexpr std::int64_t kScoreBudget = std::int64_t{32} << 20;

template <class E>
struct Operands {
  const E* q;
  const E* k;
  const E* v;
  E* o;
  Shape4 q_strides, k_strides, v_strides, o_strides;
};

template <class E>
constexpr memory::data_type data_type_of() {
  if constexpr (std::is_same_v<E, bfloat16>) return memory::data_type::bf16;
  else if constexpr (std::is_same_v<E, float16>) return memory::data_type::f16;
  else return memory::data_type::f32;
}

bool inner_contiguous(const Shape4& shape, const Shape4& strides) {
  return shape[3] == 1 || strides[3] == 1;
}

// Copies the first `rows(b)` rows of every (b, h) of a [B, H, S, D] view between two layouts.
template <class E, class RowsFn>
void copy_rows(const E* src, const Shape4& ss, E* dst, const Shape4& ds, const Shape4& shape, RowsFn rows) {
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[1]; ++h)
      for (std::int64_t i = 0; i < rows(b); ++i)
        for (std::int64_t d = 0; d < shape[3]; ++d)
          dst[b * ds[0] + h * ds[1] + i * ds[2] + d * ds[3]] = src[b * ss[0] + h * ss[1] + i * ss[2] + d * ss[3]];
}

template <class E>
void zero_row(E* o, const Shape4& os, std::int64_t Dv) {
  for (std::int64_t d = 0; d < Dv; ++d) o[d * os[3]] = E{};  // +0 in every dtype
}

// One call: its geometry, the plan of its blocks, its buffers. Steps (run() below): plan every
// block and create its primitives; allocate and make dense copies; execute block by block;
// copy a dense output back. E: the element type of q, k, v and out.
template <class E>
class OnednnCall {
 public:
  explicit OnednnCall(const Problem& p)
      : p_(p), threads_(resolve_threads(p.threads)),
        per_group_(p.H / p.Hkv > 1 && p.Hkv > 1),
        heads_(per_group_ ? p.H / p.Hkv : p.H), kv_heads_(per_group_ ? 1 : p.Hkv), units_(per_group_ ? p.Hkv : 1),
        qshape_{p.B, p.H, p.Sq, p.D}, kshape_{p.B, p.Hkv, p.Sk, p.D}, vshape_{p.B, p.Hkv, p.Sk, p.Dv},
        oshape_{p.B, p.H, p.Sq, p.Dv},
        op_{static_cast<const E*>(p.q), static_cast<const E*>(p.k), static_cast<const E*>(p.v),
            static_cast<E*>(p.o), p.q_strides, p.k_strides, p.v_strides, p.o_strides} {
    dense_q_ = !inner_contiguous(qshape_, p.q_strides), dense_k_ = !inner_contiguous(kshape_, p.k_strides);
    dense_v_ = !inner_contiguous(vshape_, p.v_strides), dense_o_ = !inner_contiguous(oshape_, p.o_strides);
    if (dense_q_) op_.q_strides = contiguous_strides(qshape_);
    if (dense_k_) op_.k_strides = contiguous_strides(kshape_);
    if (dense_v_) op_.v_strides = contiguous_strides(vshape_);
    if (dense_o_) op_.o_strides = contiguous_strides(oshape_);
    const bool user_mask = p.mask_kind != MaskKind::none;
    // ALiBi and T5's bias are folded into the mask: per head and per row
    const bool bias = p.alibi != nullptr || p.t5_table != nullptr;
    user_mask_ = user_mask || bias;
    mask_by_head_ = ((user_mask && p.mask_strides[1] != 0) || bias) && p.H > 1;
    mask_by_row_ = ((user_mask && p.mask_strides[2] != 0) || bias) && p.Sq > 1;
  }
  ~OnednnCall() { blocks().clear(); }  // drop the primitive references
  OnednnCall(const OnednnCall&) = delete;
  OnednnCall& operator=(const OnednnCall&) = delete;

  // Every block, its primitives and the buffer sizes, before anything runs.
  void plan();

  // The calling thread's buffers, and dense copies of inputs whose inner stride is not 1.
  void prepare();
  void execute();  // block by block
  void finish();   // a dense output copied back

 private:
  // The calling thread's block list, reused across calls.
  static std::vector<Block>& blocks();
  Block plan_block(std::int64_t b, std::int64_t i0, std::int64_t i1);
  void run_block(const Block& blk, dnnl::stream& stream);

  // The three primitives on heads [u * heads_, (u + 1) * heads_) of the block.
  void run_unit(const Block& blk, std::int64_t u, E* o_u, dnnl::stream& stream);

  // Before the softmax: each row's max m and sum S = sum exp(s - m) of the block's scores (f32,
  // -inf where hidden), summed in double: lse = m + log(S + exp(sink - m)) written, and the
  // factor S / (S + exp(sink - m)) the output row is rescaled by (the sink's share).
  void row_sums(const Block& blk, std::int64_t h0, std::int64_t W);

  // Rows with no visible key (flagged by build_mask) get zeros instead of softmax's NaN.
  void zero_empty_rows(const Block& blk, std::int64_t u, E* o_u) const;

  const Problem& p_;
  const int threads_;
  // Heads per step and the K/V heads it reads: all heads at once unless grouped-query, where
  // each of the units_ steps takes one K/V head and its group.
  const bool per_group_;
  const std::int64_t heads_, kv_heads_, units_;
  const Shape4 qshape_, kshape_, vshape_, oshape_;
  Operands<E> op_;  // what oneDNN reads and writes: the inputs, or their dense copies
  bool dense_q_, dense_k_, dense_v_, dense_o_;
  bool user_mask_, mask_by_head_, mask_by_row_;
  std::int64_t score_elems_ = 0, mask_elems_ = 0, flag_elems_ = 0, scratch_bytes_ = 0;
  float *scores_ = nullptr, *mask_ = nullptr;
  E* probs_ = nullptr;  // 16-bit operands: the probabilities the PV matmul reads
  E* o_copy_ = nullptr;
  std::uint8_t *flags_ = nullptr, *scratch_ = nullptr;
  std::vector<double> sink_factor_;  // sinks: each row's share without the sink (row_sums)
};

template <class E>
inline void OnednnCall<E>::plan() {
  const std::int64_t rows_per_block =
      std::clamp<std::int64_t>(kScoreBudget / 4 / (heads_ * std::max<std::int64_t>(p_.Sk, 1)), 1, p_.Sq);
  blocks().clear();
  try {
    for (std::int64_t b = 0; b < p_.B; ++b)
      for (std::int64_t i0 = 0; i0 < p_.Sq; i0 += rows_per_block)
        blocks().push_back(plan_block(b, i0, std::min(p_.Sq, i0 + rows_per_block)));
  } catch (const dnnl::error& e) {
    throw Error("options.backend", std::string("oneDNN could not create the attention primitives: ") + e.what());
  }
}

template <class E>
inline void OnednnCall<E>::prepare() {
  scores_ = thread_buffer<float, scratch::OnednnScores>().get(static_cast<std::size_t>(score_elems_));
  if constexpr (!std::is_same_v<E, float>)
    probs_ = thread_buffer<E, scratch::OnednnProbs>().get(static_cast<std::size_t>(score_elems_));
  mask_ = thread_buffer<float, scratch::OnednnMask>().get(static_cast<std::size_t>(mask_elems_ + flag_elems_));
  flags_ = reinterpret_cast<std::uint8_t*>(mask_ + mask_elems_);
  scratch_ = thread_buffer<std::uint8_t, scratch::OnednnScratchpad>().get(static_cast<std::size_t>(scratch_bytes_));
  auto numel = [](const Shape4& s) { return static_cast<std::size_t>(s[0] * s[1] * s[2] * s[3]); };
  E* q_copy = dense_q_ ? thread_buffer<E, scratch::OnednnDenseQ>().get(numel(qshape_)) : nullptr;
  E* k_copy = dense_k_ ? thread_buffer<E, scratch::OnednnDenseK>().get(numel(kshape_)) : nullptr;
  E* v_copy = dense_v_ ? thread_buffer<E, scratch::OnednnDenseV>().get(numel(vshape_)) : nullptr;
  o_copy_ = dense_o_ ? thread_buffer<E, scratch::OnednnDenseOut>().get(numel(oshape_)) : nullptr;
  const auto all_rows = [&](std::int64_t) { return p_.Sq; };
  const auto key_rows = [&](std::int64_t b) { return p_.key_len(b); };
  if (dense_q_) copy_rows(op_.q, p_.q_strides, q_copy, op_.q_strides, qshape_, all_rows), op_.q = q_copy;
  if (dense_k_) copy_rows(op_.k, p_.k_strides, k_copy, op_.k_strides, kshape_, key_rows), op_.k = k_copy;
  if (dense_v_) copy_rows(op_.v, p_.v_strides, v_copy, op_.v_strides, vshape_, key_rows), op_.v = v_copy;
  if (dense_o_) op_.o = o_copy_;
}

template <class E>
inline void OnednnCall<E>::execute() {
  thread_local dnnl::stream stream(onednn_engine());
  try {
    for (const Block& blk : blocks()) run_block(blk, stream);
  } catch (const dnnl::error& e) {
    throw Error("options.backend", std::string("oneDNN failed while running attention: ") + e.what());
  }
}

template <class E>
inline void OnednnCall<E>::finish() {
  if (dense_o_)
    copy_rows(o_copy_, op_.o_strides, static_cast<E*>(p_.o), p_.o_strides, oshape_, [&](std::int64_t) { return p_.Sq; });
}

template <class E>
inline std::vector<Block>& OnednnCall<E>::blocks() {
  thread_local std::vector<Block> list;
  return list;
}

template <class E>
inline Block OnednnCall<E>::plan_block(std::int64_t b, std::int64_t i0, std::int64_t i1) {
  Block blk;
  blk.b = b, blk.i0 = i0, blk.i1 = i1;
  bool structure_hides = false;
  key_range(p_, blk, structure_hides);
  const std::int64_t rows = i1 - i0, W = blk.jhi - blk.jlo;
  if (W <= 0) return blk;
  if (structure_hides || user_mask_) {
    blk.mask_heads = mask_by_head_ ? p_.H : 1;
    blk.mask_rows = structure_hides || mask_by_row_ || mask_by_head_ ? rows : 1;
  }
  const float scale = static_cast<float>(p_.scale);
  StepKey key;
  key.heads = heads_, key.kv_heads = kv_heads_, key.rows = rows, key.keys = W, key.D = p_.D, key.Dv = p_.Dv;
  key.q = {op_.q_strides[1], op_.q_strides[2], op_.q_strides[3]};
  key.k = {op_.k_strides[1], op_.k_strides[2], op_.k_strides[3]};
  key.v = {op_.v_strides[1], op_.v_strides[2], op_.v_strides[3]};
  key.out = {op_.o_strides[1], op_.o_strides[2], op_.o_strides[3]};
  key.mask_heads = blk.mask_heads == 0 ? 0 : (mask_by_head_ ? heads_ : 1);
  key.mask_rows = key.mask_heads ? blk.mask_rows : 0;
  std::memcpy(&key.scale_bits, &scale, sizeof scale);
  const auto cap = static_cast<float>(p_.softcap);
  std::memcpy(&key.softcap_bits, &cap, sizeof cap);
  key.threads = threads_;
  key.dt = data_type_of<E>();
  blk.prims = get_prims(key);
  score_elems_ = std::max(score_elems_, heads_ * rows * W);
  for (const memory::desc* sd : {&blk.prims->qk_scratch, &blk.prims->softmax_scratch, &blk.prims->pv_scratch})
    scratch_bytes_ = std::max(scratch_bytes_, static_cast<std::int64_t>(sd->get_size()));
  mask_elems_ = std::max(mask_elems_, blk.mask_heads * blk.mask_rows * W);
  flag_elems_ = std::max(flag_elems_, blk.mask_heads * blk.mask_rows);
  return blk;
}

template <class E>
inline void OnednnCall<E>::run_block(const Block& blk, dnnl::stream& stream) {
  const std::int64_t rows = blk.i1 - blk.i0;
  E* o_blk = op_.o + blk.b * op_.o_strides[0] + blk.i0 * op_.o_strides[2];
  if (blk.jhi == blk.jlo) {  // no row of the block sees a key: zeros, lse the sink's alone (or -inf)
    for (std::int64_t h = 0; h < p_.H; ++h)
      for (std::int64_t r = 0; r < rows; ++r) {
        zero_row(o_blk + h * op_.o_strides[1] + r * op_.o_strides[2], op_.o_strides, p_.Dv);
        if (p_.lse != nullptr)
          p_.lse[blk.b * p_.lse_strides[0] + h * p_.lse_strides[1] + (blk.i0 + r) * p_.lse_strides[2]] =
              p_.sinks != nullptr ? p_.sinks[h] : -std::numeric_limits<float>::infinity();
      }
    return;
  }
  if (blk.mask_heads > 0) build_mask(p_, blk, mask_, flags_);
  for (std::int64_t u = 0; u < units_; ++u) {
    run_unit(blk, u, o_blk + u * heads_ * op_.o_strides[1], stream);
    if (blk.mask_heads > 0) zero_empty_rows(blk, u, o_blk + u * heads_ * op_.o_strides[1]);
  }
}

template <class E>
inline void OnednnCall<E>::run_unit(const Block& blk, std::int64_t u, E* o_u, dnnl::stream& stream) {
  const StepPrims& prims = *blk.prims;
  const dnnl::engine& eng = onednn_engine();
  const std::int64_t h0 = u * heads_, hk0 = per_group_ ? u : 0, W = blk.jhi - blk.jlo;
  const E* q_u = op_.q + blk.b * op_.q_strides[0] + h0 * op_.q_strides[1] + blk.i0 * op_.q_strides[2];
  const E* k_u = op_.k + blk.b * op_.k_strides[0] + hk0 * op_.k_strides[1] + blk.jlo * op_.k_strides[2];
  const E* v_u = op_.v + blk.b * op_.v_strides[0] + hk0 * op_.v_strides[1] + blk.jlo * op_.v_strides[2];
  memory q_mem(prims.q, eng, const_cast<E*>(q_u));
  memory k_mem(prims.kt, eng, const_cast<E*>(k_u));
  memory s_mem(prims.scores, eng, scores_);
  std::unordered_map<int, memory> qk_args{{DNNL_ARG_SRC, q_mem}, {DNNL_ARG_WEIGHTS, k_mem}, {DNNL_ARG_DST, s_mem}};
  if (blk.mask_heads > 0) {
    float* m_u = mask_ + (blk.mask_heads > 1 ? h0 * blk.mask_rows * W : 0);
    qk_args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(prims.mask_post_op) | DNNL_ARG_SRC_1, memory(prims.mask, eng, m_u));
  }
  qk_args.emplace(DNNL_ARG_SCRATCHPAD, memory(prims.qk_scratch, eng, scratch_));
  prims.qk.execute(stream, qk_args);
  const bool sums = p_.sinks != nullptr || p_.lse != nullptr;
  if (sums) {
    stream.wait();
    row_sums(blk, h0, W);
  }
  prims.softmax.execute(stream, {{DNNL_ARG_SRC, s_mem},
                                 {DNNL_ARG_DST, s_mem},
                                 {DNNL_ARG_SCRATCHPAD, memory(prims.softmax_scratch, eng, scratch_)}});
  memory p_mem = s_mem;
  if constexpr (!std::is_same_v<E, float>) {
    p_mem = memory(prims.probs, eng, probs_);
    prims.round_probs.execute(stream, s_mem, p_mem);
  }
  memory v_mem(prims.v, eng, const_cast<E*>(v_u));
  memory o_mem(prims.o, eng, o_u);
  prims.pv.execute(stream, {{DNNL_ARG_SRC, p_mem},
                            {DNNL_ARG_WEIGHTS, v_mem},
                            {DNNL_ARG_DST, o_mem},
                            {DNNL_ARG_SCRATCHPAD, memory(prims.pv_scratch, eng, scratch_)}});
  stream.wait();
  if (p_.sinks != nullptr)  // the softmax's weights without the sink's term: each row rescaled
    for (std::int64_t h = 0; h < heads_; ++h)
      for (std::int64_t r = 0; r < blk.i1 - blk.i0; ++r) {
        const double f = sink_factor_[static_cast<std::size_t>(h * (blk.i1 - blk.i0) + r)];
        if (f == 1.0) continue;
        E* row = o_u + h * op_.o_strides[1] + r * op_.o_strides[2];
        for (std::int64_t d = 0; d < p_.Dv; ++d)
          row[d * op_.o_strides[3]] = narrow<E>(widen(row[d * op_.o_strides[3]]) * f);
      }
}

template <class E>
inline void OnednnCall<E>::row_sums(const Block& blk, std::int64_t h0, std::int64_t W) {
  const std::int64_t rows = blk.i1 - blk.i0;
  sink_factor_.assign(static_cast<std::size_t>(heads_ * rows), 1.0);
  const double neg_inf = -std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (std::int64_t h = 0; h < heads_; ++h)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* s = scores_ + (h * rows + r) * W;
      double m = neg_inf;
      bool any_nan = false;
      for (std::int64_t j = 0; j < W; ++j) {
        if (std::isnan(s[j])) any_nan = true;
        else m = std::max(m, static_cast<double>(s[j]));
      }
      const double sink = p_.sinks != nullptr ? static_cast<double>(p_.sinks[h0 + h]) : neg_inf;
      double lse;
      if (any_nan) {
        lse = nan;
      } else if (m == neg_inf) {
        lse = sink;  // no visible key: zeros (set later), and the sink alone
      } else {
        double sum = 0.0;
        for (std::int64_t j = 0; j < W; ++j) sum += std::exp(static_cast<double>(s[j]) - m);
        const double extra = p_.sinks != nullptr ? std::exp(sink - m) : 0.0;
        sink_factor_[static_cast<std::size_t>(h * rows + r)] = sum / (sum + extra);
        lse = m + std::log(sum + extra);
      }
      if (p_.lse != nullptr)
        p_.lse[blk.b * p_.lse_strides[0] + (h0 + h) * p_.lse_strides[1] + (blk.i0 + r) * p_.lse_strides[2]] = static_cast<float>(lse);
    }
}

template <class E>
inline void OnednnCall<E>::zero_empty_rows(const Block& blk, std::int64_t u, E* o_u) const {
  const std::int64_t h0 = u * heads_;
  for (std::int64_t h = 0; h < heads_; ++h)
    for (std::int64_t r = 0; r < blk.i1 - blk.i0; ++r) {
      const std::int64_t f = (blk.mask_heads > 1 ? (h0 + h) * blk.mask_rows : 0) + (blk.mask_rows > 1 ? r : 0);
      if (flags_[f]) zero_row(o_u + h * op_.o_strides[1] + r * op_.o_strides[2], op_.o_strides, p_.Dv);
    }
}


template <class E>
void run(const Problem& p) {
  if (p.B == 0 || p.H == 0 || p.Sq == 0 || p.Dv == 0) return;
  const OnednnThreads scope(p.threads);
  OnednnCall<E> call(p);
  call.plan();
  call.prepare();
  call.execute();
  call.finish();
}

}  // namespace

void attention_onednn(const Problem& p) {
  if (p.kv_codes())
    throw Error("options.backend", "the onednn backend does not read 8-bit K and V (" +
                                       std::string(dtype_name(p.kv_dtype)) + "); use the native or reference backend");
  if (!onednn_takes(p.dtype)) {
    const std::string dt(dtype_name(p.dtype));
    const std::string version = std::to_string(DNNL_VERSION_MAJOR) + "." + std::to_string(DNNL_VERSION_MINOR);
    throw Error("options.backend", "oneDNN " + version + " has no " + dt + " matmul" +
                                       (p.dtype == DType::f64 ? "" : " on this CPU") +
                                       "; use the native or reference backend for " + dt + " inputs");
  }
  // The softcap is the QK matmul's tanh and linear post-ops, ALiBi and T5's bias are folded into
  // its mask; sinks and lse come from a pass over each step's scores before the softmax primitive
  // (each output row then rescaled by its share without the sink).
  switch (p.dtype) {
    case DType::bf16: run<bfloat16>(p); break;
    case DType::f16: run<float16>(p); break;
    default: run<float>(p);
  }
}

}  // namespace simdattn::detail

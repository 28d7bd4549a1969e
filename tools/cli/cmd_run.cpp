// `simdattn run`: attention on .npy files (docs/cli.md's command-line contract).
#include <string>
#include <vector>


#include "args.hpp"
#include "commands.hpp"
#include "context_parallel.hpp"
#include "score_options.hpp"

namespace simdattn::cli {
namespace {

// The score options (--causal, --scale, --window, the modifiers) are ScoreArgs'.
struct RunArgs : ScoreArgs {
  std::string q, k, v, out, mask, key_lengths, backend = "native", threads, global_tokens, block_mask, block_size,
      dtype;
  // the extra outputs
  std::string lse_out, scores_out, scores_stage;
  std::string context_parallel;  // under mpirun: zigzag | contiguous
};

ScoreStage parse_stage(const std::string& text) {
  for (ScoreStage s : {ScoreStage::scaled, ScoreStage::capped, ScoreStage::biased, ScoreStage::softmax})
    if (text == score_stage_name(s)) return s;
  throw UsageError("--scores-stage: expected scaled, capped, biased or softmax, got '" + text + "'");
}

// The option values, parsed before any file is read so that a typo fails fast. The masks and key
// lengths are files, read later.
AttentionOptions parse_options(const RunArgs& a) {
  AttentionOptions opt;
  opt.causal = parse_causal("--causal", a.causal);
  opt.backend = parse_backend("--backend", a.backend);
  if (!a.scale.empty()) opt.scale = parse_double("--scale", a.scale);
  if (!a.window.empty()) opt.window = parse_window("--window", a.window);
  if (!a.threads.empty()) opt.threads = parse_threads(a.threads);
  constexpr std::int64_t kMaxSize = std::int64_t{1} << 62;
  if (!a.global_tokens.empty()) opt.global_tokens = parse_int("--global-tokens", a.global_tokens, 0, kMaxSize);
  if (!a.block_size.empty()) {
    if (a.block_mask.empty()) throw UsageError("--block-size: needs --block-mask");
    opt.block_size = parse_int("--block-size", a.block_size, 1, kMaxSize);
  }
  if (!a.softcap.empty()) opt.softcap = parse_double("--softcap", a.softcap);
  if (a.alibi && !a.alibi_slopes.empty()) throw UsageError("--alibi: give either --alibi or --alibi-slopes, not both");
  if (!a.t5_max_distance.empty() && a.t5_bias.empty()) throw UsageError("--t5-max-distance: needs --t5-bias");
  if (a.t5_unidirectional && a.t5_bias.empty()) throw UsageError("--t5-unidirectional: needs --t5-bias");
  if (!a.scores_stage.empty() && a.scores_out.empty()) throw UsageError("--scores-stage: needs --scores-out");
  if (!a.scores_stage.empty()) opt.scores_stage = parse_stage(a.scores_stage);
  return opt;
}

// --mask: boolean or additive, broadcast NumPy-style (aligned to the right, missing leading
// dimensions are 1) to [B, H, Sq, Sk].
ConstTensorView mask_view(const std::string& path, const NpyArray& mask) {
  if (mask.dtype != DType::u8 && mask.dtype != DType::f32 && mask.dtype != DType::f64 && mask.dtype != DType::f16)
    throw UsageError("--mask " + path + ": expected dtype |b1, |u1, <f2, <f4 or <f8, got " + mask.descr());
  if (mask.shape.size() > 4)
    throw UsageError("--mask " + path + ": expected at most 4 dimensions (broadcastable to "
                     "[B, H, Sq, Sk]), got " + std::to_string(mask.shape.size()));
  Shape4 ms{1, 1, 1, 1};
  const std::size_t r = mask.shape.size();
  for (std::size_t i = 0; i < r; ++i) ms[4 - r + i] = mask.shape[i];
  return ConstTensorView(mask.data.data(), mask.dtype, ms);
}

// --block-mask: one flag per block of bs query rows by bs keys.
ConstTensorView block_mask_view(const std::string& path, const NpyArray& blocks, std::int64_t bs,
                                std::int64_t Sq, std::int64_t Sk) {
  const std::int64_t nbq = (Sq + bs - 1) / bs, nbk = (Sk + bs - 1) / bs;
  if (blocks.shape.size() != 2 || blocks.shape[0] != nbq || blocks.shape[1] != nbk)
    throw UsageError("--block-mask " + path + ": expected shape (" + std::to_string(nbq) + ", " +
                     std::to_string(nbk) + ") = (ceil(Sq/bs), ceil(Sk/bs)) for Sq=" + std::to_string(Sq) +
                     ", Sk=" + std::to_string(Sk) + ", --block-size " + std::to_string(bs));
  return ConstTensorView(blocks.data.data(), DType::u8, {1, 1, nbq, nbk});
}

void run_command(const RunArgs& a, const ContextParallel* parallel);

void run(const RunArgs& a) {
  if (a.context_parallel.empty()) return run_command(a, nullptr);
  const ContextParallel parallel(a.context_parallel);  // MPI from here to the end of the run
  parallel.run([&] { run_command(a, &parallel); });
}

void run_command(const RunArgs& a, const ContextParallel* parallel) {
  AttentionOptions opt = parse_options(a);
  const DtypeChoice dtype = parse_dtype_option(a.dtype);
  QkvFiles in = load_qkv(a.q, a.k, a.v, true);
  // The files the options' views point into.
  NpyArray mask, blocks;
  std::vector<std::int64_t> lengths;
  if (!a.mask.empty()) {
    mask = load_npy("--mask", a.mask);
    opt.mask = mask_view(a.mask, mask);
  }
  if (!a.key_lengths.empty()) {
    lengths = read_ints("--key-lengths", a.key_lengths, {in.qs[0]}, "one length per batch");
    opt.key_lengths = lengths;
  }
  if (!a.block_mask.empty()) {
    blocks = load_bool_npy("--block-mask", a.block_mask);
    opt.block_mask = block_mask_view(a.block_mask, blocks, opt.block_size, in.qs[2], in.ks[2]);
  }
  const std::int64_t B = in.qs[0], H = in.qs[1], Sq = in.qs[2], Sk = in.ks[2];
  std::vector<float> slopes, sinks;
  std::vector<std::int64_t> offsets;
  NpyArray table;
  if (a.alibi) slopes = with_flag_errors([&] { return standard_alibi_slopes(H); });
  if (!a.alibi_slopes.empty()) slopes = read_floats("--alibi-slopes", a.alibi_slopes, {H}, "one slope per query head");
  if (!slopes.empty()) opt.alibi_slopes = slopes;
  if (!a.sinks.empty()) {
    sinks = read_floats("--sinks", a.sinks, {H}, "one sink per query head");
    opt.sinks = sinks;
  }
  if (!a.query_offset.empty()) {
    offsets = read_ints("--query-offset", a.query_offset, {B}, "one offset per batch");
    opt.query_offsets = offsets;
  }
  if (!a.t5_bias.empty()) {
    table = load_npy("--t5-bias", a.t5_bias);
    if (table.dtype != DType::f32 && table.dtype != DType::f64 && table.dtype != DType::f16)
      throw UsageError("--t5-bias " + a.t5_bias + ": expected dtype <f2, <f4 or <f8, got " + table.descr());
    if (table.shape.size() != 2)
      throw UsageError("--t5-bias " + a.t5_bias + ": expected shape (num_buckets, H) (2 dimensions), got " +
                       std::to_string(table.shape.size()) + " dimensions");
    RelativePositionBias rb;
    rb.table = ConstTensorView(table.data.data(), table.dtype, {1, 1, table.shape[0], table.shape[1]});
    rb.bidirectional = !a.t5_unidirectional;
    if (!a.t5_max_distance.empty())
      rb.max_distance = parse_int("--t5-max-distance", a.t5_max_distance, 1, std::int64_t{1} << 40);
    opt.relative_bias = rb;
  }
  // The extra outputs: allocated (and their sizes checked) before anything is computed, written
  // after the output.
  NpyArray lse, scores;
  if (!a.lse_out.empty()) {
    lse = make_output(DType::f32, {B, H, Sq});
    opt.lse = TensorView(lse.data.data(), DType::f32, {B, H, Sq, 1});
  }
  const DType written = in.q.dtype;  // the outputs' .npy dtype: Q's (lse: f32)
  if (!a.scores_out.empty()) {
    scores = make_output(written, {B, H, Sq, Sk});
    opt.scores = TensorView(scores.data.data(), written, {B, H, Sq, Sk});
  }
  const bool save = !parallel || parallel->writes();
  compute_in_dtype(
      a.out, dtype, in,
      [&](const QkvFiles& x, void* o) {
        if (parallel) parallel->attention(x.q_view(), x.k_view(), x.v_view(), x.o_view(o), opt);
        else attention(x.q_view(), x.k_view(), x.v_view(), x.o_view(o), opt);
      },
      save);
  if (!save) return;
  if (!a.scores_out.empty()) save_output(a.scores_out, scores);
  if (!a.lse_out.empty()) save_output(a.lse_out, lse);
}

void add_options(CLI::App& sub, RunArgs& a) {
  add_qkv_out_options(sub, a.q, a.k, a.v, a.out);
  sub.add_option("--mask", a.mask,
                 "bool/uint8 (nonzero = attend) or float (added to the scaled scores) mask, "
                 "broadcastable to [B, H, Sq, Sk]");
  // the score options among the others, where --help has always listed them
  add_score_options(sub, a, {ScoreOption::causal, ScoreOption::scale});
  sub.add_option("--key-lengths", a.key_lengths, "per-batch key lengths L [B] (<i4 or <i8)");
  add_score_options(sub, a, {ScoreOption::window});
  sub.add_option("--global-tokens", a.global_tokens,
                 "G: the first G positions are global (see and are seen by every position)");
  sub.add_option("--block-mask", a.block_mask,
                 "block-sparse layout: bool/uint8 [ceil(Sq/BS), ceil(Sk/BS)], nonzero = block computed");
  sub.add_option("--block-size", a.block_size, "BS, the block mask's block size (default 64)");
  add_score_options(sub, a,
                    {ScoreOption::softcap, ScoreOption::alibi, ScoreOption::alibi_slopes, ScoreOption::t5_bias,
                     ScoreOption::t5_max_distance, ScoreOption::t5_unidirectional, ScoreOption::sinks,
                     ScoreOption::query_offset});
  sub.add_option("--lse-out", a.lse_out, "write each row's log-sum-exp: f32 [B, H, Sq]");
  sub.add_option("--scores-out", a.scores_out, "write the scores [B, H, Sq, Sk] at --scores-stage (Q's dtype)");
  sub.add_option("--scores-stage", a.scores_stage, "scaled | capped | biased | softmax (default softmax)");
  add_dtype_option(sub, a.dtype);
  add_backend_threads_options(sub, a.backend, a.threads, "reference | native | onednn (default native)");
  sub.add_option("--context-parallel", a.context_parallel,
                 "zigzag | contiguous: under mpirun, deal the keys (causal self-attention: the queries "
                 "too, a ring) to the ranks; rank 0 writes the outputs");
}

}  // namespace

Command add_run_command(CLI::App& app) {
  return add_command<RunArgs>(app, "run", "Attention on .npy files: O = softmax(Q K^T * scale + mask) V",
                              add_options, run);
}

}  // namespace simdattn::cli

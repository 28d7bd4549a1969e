// `simdattn run`: attention on .npy files (docs/design.md's command-line contract).
#include <memory>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct RunArgs {
  std::string q, k, v, out, mask, causal = "none", scale, key_lengths, window, backend = "native",
      threads, global_tokens, block_mask, block_size;
};

void run(const RunArgs& a) {
  // Option values first: a typo fails fast, before any file is read.
  AttentionOptions opt;
  opt.causal = parse_causal("--causal", a.causal);
  opt.backend = parse_backend("--backend", a.backend);
  if (!a.scale.empty()) opt.scale = parse_double("--scale", a.scale);
  if (!a.window.empty()) opt.window = parse_window("--window", a.window);
  if (!a.threads.empty()) opt.threads = static_cast<int>(parse_int("--threads", a.threads, 1, 4096));
  constexpr std::int64_t kMaxSize = std::int64_t{1} << 62;
  if (!a.global_tokens.empty()) opt.global_tokens = parse_int("--global-tokens", a.global_tokens, 0, kMaxSize);
  if (!a.block_size.empty()) {
    if (a.block_mask.empty()) throw UsageError("--block-size: needs --block-mask");
    opt.block_size = parse_int("--block-size", a.block_size, 1, kMaxSize);
  }

  const QkvFiles in = load_qkv(a.q, a.k, a.v);
  const Shape4 &qs = in.qs, &ks = in.ks;

  NpyArray mask;
  if (!a.mask.empty()) {
    mask = load_npy("--mask", a.mask);
    if (mask.dtype != DType::u8 && mask.dtype != DType::f32 && mask.dtype != DType::f64)
      throw UsageError("--mask " + a.mask + ": expected dtype |b1, |u1, <f4 or <f8, got " +
                       mask.descr());
    if (mask.shape.size() > 4)
      throw UsageError("--mask " + a.mask + ": expected at most 4 dimensions (broadcastable to "
                       "[B, H, Sq, Sk]), got " + std::to_string(mask.shape.size()));
    // NumPy broadcasting: align to the right, missing leading dimensions are 1.
    Shape4 ms{1, 1, 1, 1};
    const std::size_t r = mask.shape.size();
    for (std::size_t i = 0; i < r; ++i) ms[4 - r + i] = mask.shape[i];
    opt.mask = ConstTensorView(mask.data.data(), mask.dtype, ms);
  }

  std::vector<std::int64_t> lengths;
  if (!a.key_lengths.empty()) {
    const NpyArray L = load_npy("--key-lengths", a.key_lengths);
    if (L.dtype != DType::i32 && L.dtype != DType::i64)
      throw UsageError("--key-lengths " + a.key_lengths + ": expected dtype <i4 or <i8, got " +
                       L.descr());
    if (L.shape.size() != 1 || L.shape[0] != qs[0])
      throw UsageError("--key-lengths " + a.key_lengths + ": expected shape (" +
                       std::to_string(qs[0]) + ",) (one length per batch)");
    lengths.resize(static_cast<std::size_t>(L.shape[0]));
    for (std::size_t b = 0; b < lengths.size(); ++b)
      lengths[b] = L.dtype == DType::i32 ? L.as<std::int32_t>()[b] : L.as<std::int64_t>()[b];
    opt.key_lengths = lengths;
  }

  NpyArray blocks;
  if (!a.block_mask.empty()) {
    blocks = load_npy("--block-mask", a.block_mask);
    if (blocks.dtype != DType::u8)
      throw UsageError("--block-mask " + a.block_mask + ": expected dtype |b1 or |u1, got " +
                       blocks.descr());
    const std::int64_t bs = opt.block_size;
    const std::int64_t nbq = (qs[2] + bs - 1) / bs, nbk = (ks[2] + bs - 1) / bs;
    if (blocks.shape.size() != 2 || blocks.shape[0] != nbq || blocks.shape[1] != nbk)
      throw UsageError("--block-mask " + a.block_mask + ": expected shape (" + std::to_string(nbq) + ", " +
                       std::to_string(nbk) + ") = (ceil(Sq/bs), ceil(Sk/bs)) for Sq=" + std::to_string(qs[2]) +
                       ", Sk=" + std::to_string(ks[2]) + ", --block-size " + std::to_string(bs));
    opt.block_mask = ConstTensorView(blocks.data.data(), DType::u8, {1, 1, nbq, nbk});
  }

  NpyArray out = make_output(in.q.dtype, {in.os[0], in.os[1], in.os[2], in.os[3]});
  try {
    attention(in.q_view(), in.k_view(), in.v_view(), TensorView(out.data.data(), out.dtype, in.os), opt);
  } catch (const Error& e) {
    throw usage_error(e);
  }
  save_output(a.out, out);
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Attention on .npy files: O = softmax(Q K^T * scale + mask) V");
  add_qkv_out_options(*sub, args->q, args->k, args->v, args->out);
  sub->add_option("--mask", args->mask,
                  "bool/uint8 (nonzero = attend) or float (added to the scaled scores) mask, "
                  "broadcastable to [B, H, Sq, Sk]");
  sub->add_option("--causal", args->causal, "none | top-left | bottom-right (default none)");
  sub->add_option("--scale", args->scale, "score scale (default 1/sqrt(D))");
  sub->add_option("--key-lengths", args->key_lengths, "per-batch key lengths L [B] (<i4 or <i8)");
  sub->add_option("--window", args->window, "sliding window LEFT,RIGHT (-1 = unbounded side)");
  sub->add_option("--global-tokens", args->global_tokens,
                  "G: the first G positions are global (see and are seen by every position)");
  sub->add_option("--block-mask", args->block_mask,
                  "block-sparse layout: bool/uint8 [ceil(Sq/BS), ceil(Sk/BS)], nonzero = block computed");
  sub->add_option("--block-size", args->block_size, "BS, the block mask's block size (default 64)");
  sub->add_option("--backend", args->backend, "reference | native | onednn (default native)");
  sub->add_option("--threads", args->threads, "threads (>= 1; default: OpenMP's)");
  return [args, sub] {
    if (*sub) run(*args);
  };
}

}  // namespace simdattn::cli

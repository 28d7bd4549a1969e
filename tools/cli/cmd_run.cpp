// `simdattn run`: attention on .npy files (docs/design.md's command-line contract).
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"

namespace simdattn::cli {
namespace {

struct RunArgs {
  std::string q, k, v, out, mask, causal = "none", scale, key_lengths, window, backend = "native",
      threads, global_tokens, block_mask, block_size, dtype;
};

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

// --key-lengths: one <i4 or <i8 length per batch.
std::vector<std::int64_t> read_key_lengths(const std::string& path, std::int64_t batch) {
  const NpyArray L = load_npy("--key-lengths", path);
  if (L.dtype != DType::i32 && L.dtype != DType::i64)
    throw UsageError("--key-lengths " + path + ": expected dtype <i4 or <i8, got " + L.descr());
  if (L.shape.size() != 1 || L.shape[0] != batch)
    throw UsageError("--key-lengths " + path + ": expected shape (" + std::to_string(batch) +
                     ",) (one length per batch)");
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(L.shape[0]));
  for (std::size_t b = 0; b < lengths.size(); ++b)
    lengths[b] = L.dtype == DType::i32 ? L.as<std::int32_t>()[b] : L.as<std::int64_t>()[b];
  return lengths;
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

void run(const RunArgs& a) {
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
    lengths = read_key_lengths(a.key_lengths, in.qs[0]);
    opt.key_lengths = lengths;
  }
  if (!a.block_mask.empty()) {
    blocks = load_bool_npy("--block-mask", a.block_mask);
    opt.block_mask = block_mask_view(a.block_mask, blocks, opt.block_size, in.qs[2], in.ks[2]);
  }
  compute_in_dtype(a.out, dtype, in, [&](const QkvFiles& x, void* o) {
    attention(x.q_view(), x.k_view(), x.v_view(), x.o_view(o), opt);
  });
}

void add_options(CLI::App& sub, RunArgs& a) {
  add_qkv_out_options(sub, a.q, a.k, a.v, a.out);
  sub.add_option("--mask", a.mask,
                 "bool/uint8 (nonzero = attend) or float (added to the scaled scores) mask, "
                 "broadcastable to [B, H, Sq, Sk]");
  sub.add_option("--causal", a.causal, "none | top-left | bottom-right (default none)");
  sub.add_option("--scale", a.scale, "score scale (default 1/sqrt(D))");
  sub.add_option("--key-lengths", a.key_lengths, "per-batch key lengths L [B] (<i4 or <i8)");
  sub.add_option("--window", a.window, "sliding window LEFT,RIGHT (-1 = unbounded side)");
  sub.add_option("--global-tokens", a.global_tokens,
                 "G: the first G positions are global (see and are seen by every position)");
  sub.add_option("--block-mask", a.block_mask,
                 "block-sparse layout: bool/uint8 [ceil(Sq/BS), ceil(Sk/BS)], nonzero = block computed");
  sub.add_option("--block-size", a.block_size, "BS, the block mask's block size (default 64)");
  add_dtype_option(sub, a.dtype);
  add_backend_threads_options(sub, a.backend, a.threads, "reference | native | onednn (default native)");
}

}  // namespace

Command add_run_command(CLI::App& app) {
  return add_command<RunArgs>(app, "run", "Attention on .npy files: O = softmax(Q K^T * scale + mask) V",
                              add_options, run);
}

}  // namespace simdattn::cli

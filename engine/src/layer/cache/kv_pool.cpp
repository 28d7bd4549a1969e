// The KV pool: the public KvPool, and the layer's access to it (kv_pool.hpp).
#include "layer/cache/kv_pool.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "core/text.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"
#include "simdattn/mha.hpp"

namespace simdattn {

struct KvPool::State {
  detail::PoolState s;
};

namespace detail {

namespace {


std::int64_t blocks_for(const PoolState& pool, std::int64_t tokens) {
  return (tokens + pool.block_size - 1) / pool.block_size;
}

// The blocks of seq's table that a write of tokens [start, start + tokens) touches.
std::pair<std::int64_t, std::int64_t> touched(const PoolState& pool, const PoolWrite& w) {
  return {w.start / pool.block_size, blocks_for(pool, w.start + w.tokens)};
}

// Copy-on-write: a block of the table entry blk that another sequence holds too is copied to a
// free block (the caller counted it), which the entry then names.
void unshare(PoolState& pool, std::int32_t& blk) {
  if (pool.refs[static_cast<std::size_t>(blk)] == 1) return;
  const auto block_bytes = static_cast<std::size_t>(pool.block_bytes);
  const std::int32_t copy = pool.free_blocks.back();
  pool.free_blocks.pop_back();
  std::memcpy(pool.data.data + static_cast<std::size_t>(copy) * block_bytes,
              pool.data.data + static_cast<std::size_t>(blk) * block_bytes, block_bytes);
  --pool.refs[static_cast<std::size_t>(blk)];
  pool.refs[static_cast<std::size_t>(copy)] = 1;
  blk = copy;
}

// Gives back the blocks of q's table past its first `keep`.
void drop_blocks(PoolState& pool, PoolState::Sequence& q, std::size_t keep) {
  for (std::size_t b = keep; b < q.blocks.size(); ++b)
    if (--pool.refs[static_cast<std::size_t>(q.blocks[b])] == 0) pool.free_blocks.push_back(q.blocks[b]);
  q.blocks.resize(std::min(keep, q.blocks.size()));
}

}  // namespace

PoolState& PoolAccess::state(KvPool& pool) { return pool.state_->s; }
const PoolState& PoolAccess::state(const KvPool& pool) { return pool.state_->s; }

ConstTensorView PoolState::view(std::int64_t layer, int kv) const {
  return ConstTensorView(data.data + static_cast<std::size_t>(offset(layer, kv, 0, 0)) * esize(), dtype,
                         {num_blocks, block_size, kv_heads, kv == 1 ? v_dim : head_dim},
                         {block_bytes / static_cast<std::int64_t>(esize()), head_dim, block_size * head_dim, 1});
}

ConstTensorView PoolState::scale_view(std::int64_t layer, int kv) const {
  if (!is_kv_code(dtype)) return {};
  return ConstTensorView(reinterpret_cast<const float*>(data.data + scale_offset) +
                             (layer * parts() + (latent ? 0 : kv)) * kv_heads * block_size,
                         DType::f32, {num_blocks, block_size, kv_heads, 1}, {block_bytes / 4, 1, block_size, 1});
}

const PoolState::Sequence& PoolState::at(KvPool::Sequence s, const char* argument) const {
  if (s < 0 || s >= static_cast<KvPool::Sequence>(sequences.size()) || !sequences[static_cast<std::size_t>(s)].live)
    throw Error(argument, "sequence " + num(s) + " is not in the pool (never added, or released)");
  return sequences[static_cast<std::size_t>(s)];
}

PoolState::Sequence& PoolState::at(KvPool::Sequence s, const char* argument) {
  return const_cast<Sequence&>(static_cast<const PoolState&>(*this).at(s, argument));
}

void check_pool_writes(const PoolState& pool, std::span<PoolWrite> writes) {
  std::map<std::int32_t, std::int32_t> refs;  // the shared blocks' counts as the writes before leave them
  std::int64_t need = 0;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    PoolWrite& w = writes[i];
    const std::string arg = "steps[" + std::to_string(i) + "].sequence";
    const PoolState::Sequence& s = pool.at(w.seq, arg.c_str());
    for (std::size_t j = 0; j < i; ++j)
      if (writes[j].seq == w.seq)
        throw Error(arg, "sequence " + num(w.seq) + " is the sequence of steps[" + std::to_string(j) +
                             "] too: a batch takes one step per sequence");
    if (w.layer < 0 || w.layer >= pool.layers)
      throw Error("layer", "expected 0 <= layer < " + num(pool.layers) + " (the pool's layers), got " + num(w.layer));
    w.start = s.lengths[static_cast<std::size_t>(w.layer)];
    if (w.tokens == 0) continue;
    const auto [b0, b1] = touched(pool, w);
    const auto have = static_cast<std::int64_t>(s.blocks.size());
    need += std::max<std::int64_t>(0, b1 - have);
    for (std::int64_t b = b0; b < std::min(b1, have); ++b) {
      const std::int32_t blk = s.blocks[static_cast<std::size_t>(b)];
      auto [it, fresh] = refs.try_emplace(blk, pool.refs[static_cast<std::size_t>(blk)]);
      if (it->second > 1) ++need, --it->second;  // copied: one holder fewer
    }
  }
  if (need > static_cast<std::int64_t>(pool.free_blocks.size()))
    throw Error("pool", "the batch needs " + num(need) + " free blocks (new ones and copies of shared ones), " +
                            num(static_cast<std::int64_t>(pool.free_blocks.size())) + " of the pool's " +
                            num(pool.num_blocks) + " are free");
}

void prepare_pool_writes(PoolState& pool, std::span<const PoolWrite> writes) {
  for (const PoolWrite& w : writes) {
    if (w.tokens == 0) continue;
    PoolState::Sequence& s = pool.sequences[static_cast<std::size_t>(w.seq)];
    const auto [b0, b1] = touched(pool, w);
    for (std::int64_t b = b0; b < b1; ++b) {
      if (b < static_cast<std::int64_t>(s.blocks.size())) {
        unshare(pool, s.blocks[static_cast<std::size_t>(b)]);
      } else {
        const std::int32_t blk = pool.free_blocks.back();
        pool.free_blocks.pop_back();
        pool.refs[static_cast<std::size_t>(blk)] = 1;
        s.blocks.push_back(blk);
      }
    }
  }
}

void commit_pool_writes(PoolState& pool, std::span<const PoolWrite> writes) {
  for (const PoolWrite& w : writes)
    pool.sequences[static_cast<std::size_t>(w.seq)].lengths[static_cast<std::size_t>(w.layer)] = w.start + w.tokens;
}

KvStore pool_store(PoolState& pool, std::int64_t layer) {
  KvStore s;
  s.dtype = pool.dtype;
  s.kv_heads = pool.kv_heads, s.head_dim = pool.head_dim, s.block_size = pool.block_size, s.blocks = pool.num_blocks;
  s.v_dim = pool.v_dim;
  s.k = pool.row(0, layer, 0, 0, 0), s.v = pool.row(0, layer, 1, 0, 0);  // (a latent pool's: the same rows)
  s.block_stride = pool.block_bytes / static_cast<std::int64_t>(pool.esize());
  if (is_kv_code(pool.dtype)) {
    s.k_scale = pool.scale(0, layer, 0, 0, 0), s.v_scale = pool.scale(0, layer, 1, 0, 0);
    s.scale_stride = pool.block_bytes / 4;
  }
  s.paged = true;
  return s;
}

void pool_seqs(const PoolState& pool, std::span<const PoolWrite> writes, std::vector<StoreSeq>& seqs) {
  std::int64_t row = 0;
  for (const PoolWrite& w : writes) {
    seqs.push_back({w.seq, &pool.sequences[static_cast<std::size_t>(w.seq)].blocks, w.start, w.tokens, row});
    row += w.tokens;
  }
}

}  // namespace detail

KvPool::KvPool(const MultiHeadAttention& layer, std::int64_t num_blocks, std::int64_t block_size, std::int64_t layers)
    : KvPool(layer, num_blocks, block_size, layers, layer.dtype()) {}

namespace detail {
namespace {

// A pool's blocks and bookkeeping: kv_heads x head_dim rows, two parts a layer (K and V) or,
// latent, one (V its first v_dim columns). Error naming the argument.
void build_pool(PoolState& s, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_dim, bool latent,
                std::int64_t num_blocks, std::int64_t block_size, std::int64_t layers, DType dtype) {
  using detail::num;
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16 && !is_kv_code(dtype))
    throw Error("dtype", "a pool holds f32, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got " + std::string(dtype_name(dtype)) +
                             (dtype == DType::f64 ? " (give an f64 layer's pool dtype f32)" : ""));
  if (kv_heads < 1) throw Error("kv_heads", "expected >= 1, got " + num(kv_heads));
  if (head_dim < 1) throw Error("head_dim", "expected >= 1, got " + num(head_dim));
  if (num_blocks < 1 || num_blocks > INT32_MAX)
    throw Error("num_blocks", "expected 1 <= num_blocks <= 2^31 - 1, got " + num(num_blocks));
  if (block_size < 1) throw Error("block_size", "expected >= 1, got " + num(block_size));
  if (layers < 1) throw Error("layers", "expected >= 1, got " + num(layers));
  s.dtype = dtype, s.num_blocks = num_blocks, s.block_size = block_size, s.layers = layers;
  s.kv_heads = kv_heads, s.head_dim = head_dim, s.latent = latent, s.v_dim = latent ? v_dim : head_dim;
  std::int64_t elems = 0, rows = 0, total = 0, block_bytes = 0;
  const bool codes = is_kv_code(dtype);
  if (__builtin_mul_overflow(layers * s.parts(), kv_heads, &rows) || __builtin_mul_overflow(rows, block_size, &rows) ||
      __builtin_mul_overflow(rows, head_dim, &elems) ||
      __builtin_mul_overflow(elems, static_cast<std::int64_t>(dtype_size(dtype)), &block_bytes) ||
      (codes && __builtin_add_overflow((block_bytes + 63) / 64 * 64, rows * 4 + 63, &block_bytes)) ||
      __builtin_mul_overflow(codes ? block_bytes / 64 * 64 : block_bytes, num_blocks, &total))
    throw Error("num_blocks", num(num_blocks) + " blocks of " + num(block_size) + " tokens x " + num(layers) +
                                  " layers x " + num(kv_heads) + " kv heads x " + num(head_dim) +
                                  " overflow the size of a pool");
  s.block_elems = elems;
  s.scale_offset = codes ? (elems + 63) / 64 * 64 : 0;
  s.block_bytes = codes ? block_bytes / 64 * 64 : block_bytes;
  s.bytes = static_cast<std::size_t>(total);
  s.data.get(s.bytes);  // std::bad_alloc if it does not fit; its pages are touched as blocks are written
  s.refs.assign(static_cast<std::size_t>(num_blocks), 0);
  s.free_blocks.resize(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = 0; b < num_blocks; ++b)  // block 0 handed out first
    s.free_blocks[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(num_blocks - 1 - b);
}

}  // namespace
}  // namespace detail

KvPool::KvPool(const MultiHeadAttention& layer, std::int64_t num_blocks, std::int64_t block_size, std::int64_t layers,
               DType dtype)
    : state_(std::make_unique<State>()) {
  const MhaConfig& c = layer.config();
  if (c.mla)  // one part a layer: the latent rows
    detail::build_pool(state_->s, 1, c.mla->kv_lora_rank + c.mla->qk_rope_head_dim, c.mla->kv_lora_rank, true, num_blocks,
                       block_size, layers, dtype);
  else
    detail::build_pool(state_->s, c.kv_heads, c.head_dim, c.head_dim, false, num_blocks, block_size, layers, dtype);
}

KvPool::KvPool(std::int64_t kv_heads, std::int64_t head_dim, std::int64_t num_blocks, std::int64_t block_size,
               std::int64_t layers, DType dtype)
    : state_(std::make_unique<State>()) {
  detail::build_pool(state_->s, kv_heads, head_dim, head_dim, false, num_blocks, block_size, layers, dtype);
}

KvPool::~KvPool() = default;
KvPool::KvPool(KvPool&&) noexcept = default;
KvPool& KvPool::operator=(KvPool&&) noexcept = default;

KvPool::Sequence KvPool::add() {
  detail::PoolState& s = state_->s;
  Sequence h = 0;
  if (!s.free_handles.empty()) {
    h = s.free_handles.back();
    s.free_handles.pop_back();
  } else {
    s.sequences.emplace_back();
    h = static_cast<Sequence>(s.sequences.size()) - 1;
  }
  detail::PoolState::Sequence& q = s.sequences[static_cast<std::size_t>(h)];
  q.live = true;
  q.blocks.clear();
  q.lengths.assign(static_cast<std::size_t>(s.layers), 0);
  return h;
}

KvPool::Sequence KvPool::fork(Sequence parent) {
  detail::PoolState& s = state_->s;
  s.at(parent, "parent");
  const Sequence child = add();  // may move the sequences: look the parent up again
  detail::PoolState::Sequence& p = s.sequences[static_cast<std::size_t>(parent)];
  detail::PoolState::Sequence& c = s.sequences[static_cast<std::size_t>(child)];
  c.blocks = p.blocks;
  c.lengths = p.lengths;
  for (std::int32_t b : c.blocks) ++s.refs[static_cast<std::size_t>(b)];
  return child;
}

void KvPool::truncate(Sequence seq, std::int64_t length) {
  detail::PoolState& s = state_->s;
  detail::PoolState::Sequence& q = s.at(seq, "sequence");
  const std::int64_t cur = *std::max_element(q.lengths.begin(), q.lengths.end());
  if (length < 0 || length > cur)
    throw Error("length", "expected 0 <= length <= " + detail::num(cur) + " (the sequence's length), got " +
                              detail::num(length));
  for (std::int64_t& l : q.lengths) l = std::min(l, length);
  detail::drop_blocks(s, q, static_cast<std::size_t>(detail::blocks_for(s, length)));
}

void KvPool::accept(Sequence seq, std::int64_t first, std::span<const std::int64_t> kept) {
  detail::PoolState& s = state_->s;
  detail::PoolState::Sequence& q = s.at(seq, "seq");
  const std::int64_t cur = *std::max_element(q.lengths.begin(), q.lengths.end());
  if (first < 0 || first > cur)
    throw Error("first", "expected 0 <= first <= " + detail::num(cur) + " (the sequence's length), got " + detail::num(first));
  const auto n = static_cast<std::int64_t>(kept.size());
  if (n > cur - first)  // (before reading any: a C caller's count past its array reads nothing)
    throw Error("kept", "has " + detail::num(n) + " entries, more than the " + detail::num(cur - first) +
                            " tokens from first = " + detail::num(first) + " on");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = kept[static_cast<std::size_t>(i)];
    if (r < 0 || r >= cur - first || (i > 0 && r <= kept[static_cast<std::size_t>(i - 1)]))
      throw Error("kept", "entry " + detail::num(i) + " is " + detail::num(r) + ": expected strictly increasing indices in [0, " +
                              detail::num(cur - first) + ") (the tokens from first = " + detail::num(first) + " on)");
  }
  // the first kept token that moves (its index below its draft index); from its destination on,
  // rows change: the shared blocks there are copied first, so count them against the free ones
  std::int64_t moved = 0;
  while (moved < n && kept[static_cast<std::size_t>(moved)] == moved) ++moved;
  const std::int64_t b0 = (first + moved) / s.block_size, b1 = detail::blocks_for(s, first + n);
  std::int64_t copies = 0;
  for (std::int64_t b = b0; b < b1 && moved < n; ++b) copies += s.refs[static_cast<std::size_t>(q.blocks[static_cast<std::size_t>(b)])] > 1;
  if (copies > static_cast<std::int64_t>(s.free_blocks.size()))
    throw Error("pool", "moving the kept tokens needs " + detail::num(copies) + " copies of shared blocks, " +
                            detail::num(static_cast<std::int64_t>(s.free_blocks.size())) + " blocks are free");
  if (moved < n)
    for (std::int64_t b = b0; b < b1; ++b) detail::unshare(s, q.blocks[static_cast<std::size_t>(b)]);
  // each layer's rows (K, V, and the 8-bit pools' scales), in increasing order: a destination is
  // never a later token's source (kept[i] >= i)
  const std::size_t row_bytes = static_cast<std::size_t>(s.head_dim) * s.esize();
  for (std::int64_t layer = 0; layer < s.layers; ++layer) {
    std::int64_t& len = q.lengths[static_cast<std::size_t>(layer)];
    if (len <= first) continue;  // a layer the step has not reached keeps its tokens
    std::int64_t out = first;
    for (std::int64_t i = 0; i < n && first + kept[static_cast<std::size_t>(i)] < len; ++i, ++out) {
      const std::int64_t src = first + kept[static_cast<std::size_t>(i)];
      if (src == out) continue;
      const std::int32_t sb = q.blocks[static_cast<std::size_t>(src / s.block_size)],
                         db = q.blocks[static_cast<std::size_t>(out / s.block_size)];
      const std::int64_t ss = src % s.block_size, ds = out % s.block_size;
      for (int kv = 0; kv < s.parts(); ++kv)
        for (std::int64_t hk = 0; hk < s.kv_heads; ++hk) {
          std::memcpy(s.row(db, layer, kv, hk, ds), s.row(sb, layer, kv, hk, ss), row_bytes);
          if (is_kv_code(s.dtype)) *s.scale(db, layer, kv, hk, ds) = *s.scale(sb, layer, kv, hk, ss);
        }
    }
    len = out;
  }
  detail::drop_blocks(s, q, static_cast<std::size_t>(detail::blocks_for(s, *std::max_element(q.lengths.begin(), q.lengths.end()))));
}

void KvPool::release(Sequence seq) {
  detail::PoolState& s = state_->s;
  detail::PoolState::Sequence& q = s.at(seq, "sequence");
  for (auto b = q.blocks.rbegin(); b != q.blocks.rend(); ++b)  // the first block handed out again first
    if (--s.refs[static_cast<std::size_t>(*b)] == 0) s.free_blocks.push_back(*b);
  q.blocks.clear();
  q.live = false;
  s.free_handles.push_back(seq);
}

std::int64_t KvPool::length(Sequence seq, std::int64_t layer) const {
  const detail::PoolState::Sequence& q = state_->s.at(seq, "sequence");
  if (layer < 0 || layer >= state_->s.layers)
    throw Error("layer", "expected 0 <= layer < " + detail::num(state_->s.layers) + ", got " + detail::num(layer));
  return q.lengths[static_cast<std::size_t>(layer)];
}

std::int64_t KvPool::length(Sequence seq) const {
  const detail::PoolState::Sequence& q = state_->s.at(seq, "sequence");
  return *std::max_element(q.lengths.begin(), q.lengths.end());
}

std::span<const std::int32_t> KvPool::block_table(Sequence seq) const { return state_->s.at(seq, "sequence").blocks; }

std::int64_t KvPool::blocks_needed(Sequence seq, std::int64_t tokens, std::int64_t layer) const {
  const detail::PoolState& s = state_->s;
  const detail::PoolState::Sequence& q = s.at(seq, "sequence");
  if (layer < 0 || layer >= s.layers)
    throw Error("layer", "expected 0 <= layer < " + detail::num(s.layers) + ", got " + detail::num(layer));
  if (tokens < 0) throw Error("tokens", "expected >= 0, got " + detail::num(tokens));
  if (tokens == 0) return 0;
  const detail::PoolWrite w{seq, layer, q.lengths[static_cast<std::size_t>(layer)], tokens};
  const auto [b0, b1] = detail::touched(s, w);
  const auto have = static_cast<std::int64_t>(q.blocks.size());
  std::int64_t need = std::max<std::int64_t>(0, b1 - have);
  for (std::int64_t b = b0; b < std::min(b1, have); ++b) need += s.refs[static_cast<std::size_t>(q.blocks[static_cast<std::size_t>(b)])] > 1;
  return need;
}

bool KvPool::contains(Sequence seq) const noexcept {
  const auto& v = state_->s.sequences;
  return seq >= 0 && seq < static_cast<Sequence>(v.size()) && v[static_cast<std::size_t>(seq)].live;
}

std::int64_t KvPool::sequences() const noexcept {
  return static_cast<std::int64_t>(state_->s.sequences.size() - state_->s.free_handles.size());
}
std::int64_t KvPool::num_blocks() const noexcept { return state_->s.num_blocks; }
std::int64_t KvPool::free_blocks() const noexcept { return static_cast<std::int64_t>(state_->s.free_blocks.size()); }
std::int64_t KvPool::block_size() const noexcept { return state_->s.block_size; }
std::int64_t KvPool::layers() const noexcept { return state_->s.layers; }
std::int64_t KvPool::kv_heads() const noexcept { return state_->s.kv_heads; }
std::int64_t KvPool::head_dim() const noexcept { return state_->s.head_dim; }
DType KvPool::dtype() const noexcept { return state_->s.dtype; }
std::int64_t KvPool::bytes_per_token() const noexcept {
  const detail::PoolState& s = state_->s;
  const std::int64_t row = s.head_dim * static_cast<std::int64_t>(s.esize()) + (is_kv_code(s.dtype) ? 4 : 0);
  return s.kv_heads * row * s.parts();
}
std::int64_t KvPool::bytes() const noexcept { return static_cast<std::int64_t>(state_->s.bytes); }

ConstTensorView KvPool::keys(std::int64_t layer) const {
  if (layer < 0 || layer >= state_->s.layers)
    throw Error("layer", "expected 0 <= layer < " + detail::num(state_->s.layers) + ", got " + detail::num(layer));
  return state_->s.view(layer, 0);
}

ConstTensorView KvPool::values(std::int64_t layer) const {
  if (layer < 0 || layer >= state_->s.layers)
    throw Error("layer", "expected 0 <= layer < " + detail::num(state_->s.layers) + ", got " + detail::num(layer));
  return state_->s.view(layer, 1);
}

ConstTensorView KvPool::key_scales(std::int64_t layer) const {
  (void)keys(layer);  // the same check of `layer`
  return state_->s.scale_view(layer, 0);
}

ConstTensorView KvPool::value_scales(std::int64_t layer) const {
  (void)keys(layer);
  return state_->s.scale_view(layer, 1);
}

}  // namespace simdattn

// ring_attention: self-attention over queries, keys and values sharded alike; the K/V shards
// travel the ring (simdattn/mpi.hpp).
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "core/text.hpp"
#include "distributed/comm.hpp"
#include "distributed/options.hpp"
#include "distributed/partial.hpp"
#include "distributed/sharded.hpp"
#include "runtime/workspace.hpp"

namespace simdattn::detail::mpi {

namespace {

void check_ring(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v, const TensorView& out,
                const AttentionOptions& options, const RingOptions& ring, std::int64_t n) {
  refuse_local_positions(options, "ring_attention");
  const std::string why = "ring_attention does not take it (self-attention of one whole sequence)";
  if (!options.mask.empty()) throw Error("options.mask", why);
  if (!options.key_lengths.empty()) throw Error("options.key_lengths", why);
  if (!options.query_offsets.empty()) throw Error("options.query_offsets", why);
  if (is_kv_code(k.dtype) || !options.k_scale.empty() || !options.v_scale.empty())
    throw Error("k", "ring_attention takes K/V of q's dtype (f32, f64, bf16 or f16), not 8-bit codes");
  const Shape4 shape = attention_output_shape(q, k, v);
  if (q.shape[2] != n || k.shape[2] != n)
    throw Error(q.shape[2] != n ? "q" : "k", "expected this rank's " + num(n) + " tokens of " + num(ring.total_tokens) +
                                                 " (" + std::string(shard_order_name(ring.order)) + " order) on axis 2, got " +
                                                 num(q.shape[2] != n ? q.shape[2] : k.shape[2]));
  check_outputs(q.dtype, shape, out, options.lse);
  check_sinks(options, q.shape[1]);
  if (shape[0] * shape[1] * shape[2] > INT_MAX) throw Error("q", "at most 2^31 - 1 rows (B * H * n) per rank");
}

// A [B, Hkv, n, W] view copied into dst, contiguous.
void pack(const ConstTensorView& t, unsigned char* dst) {
  const auto esz = static_cast<std::int64_t>(dtype_size(t.dtype));
  const auto* src = static_cast<const unsigned char*>(t.data);
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (std::int64_t i = 0; i < t.shape[2]; ++i) {
        const unsigned char* row = src + (b * t.strides[0] + h * t.strides[1] + i * t.strides[2]) * esz;
        if (t.strides[3] == 1) {
          std::memcpy(dst, row, static_cast<std::size_t>(t.shape[3] * esz));
          dst += t.shape[3] * esz;
        } else {
          for (std::int64_t d = 0; d < t.shape[3]; ++d, dst += esz)
            std::memcpy(dst, row + d * t.strides[3] * esz, static_cast<std::size_t>(esz));
        }
      }
}

// One rank's K/V shard as it travels: K [B, Hkv, n, D] and V [B, Hkv, n, Dv], each contiguous
// (the caller's own views when they are, else packed; received shards in two alternating
// per-thread buffers).
struct Shard {
  const unsigned char* k = nullptr;
  const unsigned char* v = nullptr;
  std::int64_t n = 0;
};

}  // namespace

namespace scratch {
struct MpiOwnShard : ScratchSlot {};
struct MpiReceived0 : ScratchSlot {};
struct MpiReceived1 : ScratchSlot {};
}  // namespace scratch

namespace {

bool dense(const ConstTensorView& t) { return t.strides == contiguous_strides(t.shape); }

// Non-blocking sends or receives of K's and V's bytes, in messages of at most 1 GiB (tags: K's
// even, V's odd).
constexpr std::int64_t kMessage = std::int64_t{1} << 30;

void post(std::vector<MPI_Request>& requests, bool send, const unsigned char* data, std::int64_t bytes, int parity,
          int peer, MPI_Comm comm) {
  for (std::int64_t at = 0, i = 0; at < bytes; at += kMessage, ++i) {
    const int count = static_cast<int>(std::min(kMessage, bytes - at));
    const int tag = static_cast<int>(2 * i + parity);
    MPI_Request r;
    if (send)
      check(MPI_Isend(data + at, count, MPI_BYTE, peer, tag, comm, &r), "MPI_Isend");
    else
      check(MPI_Irecv(const_cast<unsigned char*>(data) + at, count, MPI_BYTE, peer, tag, comm, &r), "MPI_Irecv");
    requests.push_back(r);
  }
}

// Whether every query of qr is hidden from every key of kr by causal or the window.
bool hidden(const TokenRange& qr, const TokenRange& kr, const AttentionOptions& options) {
  const std::int64_t q_last = qr.start + qr.length - 1, k_last = kr.start + kr.length - 1;
  if (options.causal != Causal::none && kr.start > q_last) return true;
  if (options.window) {
    if (options.window->left >= 0 && k_last < qr.start - options.window->left) return true;
    if (options.window->right >= 0 && kr.start > q_last + options.window->right) return true;
  }
  return false;
}

}  // namespace

}  // namespace simdattn::detail::mpi

namespace simdattn::mpi {

void ring_attention(MPI_Comm comm, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                    const TensorView& out, const AttentionOptions& options, const RingOptions& ring) {
  using namespace detail::mpi;
  ShardedCall call(comm, q, k, v, options, false,
                   {{"ring.total_tokens", ring.total_tokens},
                    {"ring.order", static_cast<std::int64_t>(ring.order)},
                    {"options.lse", options.lse.empty() ? 0 : 1}});
  const int ranks = call.ranks, me = call.me;
  std::vector<TokenRange> mine;
  const std::int64_t B = q.shape[0], Hkv = k.shape[1], D = k.shape[3], Dv = v.shape[3];
  const auto esz = static_cast<std::int64_t>(dtype_size(k.dtype));
  auto k_bytes = [&](std::int64_t n) { return B * Hkv * n * D * esz; };
  auto v_bytes = [&](std::int64_t n) { return B * Hkv * n * Dv * esz; };
  Accumulator acc;
  Shard cur, next;
  std::int64_t n_local = 0;
  AttentionOptions o = options;
  if (o.causal != Causal::none) o.causal = Causal::top_left;  // the offsets place the queries
  o.sinks = {};
  o.lse = {};
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(std::max<std::int64_t>(B, 0)));
  o.query_offsets = offsets;
  const Outcome outcome = outcome_of([&] {
    if (ring.total_tokens < 0)
      throw Error("ring.total_tokens", "expected the sequence's token count (>= 0), got " + std::to_string(ring.total_tokens));
    mine = shard_ranges(ring.total_tokens, ranks, me, ring.order);
    for (const TokenRange& r : mine) n_local += r.length;
    check_ring(q, k, v, out, options, ring, n_local);
    acc.reset({B, q.shape[1], n_local, Dv}, q.dtype, out);
    cur.n = n_local;
    if (dense(k) && dense(v)) {
      cur.k = static_cast<const unsigned char*>(k.data);
      cur.v = static_cast<const unsigned char*>(v.data);
    } else {
      unsigned char* own =
          detail::thread_buffer<unsigned char, detail::mpi::scratch::MpiOwnShard>().get(static_cast<std::size_t>(k_bytes(n_local) + v_bytes(n_local)));
      pack(k, own);
      pack(v, own + k_bytes(n_local));
      cur.k = own;
      cur.v = own + k_bytes(n_local);
    }
    // attention()'s own checks of the options on the real shapes, before the ranks agree: its
    // first query over its own keys (an Error here would otherwise come mid-ring).
    if (n_local > 0) {
      std::vector<unsigned char> row(static_cast<std::size_t>(B * q.shape[1] * Dv) * dtype_size(q.dtype));
      std::vector<float> row_lse(static_cast<std::size_t>(B * q.shape[1]));
      AttentionOptions first = o;
      first.lse = TensorView(row_lse.data(), {B, q.shape[1], 1, 1});
      attention(slice_seq(q, 0, 1), k, v, TensorView(row.data(), q.dtype, {B, q.shape[1], 1, Dv}), first);
    }
  });
  agree(comm, outcome, call.shared);

  const int right = (me + 1) % ranks, left = (me + ranks - 1) % ranks;
  for (int t = 0; t < ranks; ++t) {
    const int src = (me - t + ranks) % ranks;  // whose shard cur holds
    std::vector<MPI_Request> requests;
    if (t + 1 < ranks) {
      const int incoming = (me - t - 1 + 2 * ranks) % ranks;
      next.n = shard_length(ring.total_tokens, ranks, incoming, ring.order);
      const auto bytes = static_cast<std::size_t>(k_bytes(next.n) + v_bytes(next.n));
      unsigned char* into = t % 2 == 0 ? detail::thread_buffer<unsigned char, detail::mpi::scratch::MpiReceived0>().get(bytes)
                                       : detail::thread_buffer<unsigned char, detail::mpi::scratch::MpiReceived1>().get(bytes);
      next.k = into;
      next.v = into + k_bytes(next.n);
      post(requests, false, next.k, k_bytes(next.n), 0, left, comm);
      post(requests, false, next.v, v_bytes(next.n), 1, left, comm);
      post(requests, true, cur.k, k_bytes(cur.n), 0, right, comm);
      post(requests, true, cur.v, v_bytes(cur.n), 1, right, comm);
    }
    const std::vector<TokenRange> theirs = shard_ranges(ring.total_tokens, ranks, src, ring.order);
    const ConstTensorView k_all(cur.k, k.dtype, {B, Hkv, cur.n, D});
    const ConstTensorView v_all(cur.v, v.dtype, {B, Hkv, cur.n, Dv});
    std::int64_t q_at = 0;
    for (const TokenRange& qr : mine) {
      std::int64_t k_at = 0;
      for (const TokenRange& kr : theirs) {
        if (!hidden(qr, kr, options)) {
          std::fill(offsets.begin(), offsets.end(), qr.start - kr.start);
          acc.attend(q_at, slice_seq(q, q_at, qr.length),
                      slice_seq(k_all, k_at, kr.length), slice_seq(v_all, k_at, kr.length), o);
        }
        k_at += kr.length;
      }
      q_at += qr.length;
    }
    if (!requests.empty())
      check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    std::swap(cur, next);
  }
  acc.finish(options.sinks, options.lse);
}

}  // namespace simdattn::mpi

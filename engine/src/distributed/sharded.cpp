// sharded_attention: the same queries over K/V sharded across the ranks (simdattn/mpi.hpp).
#include <algorithm>
#include <climits>
#include <string>

#include "core/text.hpp"
#include "distributed/comm.hpp"
#include "distributed/options.hpp"
#include "distributed/partial.hpp"
#include "distributed/sharded.hpp"

namespace simdattn::detail::mpi {

namespace {

// The local checks that attention() on the pieces would not make about the whole call.
void check_shard(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                 const TensorView& out, const AttentionOptions& options, const ShardOptions& shard, int ranks, int me) {
  refuse_local_positions(options, "sharded_attention");
  if (shard.total_keys < 0) throw Error("shard.total_keys", "expected the whole sequence's key count (>= 0), got " + num(shard.total_keys));
  if (shard.root < -1 || shard.root >= ranks)
    throw Error("shard.root", "expected -1 (every rank) or a rank in [0, " + num(ranks) + "), got " + num(shard.root));
  const Shape4 shape = attention_output_shape(q, k, v);
  std::int64_t n = 0;
  for (std::size_t i = 0; i < shard.key_ranges.size(); ++i) {
    const TokenRange& r = shard.key_ranges[i];
    if (r.start < 0 || r.length < 0 || r.start > shard.total_keys - r.length)
      throw Error("shard.key_ranges", "range " + num(static_cast<std::int64_t>(i)) + " [" + num(r.start) + ", " +
                                          num(r.start) + " + " + num(r.length) + ") is not inside [0, total_keys = " +
                                          num(shard.total_keys) + ")");
    n += r.length;
  }
  if (n != k.shape[2])
    throw Error("shard.key_ranges", "the ranges hold " + num(n) + " keys, k holds " + num(k.shape[2]) + " (k.shape[2])");
  const std::int64_t B = q.shape[0];
  if (!options.key_lengths.empty()) {
    if (static_cast<std::int64_t>(options.key_lengths.size()) != B)
      throw Error("options.key_lengths", "expected " + num(B) + " lengths (one per batch), got " +
                                             num(static_cast<std::int64_t>(options.key_lengths.size())));
    for (std::int64_t b = 0; b < B; ++b)
      if (options.key_lengths[static_cast<std::size_t>(b)] < 0 ||
          options.key_lengths[static_cast<std::size_t>(b)] > shard.total_keys)
        throw Error("options.key_lengths", "length " + num(b) + " is " + num(options.key_lengths[static_cast<std::size_t>(b)]) +
                                               ", expected in [0, total_keys = " + num(shard.total_keys) + "]");
  }
  if (!options.query_offsets.empty()) {
    if (static_cast<std::int64_t>(options.query_offsets.size()) != B)
      throw Error("options.query_offsets", "expected " + num(B) + " offsets (one per batch), got " +
                                               num(static_cast<std::int64_t>(options.query_offsets.size())));
    for (std::int64_t o : options.query_offsets)
      if (o < -(std::int64_t{1} << 40) || o > (std::int64_t{1} << 40))
        throw Error("options.query_offsets", "expected |offset| <= 2^40, got " + num(o));
  }
  if (!options.mask.empty() && options.mask.shape[3] != k.shape[2] && options.mask.shape[3] != 1)
    throw Error("options.mask", "expected a key axis of this rank's " + num(k.shape[2]) + " keys or 1, got shape " +
                                    shape_text(options.mask.shape));
  check_sinks(options, q.shape[1]);
  if (shard.root == -1 || shard.root == me) check_outputs(q.dtype, shape, out, options.lse);
  const std::int64_t rows = shape[0] * shape[1] * shape[2];
  if (rows > INT_MAX) throw Error("q", "at most 2^31 - 1 rows (B * H * Sq) in one sharded call, got " + num(rows));
}

}  // namespace

std::int64_t global_query_offset(const AttentionOptions& options, std::int64_t b, std::int64_t total_keys, std::int64_t sq) {
  if (!options.query_offsets.empty()) return options.query_offsets[static_cast<std::size_t>(b)];
  const std::int64_t len = options.key_lengths.empty() ? total_keys : options.key_lengths[static_cast<std::size_t>(b)];
  return options.causal == Causal::top_left ? 0 : len - sq;
}

void attend_local(Accumulator& acc, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                  const AttentionOptions& options, std::int64_t total_keys, std::span<const TokenRange> ranges) {
  const std::int64_t B = q.shape[0], Sq = q.shape[2];
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(B)), lengths(static_cast<std::size_t>(B));
  std::int64_t at = 0;  // the run's first key on k's key axis
  for (const TokenRange& run : ranges) {
    bool any = false;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t len = options.key_lengths.empty() ? total_keys : options.key_lengths[static_cast<std::size_t>(b)];
      lengths[static_cast<std::size_t>(b)] = std::clamp<std::int64_t>(len - run.start, 0, run.length);
      offsets[static_cast<std::size_t>(b)] = global_query_offset(options, b, total_keys, Sq) - run.start;
      any = any || lengths[static_cast<std::size_t>(b)] > 0;
    }
    if (any && Sq > 0) {
      AttentionOptions o = options;
      if (o.causal != Causal::none) o.causal = Causal::top_left;  // the offsets place the queries
      o.key_lengths = lengths;
      o.query_offsets = offsets;
      o.sinks = {};
      o.lse = {};
      o.scores = {};
      if (!o.mask.empty() && o.mask.shape[3] != 1) o.mask = slice_last(o.mask, at, run.length);
      if (!o.k_scale.empty()) o.k_scale = slice_seq(o.k_scale, at, run.length);
      if (!o.v_scale.empty()) o.v_scale = slice_seq(o.v_scale, at, run.length);
      acc.attend(0, q, slice_seq(k, at, run.length), slice_seq(v, at, run.length), o);
    }
    at += run.length;
  }
}

void merge_and_write(MPI_Comm comm, const Accumulator& acc, const ConstTensorView& q, std::int64_t dv,
                     const TensorView& out, const AttentionOptions& options, int root) {
  const int ranks = size_of(comm), me = rank_of(comm);
  const std::int64_t rows = q.shape[0] * q.shape[1] * q.shape[2], width = dv + 1;
  Partial mine(rows, dv);
  acc.export_rows(mine.data());
  MPI_Datatype row_type;
  check(MPI_Type_contiguous(static_cast<int>(width), MPI_DOUBLE, &row_type), "MPI_Type_contiguous");
  struct Free {
    MPI_Datatype* t;
    ~Free() { MPI_Type_free(t); }
  } free_type{&row_type};
  check(MPI_Type_commit(&row_type), "MPI_Type_commit");
  const bool writes = root == -1 || root == me;
  std::vector<double> all(writes ? static_cast<std::size_t>(rows * width * ranks) : 0);
  if (root == -1)
    check(MPI_Allgather(mine.data(), static_cast<int>(rows), row_type, all.data(), static_cast<int>(rows), row_type, comm),
          "MPI_Allgather");
  else
    check(MPI_Gather(mine.data(), static_cast<int>(rows), row_type, all.data(), static_cast<int>(rows), row_type, root,
                     comm),
          "MPI_Gather");
  if (!writes) return;
  const std::int64_t H = q.shape[1], Sq = q.shape[2];
  Partial merged(rows, dv);
  for (int r = 0; r < ranks; ++r) {
    const double* part = all.data() + static_cast<std::int64_t>(r) * rows * width;
    for (std::int64_t i = 0; i < rows; ++i)
      Partial::merge_row(merged.row(i), dv, part + i * width, part[i * width + dv]);
  }
  if (!options.sinks.empty())
    for (std::int64_t i = 0; i < rows; ++i) Partial::add_sink(merged.row(i), dv, options.sinks[static_cast<std::size_t>(i / Sq % H)]);
  write_rows(merged, H, Sq, out, options.lse);
}

}  // namespace simdattn::detail::mpi

namespace simdattn::mpi {

void sharded_attention(MPI_Comm comm, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                       const TensorView& out, const AttentionOptions& options, const ShardOptions& shard) {
  using namespace detail::mpi;
  ShardedCall call(comm, q, k, v, options, true, {{"shard.total_keys", shard.total_keys}, {"shard.root", shard.root}});
  Accumulator acc;
  const Outcome outcome = outcome_of([&] {
    check_shard(q, k, v, out, options, shard, call.ranks, call.me);
    acc.reset({q.shape[0], q.shape[1], q.shape[2], v.shape[3]}, q.dtype, TensorView());
    attend_local(acc, q, k, v, options, shard.total_keys, shard.key_ranges);
  });
  const Gathered ranges = agree(comm, outcome, call.shared, flatten(shard.key_ranges));
  check_cover(ranges, shard.total_keys, "shard.key_ranges");
  merge_and_write(comm, acc, q, v.shape[3], out, options, shard.root);
}

}  // namespace simdattn::mpi

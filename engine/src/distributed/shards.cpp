// How a sequence is dealt to the ranks (simdattn/mpi.hpp, ShardOrder).
#include <algorithm>
#include <string>

#include "simdattn/mpi.hpp"

namespace simdattn::mpi {

namespace {

// Part `i` of `parts` near-equal parts of `total`: the first total % parts one longer.
TokenRange part(std::int64_t total, std::int64_t parts, std::int64_t i) {
  const std::int64_t base = total / parts, extra = total % parts;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

}  // namespace

std::vector<TokenRange> shard_ranges(std::int64_t total, int ranks, int rank, ShardOrder order) {
  if (total < 0) throw Error("total", "expected a token count >= 0, got " + std::to_string(total));
  if (ranks < 1) throw Error("ranks", "expected >= 1, got " + std::to_string(ranks));
  if (rank < 0 || rank >= ranks)
    throw Error("rank", "expected in [0, " + std::to_string(ranks) + "), got " + std::to_string(rank));
  std::vector<TokenRange> out;
  auto keep = [&](TokenRange r) {
    if (r.length > 0) out.push_back(r);
  };
  if (order == ShardOrder::contiguous) {
    keep(part(total, ranks, rank));
  } else if (order == ShardOrder::zigzag) {
    keep(part(total, 2 * std::int64_t{ranks}, rank));
    keep(part(total, 2 * std::int64_t{ranks}, 2 * std::int64_t{ranks} - 1 - rank));
  } else {
    throw Error("order", "expected contiguous or zigzag");
  }
  return out;
}

std::int64_t shard_length(std::int64_t total, int ranks, int rank, ShardOrder order) {
  std::int64_t n = 0;
  for (const TokenRange& r : shard_ranges(total, ranks, rank, order)) n += r.length;
  return n;
}

std::string_view shard_order_name(ShardOrder order) noexcept {
  switch (order) {
    case ShardOrder::contiguous: return "contiguous";
    case ShardOrder::zigzag: return "zigzag";
  }
  return "?";
}

}  // namespace simdattn::mpi

// check_cover: the ranks' shards together hold each position once.
#include <algorithm>
#include <string>

#include "distributed/comm.hpp"
#include "distributed/sharded.hpp"

namespace simdattn::detail::mpi {

std::vector<std::int64_t> flatten(std::span<const TokenRange> ranges) {
  std::vector<std::int64_t> flat;
  for (const TokenRange& r : ranges) {
    flat.push_back(r.start);
    flat.push_back(r.length);
  }
  return flat;
}

void check_cover(const Gathered& g, std::int64_t total, const char* argument) {
  struct Owned {
    std::int64_t start, length;
    int rank;
  };
  std::vector<Owned> all;
  for (std::size_t r = 0; r + 1 < g.offsets.size(); ++r)
    for (auto i = g.offsets[r]; i + 1 < g.offsets[r + 1]; i += 2)
      if (g.values[static_cast<std::size_t>(i) + 1] > 0)
        all.push_back({g.values[static_cast<std::size_t>(i)], g.values[static_cast<std::size_t>(i) + 1], static_cast<int>(r)});
  std::sort(all.begin(), all.end(), [](const Owned& a, const Owned& b) { return a.start < b.start; });
  std::int64_t next = 0;
  for (const Owned& o : all) {
    if (o.start < next)
      throw Error(argument, "position " + std::to_string(o.start) + " is held twice (again by rank " +
                                std::to_string(o.rank) + "): the ranks' ranges must cover [0, " + std::to_string(total) +
                                ") once");
    if (o.start > next)
      throw Error(argument, "positions [" + std::to_string(next) + ", " + std::to_string(o.start) +
                                ") are held by no rank: the ranks' ranges must cover [0, " + std::to_string(total) + ") once");
    next = o.start + o.length;
  }
  if (next != total)
    throw Error(argument, "positions [" + std::to_string(next) + ", " + std::to_string(total) +
                              ") are held by no rank: the ranks' ranges must cover [0, " + std::to_string(total) + ") once");
}

}  // namespace simdattn::detail::mpi

// The public helpers of the score modifiers (simdattn/attention.hpp): ALiBi's standard slopes
// and T5's bucket function (whose rule lives in modifiers.hpp).
#include "core/modifiers.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "simdattn/attention.hpp"
#include "simdattn/error.hpp"

namespace simdattn {

std::vector<float> standard_alibi_slopes(std::int64_t heads) {
  if (heads < 1) throw Error("heads", "must be >= 1, got " + std::to_string(heads));
  std::int64_t n = 1;  // the largest power of two <= heads
  while (n * 2 <= heads) n *= 2;
  std::vector<float> slopes;
  slopes.reserve(static_cast<std::size_t>(heads));
  // base^k with base = 2^(-8 / n), k = 1 .. n; then extra^k with extra = 2^(-4 / n) for odd k (the
  // slopes of 2n heads in between). As BLOOM's build_alibi_tensor: each base rounded to float32
  // once, the powers taken in float32.
  const auto base = static_cast<float>(std::exp2(-8.0 / double(n))), extra = static_cast<float>(std::exp2(-4.0 / double(n)));
  for (std::int64_t k = 1; k <= n; ++k) slopes.push_back(std::pow(base, static_cast<float>(k)));
  for (std::int64_t k = 1; static_cast<std::int64_t>(slopes.size()) < heads; k += 2)
    slopes.push_back(std::pow(extra, static_cast<float>(k)));
  return slopes;
}

std::int64_t t5_relative_bucket(std::int64_t relative_position, bool bidirectional, std::int64_t num_buckets,
                                std::int64_t max_distance) {
  const std::int64_t exact = bidirectional ? num_buckets / 4 : num_buckets / 2;
  if (num_buckets < 2 || (bidirectional && num_buckets < 4))
    throw Error("num_buckets", "must be >= 2 (>= 4 bidirectional), got " + std::to_string(num_buckets));
  if (max_distance <= exact)
    throw Error("max_distance", "must exceed the exact buckets (" + std::to_string(exact) + "), got " +
                                    std::to_string(max_distance));
  return detail::t5_bucket(relative_position, bidirectional, num_buckets, max_distance);
}

}  // namespace simdattn

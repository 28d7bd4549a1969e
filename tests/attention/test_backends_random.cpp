// Every backend against the reference on random configurations covering every option (sizes,
// grouped-query heads, layouts, odd strides, causal, masks, key lengths, windows, scales), within
// docs/design.md's tolerances; each configuration runs on every backend this build has.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>

#include "support/backend_config.hpp"

using namespace simdattn;
using test::Config;
using test::MaskType;

namespace {

// One random attention configuration with every option drawn at random.
Config random_config(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  Config c;
  c.B = pick(1, 3);
  c.Hkv = pick(1, 3);
  c.H = c.Hkv * pick(1, 3);
  // Mostly small; one in eight crosses the native kernel's query (96) and key (128) blocks.
  const bool big = pick(0, 7) == 0;
  c.Sq = big ? pick(1, 300) : pick(1, 40);
  c.Sk = big ? pick(1, 300) : pick(1, 40);
  const std::int64_t dims[] = {1, 3, 8, 15, 16, 17, 33, 64};
  c.D = dims[pick(0, 7)];
  c.Dv = pick(0, 2) == 0 ? dims[pick(0, 7)] : c.D;
  c.bshd = pick(0, 1) == 1;
  c.row_pad = pick(0, 2) == 0 ? pick(1, 5) : 0;
  c.causal = static_cast<Causal>(pick(0, 2));
  c.mask_type = static_cast<MaskType>(pick(0, 2));
  if (c.mask_type != MaskType::none) {
    const Shape4 shapes[] = {{1, 1, c.Sq, c.Sk}, {c.B, 1, c.Sq, c.Sk}, {c.B, c.H, c.Sq, c.Sk}, {c.B, 1, 1, c.Sk}};
    c.mask_shape = shapes[pick(0, 3)];
  }
  c.key_lengths = pick(0, 2) == 0;
  if (pick(0, 3) == 0) c.window = big ? Window{pick(-1, 150), pick(-1, 150)} : Window{pick(-1, 6), pick(-1, 6)};
  if (pick(0, 3) == 0) c.scale = std::uniform_real_distribution<double>(-1.0, 2.0)(rng);
  return c;
}

}  // namespace

TEST_CASE("backends agree with the reference on 500 random configurations of bf16 and of f16" *
          doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 11);
  for (int trial = 0; trial < 1000; ++trial) {
    const Config c = random_config(rng);
    if (trial % 2 == 0) test::check_config<bfloat16>(c, rng);
    else test::check_config<float16>(c, rng);
  }
}

TEST_CASE("backends agree with the reference on 500 random configurations" * doctest::test_suite(test::every_isa)) {
  std::mt19937_64 rng(test::base_seed() + 10);
  for (int trial = 0; trial < 500; ++trial) {
    const Config c = random_config(rng);
    if (trial % 2 == 0) test::check_config<float>(c, rng);
    else test::check_config<double>(c, rng);
  }
}

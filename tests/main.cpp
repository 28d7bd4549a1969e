#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "test_util.hpp"

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  std::fprintf(stderr, "simdattn tests: random seed %llu (set SIMDATTN_TEST_SEED to reproduce)\n",
              static_cast<unsigned long long>(simdattn::test::base_seed()));
  return ctx.run();
}

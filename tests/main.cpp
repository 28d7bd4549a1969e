#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "support/test_util.hpp"

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  // The tests ask for more threads than a small machine has cores (3, 7: partitions and bitwise
  // identity across thread counts); the default budget, the process's CPUs, would give them
  // fewer. The budget's own test sets and restores it.
  simdattn::set_thread_budget(64);
  std::fprintf(stderr, "simdattn tests: random seed %llu (set SIMDATTN_TEST_SEED to reproduce)\n",
              static_cast<unsigned long long>(simdattn::test::base_seed()));
  return ctx.run();
}

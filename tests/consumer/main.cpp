// Calls attention() through the installed headers and library; exits non-zero on a wrong result.
#include <simdattn/simdattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  // Two keys with equal scores: the output is the mean of the two value rows.
  const std::vector<float> q{1.f, 0.f}, k{0.f, 1.f, 0.f, 1.f}, v{2.f, 4.f, 6.f, 8.f};
  std::vector<float> o(2, 0.f);
  simdattn::attention(simdattn::ConstTensorView(q.data(), {1, 1, 1, 2}),
                      simdattn::ConstTensorView(k.data(), {1, 1, 2, 2}),
                      simdattn::ConstTensorView(v.data(), {1, 1, 2, 2}),
                      simdattn::TensorView(o.data(), {1, 1, 1, 2}));
  std::printf("simdattn %s: o = [%g, %g]\n", simdattn::kVersionString, o[0], o[1]);
  try {
    simdattn::attention(simdattn::ConstTensorView(q.data(), {1, 1, 1, 2}),
                        simdattn::ConstTensorView(k.data(), {1, 1, 1, 4}),
                        simdattn::ConstTensorView(v.data(), {1, 1, 2, 2}),
                        simdattn::TensorView(o.data(), {1, 1, 1, 2}));
    std::printf("expected an error for a bad k shape\n");
    return 1;
  } catch (const simdattn::Error& e) {
    std::printf("error as expected: %s\n", e.what());
  }
  return std::abs(o[0] - 4.f) < 1e-6f && std::abs(o[1] - 6.f) < 1e-6f ? 0 : 1;
}

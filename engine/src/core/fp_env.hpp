// The floating-point environment of the kernels' threads.
#pragma once

#include <xmmintrin.h>

namespace simdattn::detail {

// While alive, the calling thread flushes denormal results to zero and reads denormal inputs as
// zero (MXCSR's FTZ and DAZ); the caller's MXCSR comes back when it ends. Softmax weights far
// below the row's largest (ALiBi's distant keys: e^-80) times small values of V would
// otherwise make the PV products' partial sums denormal, and each such result costs an Intel
// core a microcode assist (attention/native/gpt-alibi took 1.38x gpt's time, the GEMM
// micro-kernel 1.3x its own). What is lost is below 2^-126 (f32) of a row's output, far under
// any tolerance.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
};

}  // namespace simdattn::detail

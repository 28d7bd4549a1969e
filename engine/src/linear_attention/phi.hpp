// The feature maps of linear attention (simdattn/linear.hpp), one value at a time: the
// reference, the recurrent state and the native kernel's edges use these.
#pragma once

#include <cmath>

#include "simdattn/linear.hpp"

namespace simdattn {

template <class T>
inline T phi(FeatureMap f, T x) {
  switch (f) {
    case FeatureMap::elu1: return x > T(0) ? x + T(1) : std::exp(x);  // NaN -> exp(NaN) = NaN
    case FeatureMap::relu: return x < T(0) ? T(0) : x;                // NaN stays NaN
    case FeatureMap::identity: return x;
  }
  return x;
}

}  // namespace simdattn

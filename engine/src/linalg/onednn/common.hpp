// What the oneDNN code shares (attention/onednn/, linalg/onednn/matmul.cpp): the CPU engine and the OpenMP
// thread count of a call.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include "runtime/workspace.hpp"

namespace simdattn::detail {

namespace scratch {
struct OnednnScratchpad : ScratchSlot {};  // oneDNN's scratchpads (bytes)
}  // namespace scratch

// The process's oneDNN CPU engine.
const dnnl::engine& onednn_engine();

// Sets OpenMP's thread count for this thread while alive (oneDNN reads it when it creates and
// runs primitives); threads <= 0 keeps the default.
class OnednnThreads {
 public:
  explicit OnednnThreads(int threads) {
    if (threads > 0 && !omp_in_parallel()) {
      saved_ = omp_get_max_threads();
      omp_set_num_threads(threads);
    }
  }
  ~OnednnThreads() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  OnednnThreads(const OnednnThreads&) = delete;
  OnednnThreads& operator=(const OnednnThreads&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace simdattn::detail

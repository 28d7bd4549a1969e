// The process's oneDNN CPU engine (common.hpp).
#include "linalg/onednn/common.hpp"

namespace simdattn::detail {

const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

}  // namespace simdattn::detail

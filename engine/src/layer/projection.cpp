// The layer's projections (projection.hpp): the native GEMMs on the packed weights, oneDNN's
// matmuls on their row-major copies.
#include "layer/projection.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/element.hpp"
#include "linalg/convert.hpp"
#include "linalg/gemm.hpp"
#include "linalg/gemm16.hpp"
#include "linalg/onednn/matmul.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/attention.hpp"

namespace simdattn::detail {

template <class T>
void project(const T* x, std::int64_t M, std::int64_t K, std::int64_t ldx, const PackedWeights<T>& w, std::int64_t col,
             std::int64_t N, const T* bias, T* y, std::int64_t ldy, int threads, const T* row_major) {
  if (M == 0 || N == 0) return;
  if (row_major != nullptr) {
#if SIMDATTN_HAVE_ONEDNN
    const float* b = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      b = bias;
    } else if (bias != nullptr) {
      float* f = thread_buffer<float, scratch::MhaProjectionF32>().get(static_cast<std::size_t>(N));
      for (std::int64_t j = 0; j < N; ++j) f[j] = static_cast<float>(widen(bias[j]));
      b = f;
    }
    onednn_matmul(dtype_of<T>(), x, M, K, ldx, row_major + col, w.N, N, b, y, ldy, threads);
    return;
#endif
  }
  if constexpr (kIs16Bit<T>) {
    float* acc = thread_buffer<float, scratch::MhaProjectionF32>().get(static_cast<std::size_t>(M * N));
    Gemm16Args g;
    g.M = M, g.N = N, g.K = K;
    g.A = reinterpret_cast<const std::uint16_t*>(x), g.lda = ldx;
    g.B = &w, g.b_col = col;
    g.C = acc, g.ldc = N;
    if (bias != nullptr) {
      for (std::int64_t j = 0; j < N; ++j) acc[j] = static_cast<float>(widen(bias[j]));
      for (std::int64_t m = 1; m < M; ++m) std::memcpy(acc + m * N, acc, sizeof(float) * N);
      g.beta = 1.0f;
    }
    gemm16(g, threads);
    for (std::int64_t m = 0; m < M; ++m) convert_elements(acc + m * N, DType::f32, y + m * ldy, dtype_of<T>(), N);
  } else {
    GemmArgs<T> g;
    g.M = M, g.N = N, g.K = K;
    g.A = x, g.lda = ldx;
    g.packed_b = &w, g.b_col = col;
    g.C = y, g.ldc = ldy;
    g.c_row = bias;
    gemm(g, threads);
  }
}

template <class T>
const T* onednn_weights(const LayerStorage<T>& layer, const MhaOptions& o, const PackedWeights<T>& w) {
  // (where oneDNN cannot take the layer's dtype, or is not built, attention() names the
  // backend's refusal; no copy is made for it)
  if (o.backend != Backend::onednn || !backend_takes(Backend::onednn, dtype_of<T>())) return nullptr;
  std::call_once(layer.row_major->once, [&] {
    auto unpack = [](const PackedWeights<T>& p) {
      if constexpr (kIs16Bit<T>) {
        const std::vector<std::uint16_t> bits = unpack16_b(p);
        std::vector<T> out(bits.size());
        for (std::size_t i = 0; i < bits.size(); ++i) out[i].bits = bits[i];
        return out;
      } else {
        return unpack_matrix_b(p);
      }
    };
    typename LayerStorage<T>::RowMajor& c = *layer.row_major;
    c.in = unpack(layer.w_in);
    if (!layer.fused_qkv) c.k = unpack(layer.w_k), c.v = unpack(layer.w_v);
    c.o = unpack(layer.wo);
  });
  const auto& c = *layer.row_major;
  if (&w == &layer.w_in || layer.fused_qkv) return &w == &layer.wo ? c.o.data() : c.in.data();
  return &w == &layer.wo ? c.o.data() : &w == &layer.w_k ? c.k.data() : c.v.data();
}

template void project<float>(const float*, std::int64_t, std::int64_t, std::int64_t, const PackedWeights<float>&,
                             std::int64_t, std::int64_t, const float*, float*, std::int64_t, int, const float*);
template void project<double>(const double*, std::int64_t, std::int64_t, std::int64_t, const PackedWeights<double>&,
                             std::int64_t, std::int64_t, const double*, double*, std::int64_t, int, const double*);
template void project<bfloat16>(const bfloat16*, std::int64_t, std::int64_t, std::int64_t, const PackedWeights<bfloat16>&,
                             std::int64_t, std::int64_t, const bfloat16*, bfloat16*, std::int64_t, int, const bfloat16*);
template void project<float16>(const float16*, std::int64_t, std::int64_t, std::int64_t, const PackedWeights<float16>&,
                             std::int64_t, std::int64_t, const float16*, float16*, std::int64_t, int, const float16*);
template const float* onednn_weights<float>(const LayerStorage<float>&, const MhaOptions&, const PackedWeights<float>&);
template const double* onednn_weights<double>(const LayerStorage<double>&, const MhaOptions&, const PackedWeights<double>&);
template const bfloat16* onednn_weights<bfloat16>(const LayerStorage<bfloat16>&, const MhaOptions&, const PackedWeights<bfloat16>&);
template const float16* onednn_weights<float16>(const LayerStorage<float16>&, const MhaOptions&, const PackedWeights<float16>&);

}  // namespace simdattn::detail

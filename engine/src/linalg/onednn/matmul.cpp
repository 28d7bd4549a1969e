#include "linalg/onednn/matmul.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <algorithm>

#include "linalg/onednn/common.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/error.hpp"

namespace simdattn::detail {
namespace {

using dnnl::memory;
using Dims = memory::dims;

// A matmul's geometry: dtype, M, K, N, ldx, ldw, ldy, bias, threads.
using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, int>;

struct Prim {
  dnnl::matmul mm;
  memory::desc x, w, b, y, scratch;
};

struct Cache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<const Prim>> prims;
};
Cache& cache() {
  static Cache c;
  return c;
}
constexpr std::size_t kCapacity = 256;  // geometries kept; cleared beyond

std::shared_ptr<const Prim> prim_for(const Key& k) {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.prims.find(k);
  if (it != c.prims.end()) return it->second;
  const auto [dti, M, K, N, ldx, ldw, ldy, has_bias, threads] = k;
  const auto dt = static_cast<memory::data_type>(dti);
  auto p = std::make_shared<Prim>();
  p->x = memory::desc(Dims{M, K}, dt, Dims{ldx, 1});
  p->w = memory::desc(Dims{K, N}, dt, Dims{ldw, 1});
  p->y = memory::desc(Dims{M, N}, dt, Dims{ldy, 1});
  if (has_bias) p->b = memory::desc(Dims{1, N}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->x, p->w, p->b, p->y), attr, onednn_engine());
    p->scratch = pd.scratchpad_desc();
    p->mm = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    throw Error("options.backend", std::string("oneDNN could not create the layer's projection matmul (") + e.what() + ")");
  }
  if (c.prims.size() >= kCapacity) c.prims.clear();
  c.prims.emplace(k, p);
  return p;
}

}  // namespace

void onednn_matmul(DType dtype, const void* x, std::int64_t M, std::int64_t K, std::int64_t ldx, const void* w,
                   std::int64_t ldw, std::int64_t N, const float* bias, void* y, std::int64_t ldy, int threads) {
  if (M == 0 || N == 0) return;
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error("options.backend", "the onednn backend's projections take f32 or bf16 layers, got " +
                                       std::string(dtype_name(dtype)));
  const OnednnThreads scope(threads);
  const memory::data_type dt = dtype == DType::f32 ? memory::data_type::f32 : memory::data_type::bf16;
  const auto p = prim_for(Key{static_cast<int>(dt), M, K, N, ldx, ldw, ldy, bias != nullptr, threads});
  const dnnl::engine& eng = onednn_engine();
  dnnl::stream stream(eng);
  std::byte* scratch = thread_buffer<std::byte, scratch::OnednnScratchpad>().get(std::max<std::size_t>(1, p->scratch.get_size()));
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(p->x, eng, const_cast<void*>(x))},
      {DNNL_ARG_WEIGHTS, memory(p->w, eng, const_cast<void*>(w))},
      {DNNL_ARG_DST, memory(p->y, eng, y)},
      {DNNL_ARG_SCRATCHPAD, memory(p->scratch, eng, scratch)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, memory(p->b, eng, const_cast<float*>(bias)));
  p->mm.execute(stream, args);
  stream.wait();
}

}  // namespace simdattn::detail

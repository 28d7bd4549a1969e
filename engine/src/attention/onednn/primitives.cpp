// The onednn backend's primitive cache (primitives.hpp), and what the process's oneDNN takes.
#include "attention/onednn/primitives.hpp"

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/backends.hpp"
#include "linalg/onednn/common.hpp"
#include "simdattn/tensor.hpp"

namespace simdattn::detail {
namespace onednn_attention {
namespace {

using Dims = memory::dims;

constexpr std::size_t kCacheCapacity = 512;  // step geometries kept; the cache is cleared beyond

struct StepKeyHash {
  static void mix(std::uint64_t& h, std::int64_t x) {  // FNV-1a, a field at a time
    h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
  }
  std::size_t operator()(const StepKey& k) const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    for (std::int64_t x : {k.heads, k.kv_heads, k.rows, k.keys, k.D, k.Dv, k.mask_heads, k.mask_rows,
                           std::int64_t{k.scale_bits}, std::int64_t{k.softcap_bits}, std::int64_t{k.threads},
                           static_cast<std::int64_t>(k.dt)})
      mix(h, x);
    for (const ViewStrides& v : {k.q, k.k, k.v, k.out})
      for (std::int64_t x : {v.head, v.row, v.inner}) mix(h, x);
    return static_cast<std::size_t>(h);
  }
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<StepKey, std::shared_ptr<const StepPrims>, StepKeyHash> cache;
  std::atomic<std::uint64_t> created{0};
};

Cache& cache() {
  static Cache instance;
  return instance;
}

// A 4-D view [1, d1, d2, d3] with strides s1, s2, s3. Size-1 dimensions get a stride past the
// view's extent, so oneDNN sees an ordinary outer dimension.
memory::desc view_desc(std::int64_t d1, std::int64_t d2, std::int64_t d3, std::int64_t s1,
                       std::int64_t s2, std::int64_t s3, memory::data_type dt) {
  const std::int64_t extent = 1 + (d1 - 1) * s1 + (d2 - 1) * s2 + (d3 - 1) * s3;
  if (d1 == 1) s1 = extent;
  if (d2 == 1) s2 = extent;
  if (d3 == 1) s3 = extent;
  return memory::desc(Dims{1, d1, d2, d3}, dt, Dims{extent, s1, s2, s3});
}

memory::desc dense_desc(std::int64_t d1, std::int64_t d2, std::int64_t d3,
                        memory::data_type dt = memory::data_type::f32) {
  return memory::desc(Dims{1, d1, d2, d3}, dt, memory::format_tag::abcd);
}

std::shared_ptr<const StepPrims> create_prims(const StepKey& k, const dnnl::engine& eng) {
  const std::int64_t W = k.keys;
  auto p = std::make_shared<StepPrims>();
  p->q = view_desc(k.heads, k.rows, k.D, k.q.head, k.q.row, k.q.inner, k.dt);
  p->kt = view_desc(k.kv_heads, k.D, W, k.k.head, k.k.inner, k.k.row, k.dt);  // K^T: row and inner swap
  p->v = view_desc(k.kv_heads, W, k.Dv, k.v.head, k.v.row, k.v.inner, k.dt);
  p->o = view_desc(k.heads, k.rows, k.Dv, k.out.head, k.out.row, k.out.inner, k.dt);
  p->scores = dense_desc(k.heads, k.rows, W);
  const bool half = k.dt != memory::data_type::f32;
  p->probs = half ? dense_desc(k.heads, k.rows, W, k.dt) : p->scores;
  float scale = 0.f, cap = 0.f;
  std::memcpy(&scale, &k.scale_bits, sizeof scale);
  std::memcpy(&cap, &k.softcap_bits, sizeof cap);

  dnnl::primitive_attr attr, plain;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  plain.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // scores = scale q.k (softcap: cap tanh(q.k scale / cap)), then + mask
  attr.set_output_scales(0, {cap > 0.f ? scale / cap : scale});
  dnnl::post_ops po;
  if (cap > 0.f) {
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_tanh, 0.f, 0.f);
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, cap, 0.f);
  }
  if (k.mask_heads > 0) {
    p->mask = dense_desc(k.mask_heads, k.mask_rows, W);
    p->mask_post_op = po.len();
    po.append_binary(dnnl::algorithm::binary_add, p->mask);
  }
  if (po.len() > 0) attr.set_post_ops(po);
  const dnnl::matmul::primitive_desc qk_pd(dnnl::matmul::desc(p->q, p->kt, p->scores), attr, eng);
  const dnnl::softmax_forward::primitive_desc sm_pd(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, p->scores, 3), plain, eng);
  const dnnl::matmul::primitive_desc pv_pd(dnnl::matmul::desc(p->probs, p->v, p->o), plain, eng);
  if (half) p->round_probs = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p->scores, eng, p->probs, plain));
  p->qk_scratch = qk_pd.scratchpad_desc();
  p->softmax_scratch = sm_pd.scratchpad_desc();
  p->pv_scratch = pv_pd.scratchpad_desc();
  p->qk = dnnl::matmul(qk_pd);
  p->softmax = dnnl::softmax_forward(sm_pd);
  p->pv = dnnl::matmul(pv_pd);
  return p;
}

}  // namespace

std::shared_ptr<const StepPrims> get_prims(const StepKey& key) {
  Cache& o = cache();
  std::lock_guard<std::mutex> lock(o.mutex);
  auto it = o.cache.find(key);
  if (it != o.cache.end()) return it->second;
  if (o.cache.size() >= kCacheCapacity) o.cache.clear();
  auto prims = create_prims(key, onednn_engine());
  o.created.fetch_add(3, std::memory_order_relaxed);
  o.cache.emplace(key, prims);
  return prims;
}

}  // namespace onednn_attention

using dnnl::memory;
using Dims = memory::dims;

bool onednn_takes(DType dtype) noexcept {
  // A matmul of two 2 x 2 operands of the dtype into f32: created only if oneDNN has a kernel.
  auto probe = [](memory::data_type dt) {
    try {
      const memory::desc a(Dims{2, 2}, dt, memory::format_tag::ab), c(Dims{2, 2}, memory::data_type::f32, memory::format_tag::ab);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, a, c), onednn_engine());
      return true;
    } catch (...) {
      return false;
    }
  };
  static const bool bf16 = probe(memory::data_type::bf16), f16 = probe(memory::data_type::f16);
  switch (dtype) {
    case DType::f32: return true;
    case DType::bf16: return bf16;
    case DType::f16: return f16;
    default: return false;
  }
}

std::uint64_t onednn_primitives_created() noexcept {
  return onednn_attention::cache().created.load(std::memory_order_relaxed);
}

}  // namespace simdattn::detail

// The multi-head attention layer's public methods (simdattn/mha.hpp): each enters the call's
// thread scopes and runs the forward of the layer's dtype (layer/forward.cpp) on its storage
// (layer/storage.hpp, built by layer/build.cpp).
#include "simdattn/mha.hpp"

#include <memory>
#include <span>
#include <utility>
#include <variant>

#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/forward.hpp"
#include "layer/storage.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"
#include "simdattn/error.hpp"

namespace simdattn {

// Hidden: the class is exported, its implementation is not.
struct __attribute__((visibility("hidden"))) MultiHeadAttention::Storage {
  detail::AnyLayerStorage layer;
};

namespace {

// fn(layer) on the layer of the storage's dtype, inside the call's scopes: this thread counts as
// busy in the thread budget, and the onednn backend runs on OpenMP's threads.
template <class Fn>
void in_call(const detail::AnyLayerStorage& layer, const MhaOptions& options, Fn&& fn) {
  const detail::CallScope in_use;
  const detail::OpenMpScope threads(options.backend == Backend::onednn);
  std::visit(fn, layer);
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights))}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<double> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights))}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<bfloat16> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights))}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float16> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights))}) {}

MultiHeadAttention::~MultiHeadAttention() = default;
MultiHeadAttention::MultiHeadAttention(MultiHeadAttention&&) noexcept = default;
MultiHeadAttention& MultiHeadAttention::operator=(MultiHeadAttention&&) noexcept = default;

const MhaConfig& MultiHeadAttention::config() const noexcept {
  return std::visit([](const auto& layer) -> const MhaConfig& { return layer.cfg; }, storage_->layer);
}

DType MultiHeadAttention::dtype() const noexcept {
  return std::visit([](const auto& layer) { return layer.dtype; }, storage_->layer);
}

void MultiHeadAttention::forward(const ConstSeqView& query, const SeqView& out, const MhaOptions& options) const {
  in_call(storage_->layer, options, [&](const auto& layer) { detail::self_forward(layer, query, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, const ConstSeqView& key, const ConstSeqView& value,
                                 const SeqView& out, const MhaOptions& options) const {
  in_call(storage_->layer, options,
          [&](const auto& layer) { detail::cross_forward(layer, query, key, value, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, KvCache& cache, const SeqView& out,
                                 const MhaOptions& options) const {
  const detail::CacheRef ref = detail::cache_ref(config(), cache);
  in_call(storage_->layer, options, [&](const auto& layer) { detail::cached_forward(layer, query, ref, out, options); });
}

void MultiHeadAttention::forward_batch(std::span<const DecodeStep> steps, const MhaOptions& options) const {
  in_call(storage_->layer, options, [&](const auto& layer) { detail::batched_forward(layer, steps, options); });
}

void MultiHeadAttention::forward_pool(std::span<const PoolStep> steps, KvPool& pool, std::int64_t layer,
                                      const MhaOptions& options) const {
  detail::PoolState& state = detail::PoolAccess::state(pool);
  in_call(storage_->layer, options,
          [&](const auto& built) { detail::pool_forward(built, steps, state, layer, options); });
}

void MultiHeadAttention::check_step(const PoolStep& step, const KvPool& pool, const MhaOptions& options) const {
  const detail::PoolState& state = detail::PoolAccess::state(pool);
  (void)state.at(step.sequence, "sequence");
  std::visit(
      [&](const auto& layer) {
        detail::check_pool_call(layer, state, options);
        detail::check_pool_step(layer, step);
      },
      storage_->layer);
}

void MultiHeadAttention::check_step(const DecodeStep& step, const MhaOptions& options) const {
  if (step.cache == nullptr) throw Error("cache", "null");
  const detail::CacheRef ref = detail::cache_ref(config(), *step.cache);
  std::visit([&](const auto& layer) { detail::check_cached_step(layer, step.query, ref, step.out, options, step.positions); },
             storage_->layer);
}

}  // namespace simdattn

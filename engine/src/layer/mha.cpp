// The multi-head attention layer's public methods (simdattn/mha.hpp): each enters the call's
// thread scopes and runs the forward of the layer's dtype (layer/forward.cpp) on its storage
// (layer/storage.hpp, built by layer/build.cpp).
#include "simdattn/mha.hpp"

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "layer/cache/kv_cache.hpp"
#include "layer/cache/kv_pool.hpp"
#include "layer/forward.hpp"
#include "layer/mla/mla.hpp"
#include "layer/storage.hpp"
#include "runtime/team.hpp"
#include "runtime/threading.hpp"
#include "runtime/verbose.hpp"
#include "simdattn/error.hpp"

namespace simdattn {

// Hidden: the class is exported, its implementation is not.
struct __attribute__((visibility("hidden"))) MultiHeadAttention::Storage {
  detail::AnyLayerStorage layer;  // an MLA layer's: its configuration alone (no weights)
  std::optional<detail::AnyMlaStorage> mla;
};

namespace {

// What a call's verbose line says besides the attention core's path (runtime/verbose.hpp).
struct CallShape {
  std::string_view op;
  DType kv_dtype;               // the cache's or pool's; the layer's without one
  std::int64_t steps = -1;      // forward_batch / forward_pool: the steps (>= 0)
  std::int64_t tokens = 0;      // their query rows
  const ConstSeqView* query = nullptr;  // the other forwards: the query (and cross-attention's key)
  const ConstSeqView* key = nullptr;
};

void describe(detail::VerboseCall& call, const MultiHeadAttention& mha, const MhaOptions& o, const CallShape& s) {
  const MhaConfig& c = mha.config();
  call.backend = backend_name(o.backend);
  call.dtype = dtype_name(mha.dtype());
  call.kv_dtype = dtype_name(s.kv_dtype);
  if (s.query != nullptr) call.shape("x", detail::verbose_shape({s.query->B, s.query->S, c.d_model}));
  if (s.key != nullptr) call.shape("kv", detail::verbose_shape({s.key->B, s.key->S, c.kdim}));
  if (s.steps >= 0) {
    call.shape("steps", std::to_string(s.steps));
    call.shape("tokens", std::to_string(s.tokens));
  }
  call.shape("heads", std::to_string(c.heads));
  call.shape("kv_heads", std::to_string(c.kv_heads));
  call.shape("head_dim", std::to_string(c.head_dim));
  std::string& opts = call.opts;
  auto add = [&](std::string_view item) {
    if (!opts.empty()) opts += ',';
    opts += item;
  };
  if (o.causal != Causal::none) add("causal:" + std::string(causal_name(o.causal)));
  else if (c.causal) add("causal:config");
  if (!o.key_padding_mask.empty()) add("key_padding_mask");
  if (o.attn_mask.data != nullptr) add("attn_mask");
  if (!o.positions.empty()) add("positions");
  if (o.attn_weights.data != nullptr) add("attn_weights");
  if (c.rope) add("rope");
  if (!c.q_norm.empty()) add("qk_norm");
  if (c.output_gate) add("output_gate");
}

// fn(layer) on the layer of the storage's dtype, inside the call's scopes: this thread counts as
// busy in the thread budget, and the onednn backend runs on OpenMP's threads. With verbose mode
// on, the call's line (its attention core's calls give it their paths and write none).
template <class Fn>
void in_call(const MultiHeadAttention& mha, const detail::AnyLayerStorage& layer, const MhaOptions& options,
             const CallShape& shape, Fn&& fn) {
  detail::verbose_entry(shape.op, [&](detail::VerboseCall* verbose) {
    if (verbose != nullptr) describe(*verbose, mha, options, shape);
    const detail::CallScope in_use;
    const detail::OpenMpScope threads(options.backend == Backend::onednn);
    std::visit(fn, layer);
  });
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights)), std::nullopt}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<double> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights)), std::nullopt}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<bfloat16> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights)), std::nullopt}) {}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MhaWeights<float16> weights)
    : storage_(new Storage{detail::build_layer(config, std::move(weights)), std::nullopt}) {}

namespace {

// An MLA layer's storage: its configuration in the layer variant (config(), dtype()), its
// weights beside it.
template <class T>
std::pair<detail::LayerStorage<T>, detail::MlaStorage<T>> mla_parts(const MhaConfig& config, MlaWeights<T>&& weights) {
  detail::MlaStorage<T> built = detail::build_mla(config, std::move(weights));
  detail::LayerStorage<T> shell;
  shell.cfg = built.cfg;
  return {std::move(shell), std::move(built)};
}

// The calls an MLA layer does not run yet.
void refuse_mla(const std::optional<detail::AnyMlaStorage>& mla, const char* what) {
  if (mla)
    throw Error("layer", std::string("an MLA layer (DeepSeek's latent attention) is self-attention: ") + what +
                             " is not supported");
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MlaWeights<float> weights) {
  auto [shell, built] = mla_parts(config, std::move(weights));
  storage_.reset(new Storage{std::move(shell), std::move(built)});
}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MlaWeights<double> weights) {
  auto [shell, built] = mla_parts(config, std::move(weights));
  storage_.reset(new Storage{std::move(shell), std::move(built)});
}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MlaWeights<bfloat16> weights) {
  auto [shell, built] = mla_parts(config, std::move(weights));
  storage_.reset(new Storage{std::move(shell), std::move(built)});
}
MultiHeadAttention::MultiHeadAttention(const MhaConfig& config, MlaWeights<float16> weights) {
  auto [shell, built] = mla_parts(config, std::move(weights));
  storage_.reset(new Storage{std::move(shell), std::move(built)});
}

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
  const CallShape shape{"mha_forward", dtype(), -1, 0, &query};
  if (storage_->mla) {
    in_call(*this, storage_->layer, options, shape, [&](const auto& shell) {
      using T = typename std::decay_t<decltype(shell)>::Element;
      detail::mla_forward(std::get<detail::MlaStorage<T>>(*storage_->mla), query, out, options);
    });
    return;
  }
  in_call(*this, storage_->layer, options, shape,
          [&](const auto& layer) { detail::self_forward(layer, query, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, const ConstSeqView& key, const ConstSeqView& value,
                                 const SeqView& out, const MhaOptions& options) const {
  refuse_mla(storage_->mla, "cross-attention");
  const CallShape shape{"mha_forward_cross", dtype(), -1, 0, &query, &key};
  in_call(*this, storage_->layer, options, shape,
          [&](const auto& layer) { detail::cross_forward(layer, query, key, value, out, options); });
}

void MultiHeadAttention::forward(const ConstSeqView& query, KvCache& cache, const SeqView& out,
                                 const MhaOptions& options) const {
  detail::CacheState& state = detail::cache_of_layer(config(), cache);
  const CallShape shape{"mha_forward_cached", cache.dtype(), -1, 0, &query};
  if (storage_->mla) {
    in_call(*this, storage_->layer, options, shape, [&](const auto& shell) {
      using T = typename std::decay_t<decltype(shell)>::Element;
      detail::mla_cached_forward(std::get<detail::MlaStorage<T>>(*storage_->mla), query, state, out, options);
    });
    return;
  }
  in_call(*this, storage_->layer, options, shape,
          [&](const auto& layer) { detail::cached_forward(layer, query, state, out, options); });
}

void MultiHeadAttention::forward_batch(std::span<const DecodeStep> steps, const MhaOptions& options) const {
  if (storage_->mla) {  // every step checked first, then each over its latent cache in turn
    std::vector<detail::CacheState*> states(steps.size());
    std::visit(
        [&](const auto& built) {
          for (std::size_t i = 0; i < steps.size(); ++i) {
            const DecodeStep& s = steps[i];
            try {
              if (s.cache == nullptr) throw Error("cache", "null");
              states[i] = &detail::cache_of_layer(config(), *s.cache);
              if (!options.positions.empty())
                throw Error("options.positions", "forward_batch takes each step's positions in DecodeStep::positions");
              detail::mla_check_cached_step(built, s.query, *states[i], s.out, options, s.positions);
            } catch (const Error& e) {
              const std::string what = e.what(), arg = e.argument();
              throw Error("steps[" + std::to_string(i) + "]." + arg,
                          what.rfind(arg + ": ", 0) == 0 ? what.substr(arg.size() + 2) : what);
            }
          }
        },
        *storage_->mla);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      MhaOptions o = options;
      o.positions = steps[i].positions;
      forward(steps[i].query, *steps[i].cache, steps[i].out, o);
    }
    return;
  }
  std::int64_t tokens = 0;
  for (const DecodeStep& s : steps) tokens += s.query.B * s.query.S;
  const DType kv = steps.empty() || steps[0].cache == nullptr ? dtype() : steps[0].cache->dtype();
  const CallShape shape{"mha_forward_batch", kv, static_cast<std::int64_t>(steps.size()), tokens};
  in_call(*this, storage_->layer, options, shape,
          [&](const auto& layer) { detail::batched_forward(layer, steps, options); });
}

void MultiHeadAttention::forward_pool(std::span<const PoolStep> steps, KvPool& pool, std::int64_t layer,
                                      const MhaOptions& options) const {
  detail::PoolState& state = detail::PoolAccess::state(pool);
  std::int64_t tokens = 0;
  for (const PoolStep& s : steps) tokens += s.query.S;
  const CallShape shape{"mha_forward_pool", pool.dtype(), static_cast<std::int64_t>(steps.size()), tokens};
  if (storage_->mla) {
    in_call(*this, storage_->layer, options, shape, [&](const auto& shell) {
      using T = typename std::decay_t<decltype(shell)>::Element;
      detail::mla_pool_forward(std::get<detail::MlaStorage<T>>(*storage_->mla), steps, state, layer, options);
    });
    return;
  }
  in_call(*this, storage_->layer, options, shape,
          [&](const auto& built) { detail::pool_forward(built, steps, state, layer, options); });
}

void MultiHeadAttention::check_step(const PoolStep& step, const KvPool& pool, const MhaOptions& options) const {
  const detail::PoolState& state = detail::PoolAccess::state(pool);
  (void)state.at(step.sequence, "sequence");
  if (storage_->mla) {
    std::visit(
        [&](const auto& built) {
          detail::mla_check_pool_call(built, state, options);
          detail::mla_check_pool_step(built, step);
        },
        *storage_->mla);
    return;
  }
  std::visit(
      [&](const auto& layer) {
        detail::check_pool_call(layer, state, options);
        detail::check_pool_step(layer, step);
      },
      storage_->layer);
}

void MultiHeadAttention::check_step(const DecodeStep& step, const MhaOptions& options) const {
  if (step.cache == nullptr) throw Error("cache", "null");
  detail::CacheState& state = detail::cache_of_layer(config(), *step.cache);
  if (storage_->mla) {
    std::visit([&](const auto& built) { detail::mla_check_cached_step(built, step.query, state, step.out, options, step.positions); },
               *storage_->mla);
    return;
  }
  std::visit([&](const auto& layer) { detail::check_cached_step(layer, step.query, state, step.out, options, step.positions); },
             storage_->layer);
}

}  // namespace simdattn

// The C API's paged attention and KV pool (simdattn/simdattn.h) over attention_paged, KvPool and
// MultiHeadAttention::forward_pool, as c_api.cpp does for attention.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "c_api/translate.hpp"
#include "simdattn/error.hpp"
#include "simdattn/kv_pool.hpp"
#include "simdattn/mha.hpp"
#include "simdattn/paged.hpp"
#include "simdattn/pool_scheduler.hpp"
#include "simdattn/simdattn.h"

struct simdattn_kv_pool {
  simdattn::KvPool pool;
};
struct simdattn_pool_scheduler {
  simdattn::PoolScheduler scheduler;
};

namespace {

using namespace simdattn;
using namespace simdattn::c_api;

PagedAttentionOptions paged_options(const simdattn_paged_options* c) {
  PagedAttentionOptions o;
  // C API 1's struct ends before k_scale, C API 3's before tree_mask
  if (const std::optional<simdattn_paged_options> s =
          read_options(c, {offsetof(simdattn_paged_options, k_scale), offsetof(simdattn_paged_options, tree_mask)}, o)) {
    o.query_start = span_of(s->query_start, s->query_start_count, "options.query_start");
    if (s->tree_mask != nullptr) o.tree_mask = {s->tree_mask, s->tree_mask_count};
    else if (s->tree_mask_count != 0) throw Error("tree_mask", "NULL with tree_mask_count " + std::to_string(s->tree_mask_count));
    o.tree_mask_start = span_of(s->tree_mask_start, s->tree_mask_start_count, "tree_mask_start");
    o.lse = optional_view<TensorView>(s->lse, "options.lse");
  }
  return o;
}

// An embedded sequence struct of a step.
// A step struct as PoolStep (its embedded sequences checked).
PoolStep pool_step(const simdattn_pool_step& s, const std::string& name);

template <class View>
View step_seq(const simdattn_seq& s, const std::string& name) {
  if (s.struct_size != sizeof(simdattn_seq))
    throw VersionError{name, "struct_size " + std::to_string(s.struct_size) + ", expected " +
                                 std::to_string(sizeof(simdattn_seq)) + " (set it with simdattn_seq_make)"};
  return seq_of<View>(&s, name.c_str());
}

PoolStep pool_step(const simdattn_pool_step& s, const std::string& name) {
  PoolStep p;
  p.query = step_seq<ConstSeqView>(s.query, name + ".query");
  p.out = step_seq<SeqView>(s.out, name + ".out");
  p.sequence = s.sequence;
  p.positions = span_of(s.positions, s.positions_count, (name + ".positions").c_str());
  p.tree_mask = span_of(s.tree_mask, s.tree_mask_count, (name + ".tree_mask").c_str());
  return p;
}

// C API 4's step struct ended before the tree mask.
constexpr std::size_t kPoolStepV4 = offsetof(simdattn_pool_step, tree_mask);

// Step i of an array whose elements are steps[0].struct_size apart (this header's or C API 4's).
simdattn_pool_step step_at(const simdattn_pool_step* steps, std::size_t i, const std::string& name) {
  (void)checked_options(steps, "steps[0]", {kPoolStepV4});  // its size: this header's or C API 4's
  const std::size_t stride = steps->struct_size >= sizeof(simdattn_pool_step) ? steps->struct_size : kPoolStepV4;
  const auto* p = reinterpret_cast<const simdattn_pool_step*>(reinterpret_cast<const char*>(steps) + i * stride);
  if (p->struct_size != steps->struct_size)
    throw VersionError{name, "struct_size " + std::to_string(p->struct_size) + " differs from steps[0]'s " +
                                 std::to_string(steps->struct_size) + " (every step of an array has one size)"};
  return checked_options(p, name.c_str(), {kPoolStepV4});
}

}  // namespace

extern "C" {

void simdattn_paged_options_init(simdattn_paged_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->struct_size = sizeof *o;
  o->causal = SIMDATTN_CAUSAL_BOTTOM_RIGHT;
  o->window_left = o->window_right = -1;
  o->backend = SIMDATTN_BACKEND_NATIVE;
  o->k_scale = o->v_scale = empty_tensor();
  o->lse = empty_tensor();
}

simdattn_status simdattn_merge_attention_states(const simdattn_tensor* out_a, const simdattn_tensor* lse_a,
                                                const simdattn_tensor* out_b, const simdattn_tensor* lse_b,
                                                const simdattn_tensor* out, const simdattn_tensor* lse) {
  return guarded([&] {
    merge_attention_states(view_of<ConstTensorView>(out_a, "out_a"), view_of<ConstTensorView>(lse_a, "lse_a"),
                           view_of<ConstTensorView>(out_b, "out_b"), view_of<ConstTensorView>(lse_b, "lse_b"),
                           view_of<TensorView>(out, "out"), view_of<TensorView>(lse, "lse"));
  });
}

simdattn_status simdattn_attention_paged(const simdattn_tensor* q, const simdattn_tensor* k_cache,
                                         const simdattn_tensor* v_cache, const int32_t* block_table,
                                         int64_t num_sequences, int64_t max_blocks, const int64_t* seq_lens,
                                         const simdattn_tensor* out, const simdattn_paged_options* options) {
  return guarded([&] {
    const PagedAttentionOptions o = paged_options(options);
    if (num_sequences < 0) throw Error("num_sequences", "expected >= 0, got " + std::to_string(num_sequences));
    const std::span<const std::int64_t> lens = span_of(seq_lens, static_cast<std::size_t>(num_sequences), "seq_lens");
    attention_paged(view_of<ConstTensorView>(q, "q"), view_of<ConstTensorView>(k_cache, "k_cache"),
                    view_of<ConstTensorView>(v_cache, "v_cache"), BlockTable{block_table, num_sequences, max_blocks, max_blocks},
                    lens, view_of<TensorView>(out, "out"), o);
  });
}

simdattn_status simdattn_kv_pool_create(const simdattn_mha* layer, int64_t num_blocks, int64_t block_size,
                                        int64_t layers, simdattn_dtype dtype, simdattn_kv_pool** pool) {
  if (pool != nullptr) *pool = nullptr;
  return guarded([&] {
    require(pool, "pool");
    require(layer, "layer");
    *pool = new simdattn_kv_pool{KvPool(layer->layer, num_blocks, block_size == 0 ? kDefaultBlockSize : block_size,
                                        layers, dtype_of_c(dtype, "dtype"))};
  });
}

void simdattn_kv_pool_free(simdattn_kv_pool* pool) { delete pool; }

simdattn_status simdattn_kv_pool_add(simdattn_kv_pool* pool, int64_t* sequence) {
  return guarded([&] {
    require(pool, "pool");
    require(sequence, "sequence");
    *sequence = pool->pool.add();
  });
}

simdattn_status simdattn_kv_pool_fork(simdattn_kv_pool* pool, int64_t parent, int64_t* sequence) {
  return guarded([&] {
    require(pool, "pool");
    require(sequence, "sequence");
    *sequence = pool->pool.fork(parent);
  });
}

simdattn_status simdattn_kv_pool_truncate(simdattn_kv_pool* pool, int64_t sequence, int64_t length) {
  return guarded([&] {
    require(pool, "pool");
    pool->pool.truncate(sequence, length);
  });
}

simdattn_status simdattn_kv_pool_release(simdattn_kv_pool* pool, int64_t sequence) {
  return guarded([&] {
    require(pool, "pool");
    pool->pool.release(sequence);
  });
}

simdattn_status simdattn_kv_pool_accept(simdattn_kv_pool* pool, int64_t seq, int64_t first, const int64_t* kept,
                                        size_t kept_count) {
  return guarded([&] {
    require(pool, "pool");
    pool->pool.accept(seq, first, span_of(kept, kept_count, "kept"));
  });
}

simdattn_status simdattn_kv_pool_length(const simdattn_kv_pool* pool, int64_t sequence, int64_t* length) {
  return guarded([&] {
    require(pool, "pool");
    require(length, "length");
    *length = pool->pool.length(sequence);
  });
}

simdattn_status simdattn_kv_pool_free_blocks(const simdattn_kv_pool* pool, int64_t* free_blocks) {
  return guarded([&] {
    require(pool, "pool");
    require(free_blocks, "free_blocks");
    *free_blocks = pool->pool.free_blocks();
  });
}

simdattn_status simdattn_kv_pool_bytes_per_token(const simdattn_kv_pool* pool, int64_t* bytes) {
  return guarded([&] {
    require(pool, "pool");
    require(bytes, "bytes");
    *bytes = pool->pool.bytes_per_token();
  });
}

void simdattn_pool_step_init(simdattn_pool_step* step) {
  if (step == nullptr) return;
  std::memset(step, 0, sizeof *step);
  step->struct_size = sizeof *step;
  step->query.struct_size = sizeof(simdattn_seq);
  step->out.struct_size = sizeof(simdattn_seq);
  step->sequence = -1;
}

simdattn_status simdattn_mha_forward_pool(const simdattn_mha* layer, const simdattn_pool_step* steps, size_t count,
                                          simdattn_kv_pool* pool, int64_t layer_index,
                                          const simdattn_mha_options* options) {
  return guarded([&] {
    require(layer, "layer");
    require(pool, "pool");
    if (count > 0) require(steps, "steps");
    std::vector<simdattn_pool_step> in(count);
    std::vector<PoolStep> cpp(count);
    for (std::size_t i = 0; i < count; ++i) {
      const std::string name = "steps[" + std::to_string(i) + "]";
      in[i] = step_at(steps, i, name);
      cpp[i] = pool_step(in[i], name);
    }
    layer->layer.forward_pool(cpp, pool->pool, layer_index, mha_options(options));
  });
}

simdattn_status simdattn_pool_scheduler_create(const simdattn_mha* layer, simdattn_kv_pool* pool, int64_t token_budget,
                                               int threads, simdattn_pool_scheduler** scheduler) {
  if (scheduler != nullptr) *scheduler = nullptr;
  return guarded([&] {
    require(scheduler, "scheduler");
    require(layer, "layer");
    require(pool, "pool");
    PoolSchedulerOptions o;
    if (token_budget != 0) o.token_budget = token_budget;
    o.threads = threads;
    *scheduler = new simdattn_pool_scheduler{PoolScheduler(layer->layer, pool->pool, o)};
  });
}

void simdattn_pool_scheduler_free(simdattn_pool_scheduler* scheduler) { delete scheduler; }

simdattn_status simdattn_pool_scheduler_open(simdattn_pool_scheduler* scheduler, int64_t prefix, int64_t* sequence) {
  return guarded([&] {
    require(scheduler, "scheduler");
    require(sequence, "sequence");
    *sequence = prefix < 0 ? scheduler->scheduler.open() : scheduler->scheduler.open(prefix);
  });
}

simdattn_status simdattn_pool_scheduler_close(simdattn_pool_scheduler* scheduler, int64_t sequence) {
  return guarded([&] {
    require(scheduler, "scheduler");
    scheduler->scheduler.close(sequence);
  });
}

simdattn_status simdattn_pool_scheduler_step(simdattn_pool_scheduler* scheduler, const simdattn_pool_step* step) {
  return guarded([&] {
    require(scheduler, "scheduler");
    const simdattn_pool_step s = checked_options(step, "step", {kPoolStepV4});
    scheduler->scheduler.step(pool_step(s, "step"));
  });
}

simdattn_status simdattn_pool_scheduler_accept(simdattn_pool_scheduler* scheduler, int64_t sequence, int64_t first,
                                               const int64_t* kept, size_t count) {
  return guarded([&] {
    require(scheduler, "scheduler");
    scheduler->scheduler.accept(sequence, first, span_of(kept, count, "kept"));
  });
}

simdattn_status simdattn_pool_scheduler_length(const simdattn_pool_scheduler* scheduler, int64_t sequence,
                                               int64_t* length) {
  return guarded([&] {
    require(scheduler, "scheduler");
    require(length, "length");
    *length = scheduler->scheduler.length(sequence);
  });
}

}  // extern "C"

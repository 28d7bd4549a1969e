// ShardedKvCache: one sequence's K/V spread over the ranks (simdattn/mpi.hpp).
#include <algorithm>
#include <cstring>
#include <string>

#include "core/text.hpp"
#include "distributed/comm.hpp"
#include "distributed/options.hpp"
#include "distributed/partial.hpp"

namespace simdattn::mpi {

namespace {

using detail::mpi::Outcome;
using detail::mpi::Shared;
using detail::num;

// Rows [from, from + count) of a [1, Hkv, T, W] view copied to positions at.. of a
// [1, Hkv, capacity, W] store.
void store_rows(const ConstTensorView& t, std::int64_t from, std::int64_t count, unsigned char* store,
                std::int64_t capacity, std::int64_t at) {
  const auto esz = static_cast<std::int64_t>(dtype_size(t.dtype));
  const std::int64_t W = t.shape[3];
  const auto* src = static_cast<const unsigned char*>(t.data);
  for (std::int64_t h = 0; h < t.shape[1]; ++h)
    for (std::int64_t i = 0; i < count; ++i) {
      unsigned char* dst = store + ((h * capacity + at + i) * W) * esz;
      const unsigned char* row = src + (h * t.strides[1] + (from + i) * t.strides[2]) * esz;
      for (std::int64_t d = 0; d < W; ++d) std::memcpy(dst + d * esz, row + d * t.strides[3] * esz, static_cast<std::size_t>(esz));
    }
}

}  // namespace

ShardedKvCache::ShardedKvCache(MPI_Comm comm, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t v_head_dim,
                               std::int64_t capacity_per_rank, DType dtype)
    : kv_heads_(kv_heads), head_dim_(head_dim), v_head_dim_(v_head_dim), capacity_(capacity_per_rank), dtype_(dtype) {
  using namespace detail::mpi;
  ErrorsReturn errors_return(comm);
  Shared shared;
  shared.add("kv_heads", kv_heads);
  shared.add("head_dim", head_dim);
  shared.add("v_head_dim", v_head_dim);
  shared.add("capacity_per_rank", capacity_per_rank);
  shared.add("dtype", static_cast<std::int64_t>(dtype));
  const Outcome outcome = outcome_of([&] {
    if (kv_heads < 1) throw Error("kv_heads", "expected >= 1, got " + num(kv_heads));
    if (head_dim < 1) throw Error("head_dim", "expected >= 1, got " + num(head_dim));
    if (v_head_dim < 1) throw Error("v_head_dim", "expected >= 1, got " + num(v_head_dim));
    if (capacity_per_rank < 0) throw Error("capacity_per_rank", "expected >= 0, got " + num(capacity_per_rank));
    if (dtype != DType::f32 && dtype != DType::f64 && dtype != DType::bf16 && dtype != DType::f16 && !is_kv_code(dtype))
      throw Error("dtype", "expected f32, f64, bf16, f16, int8, fp8_e4m3 or fp8_e5m2, got " + std::string(dtype_name(dtype)));
    const auto esz = static_cast<std::size_t>(dtype_size(dtype));
    k_.resize(static_cast<std::size_t>(kv_heads * capacity_per_rank * head_dim) * esz);
    v_.resize(static_cast<std::size_t>(kv_heads * capacity_per_rank * v_head_dim) * esz);
    if (is_kv_code(dtype)) {  // one f32 scale per (kv head, token) row
      k_scale_.resize(static_cast<std::size_t>(kv_heads * capacity_per_rank));
      v_scale_.resize(static_cast<std::size_t>(kv_heads * capacity_per_rank));
    }
  });
  agree(comm, outcome, shared);
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  rank_ = rank_of(comm_);
  ranks_ = size_of(comm_);
  const int rc = MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm_);
    check(rc, "MPI_Comm_set_errhandler");
  }
}

ShardedKvCache::~ShardedKvCache() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::int64_t ShardedKvCache::local_size() const noexcept {
  return std::clamp<std::int64_t>(size_ - rank_ * capacity_, 0, capacity_);
}

void ShardedKvCache::append(const ConstTensorView& k, const ConstTensorView& v) {
  using namespace detail::mpi;
  Shared shared;
  shared.add("k.shape[0]", k.shape[0]);
  shared.add("k.shape[1]", k.shape[1]);
  shared.add("k.shape[2]", k.shape[2]);
  shared.add("k.shape[3]", k.shape[3]);
  shared.add("v.shape[2]", v.shape[2]);
  shared.add("v.shape[3]", v.shape[3]);
  const std::int64_t T = k.shape[2];
  const bool codes = is_kv_code(dtype_);
  // This rank's positions among the new ones.
  const std::int64_t lo = std::max(size_, rank_ * capacity_), hi = std::min(size_ + T, (rank_ + 1) * capacity_);
  const Outcome outcome = outcome_of([&] {
    const Shape4 ks{1, kv_heads_, T, head_dim_}, vs{1, kv_heads_, T, v_head_dim_};
    auto check_dtype = [&](const ConstTensorView& t, const char* name) {
      const bool floating = t.dtype == DType::f32 || t.dtype == DType::f64 || t.dtype == DType::bf16 || t.dtype == DType::f16;
      if (codes && !floating)
        throw Error(name, "expected f32, f64, bf16 or f16 values to quantize into the cache's " +
                              std::string(dtype_name(dtype_)) + " codes, got " + std::string(dtype_name(t.dtype)));
      if (!codes && t.dtype != dtype_)
        throw Error(name, "expected dtype " + std::string(dtype_name(dtype_)) + " (the cache's), got " +
                              std::string(dtype_name(t.dtype)));
    };
    check_dtype(k, "k");
    check_dtype(v, "v");
    if (k.shape != ks) throw Error("k", "expected shape " + shape_text(ks) + ", got " + shape_text(k.shape));
    if (v.shape != vs) throw Error("v", "expected shape " + shape_text(vs) + ", got " + shape_text(v.shape));
    if (T > 0 && (k.data == nullptr || v.data == nullptr)) throw Error(k.data == nullptr ? "k" : "v", "is empty");
    if (T > std::int64_t{ranks_} * capacity_ - size_)
      throw Error("k", num(T) + " tokens do not fit: the cache holds " + num(size_) + " of at most " +
                           num(std::int64_t{ranks_} * capacity_) + " (" + num(ranks_) + " ranks x " + num(capacity_) + ")");
    // 8-bit: this rank's rows quantized here, so that a row quantize_kv refuses (NaN, infinity) is
    // an Error every rank hears of; they land past size(), which moves only once all agree.
    if (codes && hi > lo) {
      quantize_kv(slice_seq(k, lo - size_, hi - lo), dtype_, code_rows(k_, head_dim_, lo - rank_ * capacity_, hi - lo),
                  scale_rows(k_scale_, lo - rank_ * capacity_, hi - lo));
      quantize_kv(slice_seq(v, lo - size_, hi - lo), dtype_, code_rows(v_, v_head_dim_, lo - rank_ * capacity_, hi - lo),
                  scale_rows(v_scale_, lo - rank_ * capacity_, hi - lo));
    }
  });
  agree(comm_, outcome, shared);
  if (!codes && hi > lo) {
    store_rows(k, lo - size_, hi - lo, k_.data(), capacity_, lo - rank_ * capacity_);
    store_rows(v, lo - size_, hi - lo, v_.data(), capacity_, lo - rank_ * capacity_);
  }
  size_ += T;
}

TensorView ShardedKvCache::code_rows(std::vector<unsigned char>& store, std::int64_t width, std::int64_t at,
                                     std::int64_t count) {
  return TensorView(store.data() + at * width, dtype_, {1, kv_heads_, count, width},
                    {kv_heads_ * capacity_ * width, capacity_ * width, width, 1});
}

TensorView ShardedKvCache::scale_rows(std::vector<float>& scales, std::int64_t at, std::int64_t count) {
  return TensorView(scales.data() + at, DType::f32, {1, kv_heads_, count, 1}, {kv_heads_ * capacity_, capacity_, 1, 1});
}

void ShardedKvCache::attend(const ConstTensorView& q, const TensorView& out, const AttentionOptions& options) {
  const std::int64_t n = local_size();
  const ConstTensorView k(k_.data(), dtype_, {1, kv_heads_, n, head_dim_},
                          {kv_heads_ * capacity_ * head_dim_, capacity_ * head_dim_, head_dim_, 1});
  const ConstTensorView v(v_.data(), dtype_, {1, kv_heads_, n, v_head_dim_},
                          {kv_heads_ * capacity_ * v_head_dim_, capacity_ * v_head_dim_, v_head_dim_, 1});
  const TokenRange mine{rank_ * capacity_, n};
  ShardOptions shard;
  shard.total_keys = size_;
  shard.key_ranges = std::span<const TokenRange>(&mine, n > 0 ? 1 : 0);
  if (!is_kv_code(dtype_)) {
    sharded_attention(comm_, q, k, v, out, options, shard);
    return;
  }
  AttentionOptions o = options;  // the codes' scales: this rank's rows
  o.k_scale = scale_rows(k_scale_, 0, n);
  o.v_scale = scale_rows(v_scale_, 0, n);
  sharded_attention(comm_, q, k, v, out, o, shard);
}

void ShardedKvCache::clear() { size_ = 0; }

}  // namespace simdattn::mpi

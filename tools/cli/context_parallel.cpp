#include "context_parallel.hpp"

#include "args.hpp"
#include "commands.hpp"

#ifdef SIMDATTN_HAVE_MPI
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "simdattn/mpi.hpp"
#endif

namespace simdattn::cli {

#ifndef SIMDATTN_HAVE_MPI

struct ContextParallel::State {};

ContextParallel::ContextParallel(const std::string&) {
  throw UsageError("--context-parallel: this simdattn was built without MPI (SIMDATTN_WITH_MPI=OFF)");
}
ContextParallel::~ContextParallel() = default;
bool ContextParallel::writes() const { return true; }
void ContextParallel::run(const std::function<void()>& body) const { body(); }
void ContextParallel::attention(const ConstTensorView&, const ConstTensorView&, const ConstTensorView&,
                                const TensorView&, const AttentionOptions&) const {}

#else

struct ContextParallel::State {
  mpi::ShardOrder order = mpi::ShardOrder::zigzag;
  bool initialized_here = false;
  int rank = 0, ranks = 1;
  MPI_Comm settle = MPI_COMM_NULL;  // the ranks' meeting after an error (a communicator of its own)
};

namespace {

// How long a rank that failed waits for the others before it exits anyway: they fail together
// (the sharded calls agree on an error before any rank throws), so this bounds only a rank left
// alone, which then ends the run without the others' lines.
constexpr int kSettleSeconds = 20;

// The error's line printed, then every rank's awaited (a non-blocking barrier, polled: never
// longer than kSettleSeconds). Returns whether they all arrived.
bool settle(MPI_Comm comm, std::exception_ptr error, int& status) {
  status = report_error(error);
  std::fflush(stderr);
  MPI_Request request = MPI_REQUEST_NULL;
  if (comm == MPI_COMM_NULL || MPI_Ibarrier(comm, &request) != MPI_SUCCESS) return false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kSettleSeconds);
  for (int done = 0;;) {
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void mpi_check(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw UsageError(std::string("--context-parallel: ") + call + " failed (MPI error " + std::to_string(rc) + ")");
}

// A [B, H, S, W] view's positions `ranges`, one after the other, into a new contiguous buffer.
std::vector<unsigned char> take(const ConstTensorView& t, const std::vector<mpi::TokenRange>& ranges, std::int64_t n) {
  const auto esz = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::vector<unsigned char> out(static_cast<std::size_t>(t.shape[0] * t.shape[1] * n * t.shape[3] * esz));
  unsigned char* dst = out.data();
  const auto* src = static_cast<const unsigned char*>(t.data);
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t h = 0; h < t.shape[1]; ++h)
      for (const mpi::TokenRange& r : ranges)
        for (std::int64_t i = r.start; i < r.start + r.length; ++i)
          for (std::int64_t d = 0; d < t.shape[3]; ++d, dst += esz)
            std::memcpy(dst, src + (b * t.strides[0] + h * t.strides[1] + i * t.strides[2] + d * t.strides[3]) * esz,
                        static_cast<std::size_t>(esz));
  return out;
}

// Each rank's rows [B, H, n_r, W] (contiguous bytes) gathered on rank 0 into `to` at the ranks'
// positions.
void gather_rows(const std::vector<unsigned char>& mine, const TensorView& to, std::int64_t W, std::int64_t esz,
                 std::int64_t total, mpi::ShardOrder order, int rank, int ranks) {
  const std::int64_t BH = to.shape[0] * to.shape[1];
  std::vector<int> counts(static_cast<std::size_t>(ranks)), displs(static_cast<std::size_t>(ranks));
  std::int64_t at = 0;
  for (int r = 0; r < ranks; ++r) {
    const std::int64_t bytes = BH * mpi::shard_length(total, ranks, r, order) * W * esz;
    if (bytes > INT_MAX || at > INT_MAX) throw UsageError("--context-parallel: an output shard over 2 GiB");
    counts[static_cast<std::size_t>(r)] = static_cast<int>(bytes);
    displs[static_cast<std::size_t>(r)] = static_cast<int>(at);
    at += bytes;
  }
  std::vector<unsigned char> all(rank == 0 ? static_cast<std::size_t>(at) : 0);
  mpi_check(MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), counts.data(),
                        displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD),
            "MPI_Gatherv");
  if (rank != 0) return;
  auto* out = static_cast<unsigned char*>(to.data);
  for (int r = 0; r < ranks; ++r) {
    const unsigned char* src = all.data() + displs[static_cast<std::size_t>(r)];
    const auto ranges = mpi::shard_ranges(total, ranks, r, order);
    for (std::int64_t bh = 0; bh < BH; ++bh) {
      const std::int64_t b = bh / to.shape[1], h = bh % to.shape[1];
      for (const mpi::TokenRange& range : ranges)
        for (std::int64_t i = range.start; i < range.start + range.length; ++i)
          for (std::int64_t d = 0; d < W; ++d, src += esz)
            std::memcpy(out + (b * to.strides[0] + h * to.strides[1] + i * to.strides[2] + d * to.strides[3]) * esz,
                        src, static_cast<std::size_t>(esz));
    }
  }
}

}  // namespace

ContextParallel::ContextParallel(const std::string& mode) : state_(std::make_unique<State>()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    state_->initialized_here = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &state_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &state_->ranks);
  if (MPI_Comm_dup(MPI_COMM_WORLD, &state_->settle) != MPI_SUCCESS) state_->settle = MPI_COMM_NULL;
  // checked with MPI up, so that every rank's line of a bad value is printed before any exits
  run([&] {
    if (mode == "zigzag") state_->order = mpi::ShardOrder::zigzag;
    else if (mode == "contiguous") state_->order = mpi::ShardOrder::contiguous;
    else throw UsageError("--context-parallel: expected zigzag or contiguous, got '" + mode + "'");
  });
}

ContextParallel::~ContextParallel() {
  if (!state_) return;
  if (state_->settle != MPI_COMM_NULL) MPI_Comm_free(&state_->settle);
  if (state_->initialized_here) MPI_Finalize();
}

void ContextParallel::run(const std::function<void()>& body) const {
  try {
    body();
  } catch (...) {
    int status = 1;
    if (!settle(state_->settle, std::current_exception(), status))  // a rank left alone: end them all
      MPI_Abort(MPI_COMM_WORLD, status);
    if (state_->settle != MPI_COMM_NULL) MPI_Comm_free(&state_->settle);
    if (state_->initialized_here) MPI_Finalize();
    state_->initialized_here = false;
    throw Reported{status};
  }
}

bool ContextParallel::writes() const { return state_->rank == 0; }

void ContextParallel::attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                                const TensorView& out, const AttentionOptions& options) const {
  const State& s = *state_;
  const std::int64_t Sq = q.shape[2], Sk = k.shape[2];
  const bool ring = options.causal != Causal::none && Sq == Sk && options.mask.empty() && options.key_lengths.empty() &&
                    options.query_offsets.empty();
  if (!ring) {
    const auto ranges = mpi::shard_ranges(Sk, s.ranks, s.rank, s.order);
    const std::int64_t n = mpi::shard_length(Sk, s.ranks, s.rank, s.order);
    const auto kb = take(k, ranges, n), vb = take(v, ranges, n);
    mpi::ShardOptions shard;
    shard.total_keys = Sk;
    shard.key_ranges = ranges;
    shard.root = 0;
    AttentionOptions o = options;
    if (s.rank != 0) o.lse = {};
    mpi::sharded_attention(MPI_COMM_WORLD, q, ConstTensorView(kb.data(), k.dtype, {k.shape[0], k.shape[1], n, k.shape[3]}),
                           ConstTensorView(vb.data(), v.dtype, {v.shape[0], v.shape[1], n, v.shape[3]}),
                           s.rank == 0 ? out : TensorView(), o, shard);
    return;
  }
  const auto ranges = mpi::shard_ranges(Sq, s.ranks, s.rank, s.order);
  const std::int64_t n = mpi::shard_length(Sq, s.ranks, s.rank, s.order);
  const auto qb = take(q, ranges, n), kb = take(k, ranges, n), vb = take(v, ranges, n);
  const std::int64_t B = q.shape[0], H = q.shape[1], Dv = v.shape[3];
  const auto esz = static_cast<std::int64_t>(dtype_size(out.dtype));
  std::vector<unsigned char> ob(static_cast<std::size_t>(B * H * n * Dv * esz));
  std::vector<float> lb(options.lse.empty() ? 0 : static_cast<std::size_t>(B * H * n));
  AttentionOptions o = options;
  if (!options.lse.empty()) o.lse = TensorView(lb.data(), {B, H, n, 1});
  mpi::RingOptions ro;
  ro.total_tokens = Sq;
  ro.order = s.order;
  mpi::ring_attention(MPI_COMM_WORLD, ConstTensorView(qb.data(), q.dtype, {B, H, n, q.shape[3]}),
                      ConstTensorView(kb.data(), k.dtype, {B, k.shape[1], n, k.shape[3]}),
                      ConstTensorView(vb.data(), v.dtype, {B, v.shape[1], n, Dv}),
                      TensorView(ob.data(), out.dtype, {B, H, n, Dv}), o, ro);
  gather_rows(ob, out, Dv, esz, Sq, s.order, s.rank, s.ranks);
  if (!options.lse.empty()) {
    std::vector<unsigned char> lbytes(lb.size() * sizeof(float));
    std::memcpy(lbytes.data(), lb.data(), lbytes.size());
    gather_rows(lbytes, options.lse, 1, sizeof(float), Sq, s.order, s.rank, s.ranks);
  }
}

#endif

}  // namespace simdattn::cli

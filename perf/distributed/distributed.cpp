// simdattn::mpi on one host (perf/distributed/distributed.py runs the grid and the ratios): one mode per run,
// under mpirun -np N, each rank on --threads threads. Rank 0 prints one JSON line per measurement.
//
//   simdattn_mpi_bench ring   [--tokens 16384] [--heads 8] [--kv-heads 8] [--dim 128] [--order zigzag]
//                             [--threads 1] [--reps 3] [--direct]
//       causal self-attention of one sequence, queries/keys/values sharded (ring_attention);
//       --direct (one rank): attention() on the whole sequence instead, the baseline
//   simdattn_mpi_bench decode [--tokens 262144] [--heads 8] [--kv-heads 8] [--dim 128] [--threads 1]
//                             [--reps 20] [--direct]
//       one query over keys sharded contiguously (sharded_attention), every rank getting the output;
//       --direct (one rank): attention() over all keys
//   simdattn_mpi_bench pingpong [--reps 50]
//       ranks 0 and 1: the round trip of messages of 8 B .. 64 MiB (latency and bandwidth)
// Times are the slowest rank's (each repetition starts at a barrier), best and median of --reps.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "simdattn/mpi.hpp"
#include "simdattn/simdattn.hpp"

namespace {

using namespace simdattn;

struct Args {
  std::string mode;
  std::int64_t tokens = -1, heads = 8, kv_heads = 8, dim = 128;
  mpi::ShardOrder order = mpi::ShardOrder::zigzag;
  int threads = 1, reps = -1;
  bool direct = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "simdattn_mpi_bench: %s (see the comment at the top of perf/distributed/distributed.cpp)\n", why.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) usage("expected a mode: ring, decode or pingpong");
  a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--tokens") a.tokens = std::stoll(value());
    else if (f == "--heads") a.heads = std::stoll(value());
    else if (f == "--kv-heads") a.kv_heads = std::stoll(value());
    else if (f == "--dim") a.dim = std::stoll(value());
    else if (f == "--threads") a.threads = std::stoi(value());
    else if (f == "--reps") a.reps = std::stoi(value());
    else if (f == "--direct") a.direct = true;
    else if (f == "--order") {
      const std::string o = value();
      if (o == "zigzag") a.order = mpi::ShardOrder::zigzag;
      else if (o == "contiguous") a.order = mpi::ShardOrder::contiguous;
      else usage("--order: zigzag or contiguous");
    } else usage("unknown option " + f);
  }
  return a;
}

int rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// f, timed on every rank from a common barrier; the slowest rank's seconds.
template <class F>
double timed(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  f();
  double mine = MPI_Wtime() - t0, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

void report(const Args& a, const char* what, std::vector<double> seconds, double flops, double bytes) {
  if (rank() != 0) return;
  std::sort(seconds.begin(), seconds.end());
  const double best = seconds.front(), median = seconds[seconds.size() / 2];
  std::printf("{\"mode\": \"%s\", \"what\": \"%s\", \"ranks\": %d, \"threads\": %d, \"tokens\": %lld, \"heads\": %lld, "
              "\"kv_heads\": %lld, \"dim\": %lld, \"order\": \"%s\", \"direct\": %s, \"best_ms\": %.4f, "
              "\"median_ms\": %.4f, \"gflops\": %.2f, \"gbytes_per_s\": %.2f}\n",
              a.mode.c_str(), what, ranks(), a.threads, static_cast<long long>(a.tokens),
              static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads), static_cast<long long>(a.dim),
              std::string(mpi::shard_order_name(a.order)).c_str(), a.direct ? "true" : "false", best * 1e3,
              median * 1e3, flops / best * 1e-9, bytes / best * 1e-9);
  std::fflush(stdout);
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& e : x) e = d(rng);
  return x;
}

void ring(Args a) {
  if (a.tokens < 0) a.tokens = 16384;
  if (a.reps < 0) a.reps = 3;
  if (a.direct && ranks() != 1) usage("--direct runs on one rank");
  const std::int64_t S = a.tokens, H = a.heads, Hkv = a.kv_heads, D = a.dim;
  const std::int64_t n = a.direct ? S : mpi::shard_length(S, ranks(), rank(), a.order);
  const auto q = random_floats(static_cast<std::size_t>(H * n * D), 1 + static_cast<std::uint64_t>(rank()));
  const auto k = random_floats(static_cast<std::size_t>(Hkv * n * D), 100 + static_cast<std::uint64_t>(rank()));
  const auto v = random_floats(static_cast<std::size_t>(Hkv * n * D), 200 + static_cast<std::uint64_t>(rank()));
  std::vector<float> out(static_cast<std::size_t>(H * n * D));
  AttentionOptions opt;
  opt.causal = Causal::top_left;
  opt.threads = a.threads;
  const ConstTensorView qv(q.data(), {1, H, n, D}), kv(k.data(), {1, Hkv, n, D}), vv(v.data(), {1, Hkv, n, D});
  const TensorView ov(out.data(), {1, H, n, D});
  std::vector<double> seconds;
  for (int r = 0; r < a.reps; ++r)
    seconds.push_back(timed([&] {
      if (a.direct) attention(qv, kv, vv, ov, opt);
      else mpi::ring_attention(MPI_COMM_WORLD, qv, kv, vv, ov, opt, {S, a.order});
    }));
  // causal: half of the 4 S^2 D flops per head
  report(a, a.direct ? "attention" : "ring_attention", seconds, 2.0 * H * double(S) * double(S) * double(D), 0);
}

void decode(Args a) {
  if (a.tokens < 0) a.tokens = 262144;
  if (a.reps < 0) a.reps = 20;
  if (a.direct && ranks() != 1) usage("--direct runs on one rank");
  const std::int64_t S = a.tokens, H = a.heads, Hkv = a.kv_heads, D = a.dim;
  const auto ranges = mpi::shard_ranges(S, ranks(), rank(), mpi::ShardOrder::contiguous);
  const std::int64_t n = a.direct ? S : mpi::shard_length(S, ranks(), rank(), mpi::ShardOrder::contiguous);
  const auto q = random_floats(static_cast<std::size_t>(H * D), 1);
  const auto k = random_floats(static_cast<std::size_t>(Hkv * n * D), 100 + static_cast<std::uint64_t>(rank()));
  const auto v = random_floats(static_cast<std::size_t>(Hkv * n * D), 200 + static_cast<std::uint64_t>(rank()));
  std::vector<float> out(static_cast<std::size_t>(H * D));
  AttentionOptions opt;
  opt.causal = Causal::bottom_right;
  opt.threads = a.threads;
  const ConstTensorView qv(q.data(), {1, H, 1, D}), kv(k.data(), {1, Hkv, n, D}), vv(v.data(), {1, Hkv, n, D});
  const TensorView ov(out.data(), {1, H, 1, D});
  mpi::ShardOptions shard;
  shard.total_keys = S;
  shard.key_ranges = ranges;
  std::vector<double> seconds;
  for (int r = 0; r < a.reps; ++r)
    seconds.push_back(timed([&] {
      if (a.direct) attention(qv, kv, vv, ov, opt);
      else mpi::sharded_attention(MPI_COMM_WORLD, qv, kv, vv, ov, opt, shard);
    }));
  report(a, a.direct ? "attention" : "sharded_attention", seconds, 4.0 * H * double(S) * double(D),
         2.0 * double(Hkv) * double(S) * double(D) * sizeof(float));
}

void pingpong(Args a) {
  if (a.reps < 0) a.reps = 50;
  if (ranks() < 2) usage("pingpong needs 2 ranks");
  const int me = rank();
  for (std::int64_t bytes = 8; bytes <= (std::int64_t{64} << 20); bytes *= (bytes < 4096 ? 8 : 4)) {
    std::vector<unsigned char> buf(static_cast<std::size_t>(bytes), 1);
    std::vector<double> seconds;
    for (int r = 0; r < a.reps + 2; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (me == 0) {
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (me == 1) {
        MPI_Recv(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), static_cast<int>(bytes), MPI_BYTE, 0, 0, MPI_COMM_WORLD);
      }
      if (r >= 2) seconds.push_back((MPI_Wtime() - t0) / 2);  // one way
    }
    if (me == 0) {
      std::sort(seconds.begin(), seconds.end());
      std::printf("{\"mode\": \"pingpong\", \"bytes\": %lld, \"one_way_us\": %.3f, \"median_us\": %.3f, \"gbytes_per_s\": %.3f}\n",
                  static_cast<long long>(bytes), seconds.front() * 1e6, seconds[seconds.size() / 2] * 1e6,
                  double(bytes) / seconds.front() * 1e-9);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const Args a = parse(argc, argv);
  try {
    if (a.mode == "ring") ring(a);
    else if (a.mode == "decode") decode(a);
    else if (a.mode == "pingpong") pingpong(a);
    else usage("unknown mode " + a.mode);
  } catch (const Error& e) {
    std::fprintf(stderr, "simdattn_mpi_bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}

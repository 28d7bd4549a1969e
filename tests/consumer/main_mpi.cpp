// The installed simdattn::mpi from a downstream project: under mpirun -np 2, the keys of one
// call dealt zigzag to the ranks; every rank checks the merged output against attention() on
// all the keys.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <simdattn/mpi.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const std::int64_t H = 2, Sk = 11, D = 4;
  std::vector<float> q(H * D), k(H * Sk * D), v(H * Sk * D), whole(H * D), out(H * D);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(float(i)), v[i] = std::sin(0.3f * float(i));
  simdattn::attention(simdattn::ConstTensorView(q.data(), {1, H, 1, D}), simdattn::ConstTensorView(k.data(), {1, H, Sk, D}),
                      simdattn::ConstTensorView(v.data(), {1, H, Sk, D}), simdattn::TensorView(whole.data(), {1, H, 1, D}));
  const auto ranges = simdattn::mpi::shard_ranges(Sk, ranks, rank, simdattn::mpi::ShardOrder::zigzag);
  std::vector<float> kr, vr;
  for (std::int64_t h = 0; h < H; ++h)
    for (const auto& r : ranges)
      for (std::int64_t j = r.start; j < r.start + r.length; ++j)
        for (std::int64_t d = 0; d < D; ++d) kr.push_back(k[(h * Sk + j) * D + d]), vr.push_back(v[(h * Sk + j) * D + d]);
  const std::int64_t n = simdattn::mpi::shard_length(Sk, ranks, rank, simdattn::mpi::ShardOrder::zigzag);
  simdattn::mpi::ShardOptions shard;
  shard.total_keys = Sk;
  shard.key_ranges = ranges;
  simdattn::mpi::sharded_attention(MPI_COMM_WORLD, simdattn::ConstTensorView(q.data(), {1, H, 1, D}),
                                   simdattn::ConstTensorView(kr.data(), {1, H, n, D}),
                                   simdattn::ConstTensorView(vr.data(), {1, H, n, D}),
                                   simdattn::TensorView(out.data(), {1, H, 1, D}), {}, shard);
  int bad = 0;
  for (std::size_t i = 0; i < out.size(); ++i) bad |= std::fabs(out[i] - whole[i]) > 1e-5f;
  std::printf("consumer_mpi rank %d of %d: %s\n", rank, ranks, bad ? "MISMATCH" : "ok");
  MPI_Finalize();
  return bad;
}

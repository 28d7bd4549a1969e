// The native GEMM on every ISA this CPU supports, against a naive triple loop. Inputs are small
// integers, so every product and sum is exact in any order and results must match bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "linalg/gemm.hpp"
#include "support/simd_test_util.hpp"
#include "support/test_util.hpp"

using namespace simdattn;
using detail::GemmArgs;
using detail::Trans;

namespace {

template <class T>
struct Problem {
  GemmArgs<T> g;
  std::vector<T> a, b, c;
};

// Leading dimensions get `pad` extra elements (odd strides when pad is odd).
template <class T>
Problem<T> make(std::mt19937_64& rng, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                std::int64_t pad, T alpha, T beta) {
  Problem<T> p;
  std::uniform_int_distribution<int> small(-4, 4);
  const std::int64_t a_rows = ta == Trans::N ? M : K, a_cols = ta == Trans::N ? K : M;
  const std::int64_t b_rows = tb == Trans::N ? K : N, b_cols = tb == Trans::N ? N : K;
  p.g.trans_a = ta;
  p.g.trans_b = tb;
  p.g.M = M, p.g.N = N, p.g.K = K;
  p.g.lda = a_cols + pad, p.g.ldb = b_cols + pad, p.g.ldc = N + pad;
  p.a.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, a_rows * p.g.lda)), T(0));
  p.b.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, b_rows * p.g.ldb)), T(0));
  p.c.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, M * p.g.ldc)), T(0));
  for (auto& x : p.a) x = T(small(rng));
  for (auto& x : p.b) x = T(small(rng));
  for (auto& x : p.c) x = beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : T(small(rng));
  p.g.alpha = alpha, p.g.beta = beta;
  p.g.A = p.a.data(), p.g.B = p.b.data(), p.g.C = p.c.data();
  return p;
}

template <class T>
std::vector<T> naive(const Problem<T>& p) {
  const auto& g = p.g;
  std::vector<T> c = p.c;
  for (std::int64_t i = 0; i < g.M; ++i)
    for (std::int64_t j = 0; j < g.N; ++j) {
      T s = 0;
      for (std::int64_t k = 0; k < g.K; ++k) {
        const T a = g.trans_a == Trans::N ? g.A[i * g.lda + k] : g.A[k * g.lda + i];
        const T b = g.trans_b == Trans::N ? g.B[k * g.ldb + j] : g.B[j * g.ldb + k];
        s += a * b;
      }
      T& cij = c[static_cast<std::size_t>(i * g.ldc + j)];
      cij = g.beta == T(0) ? g.alpha * s : g.alpha * s + g.beta * cij;
    }
  return c;
}

template <class T>
void check(const simd::KernelTable& kt, std::mt19937_64& rng, Trans ta, Trans tb, std::int64_t M,
           std::int64_t N, std::int64_t K, std::int64_t pad, T alpha, T beta, int threads) {
  Problem<T> p = make<T>(rng, ta, tb, M, N, K, pad, alpha, beta);
  const std::vector<T> want = naive(p);
  detail::gemm(p.g, threads, &kt);
  bool same = true;  // padding columns are not compared: with beta == 0 they hold NaN
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const auto at = static_cast<std::size_t>(i * p.g.ldc + j);
      if (!(p.c[at] == want[at])) same = false;
    }
  CAPTURE(simd::isa_name(kt.isa));
  CAPTURE_VALUE(M);
  CAPTURE_VALUE(N);
  CAPTURE_VALUE(K);
  CAPTURE(int(ta));
  CAPTURE(int(tb));
  CAPTURE(pad);
  CAPTURE(alpha);
  CAPTURE(beta);
  CAPTURE(threads);
  CHECK(same);
}

}  // namespace

TEST_CASE("gemm: sizes around every tile and block, all layouts, every ISA (f32 and f64)") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 40);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const auto& b32 = kt->gemm_f32.blocking;
    const std::int64_t mr = b32.mr, nr = b32.nr;
    const std::vector<std::int64_t> ms{1, 2, mr - 1, mr, mr + 1, 2 * mr + 3, 127};
    const std::vector<std::int64_t> ns{1, 2, nr - 1, nr, nr + 1, 3 * nr + 5, 257};
    const std::vector<std::int64_t> ks{1, 2, 7, 64, 257};
    int n = 0;
    for (std::int64_t M : ms)
      for (std::int64_t N : ns)
        for (std::int64_t K : ks) {
          const Trans ta = (n & 1) ? Trans::T : Trans::N, tb = (n & 2) ? Trans::T : Trans::N;
          const std::int64_t pad = (n % 3 == 0) ? 0 : (n % 3 == 1 ? 1 : 7);
          const float beta = (n % 4 == 0) ? 0.f : (n % 4 == 1 ? 1.f : -2.f);
          const float alpha = (n % 5 == 0) ? 2.f : 1.f;
          check<float>(*kt, rng, ta, tb, M, N, K, pad, alpha, beta, 1 + n % 3);
          if (n % 3 == 0) check<double>(*kt, rng, ta, tb, M, N, K, pad, double(alpha), double(beta), 1 + n % 2);
          ++n;
        }
  }
}

TEST_CASE("gemm: blocks larger than mc, kc and nc, at 1 and 2 threads") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 41);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const auto& b = kt->gemm_f32.blocking;
    for (Trans ta : {Trans::N, Trans::T})
      for (Trans tb : {Trans::N, Trans::T}) {
        check<float>(*kt, rng, ta, tb, b.mc + 3, 70, b.kc * 2 + 1, 1, 1.f, 0.f, 2);
        check<float>(*kt, rng, ta, tb, 40, b.nc + 33, 33, 0, 1.f, 1.f, 2);
        // few rows, B read in place: passes of kc_b_in_place
        check<float>(*kt, rng, ta, tb, 30, 3 * b.nr + 3, b.kc_b_in_place * 2 + 5, 1, 1.f, -1.f, 1 + (tb == Trans::T));
      }
    const auto& d = kt->gemm_f64.blocking;
    check<double>(*kt, rng, Trans::N, Trans::N, d.mc + 1, d.nc + 1, d.kc + 1, 3, -1.0, 0.5, 2);
  }
}

TEST_CASE("gemm: one block of B, row (or column) chunks claimed by whichever thread is free, every ISA") {
  // K <= kc and N <= nc: each thread packs B once and claims chunks of 4 row tiles; the last
  // chunk (one tile and 5 rows) is short, its last tile too. B packed, A read in place
  // (N <= 128), transposed operands, beta != 0; results exact against the naive loop.
  std::mt19937_64 rng(simdattn::test::base_seed() + 45);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const std::int64_t mr = kt->gemm_f32.blocking.mr;
    const std::int64_t M = mr * 4 * 7 + mr + 5;
    for (int threads : {2, 3}) {
      check<float>(*kt, rng, Trans::N, Trans::N, M, 300, 64, 1, 1.f, 0.f, threads);
      check<float>(*kt, rng, Trans::T, Trans::T, M, 300, 64, 0, 2.f, -1.f, threads);
      check<float>(*kt, rng, Trans::N, Trans::N, M, 100, 500, 3, 1.f, 1.f, threads);
      check<double>(*kt, rng, Trans::N, Trans::T, M, 70, 64, 1, 1.0, 0.0, threads);
      // Few rows (columns split): with B read in place in one pass, A packed once per thread
      // and column chunks claimed (on AVX-512; other ISAs' shorter tiles split these rows).
      check<float>(*kt, rng, Trans::N, Trans::N, 100, 777, 700, 1, 1.f, 0.f, threads);
      check<float>(*kt, rng, Trans::T, Trans::N, 100, 777, 700, 0, 1.f, 1.f, threads);
    }
  }
}

TEST_CASE("gemm: a large C written in one pass, aligned or not, at 1 and 2 threads") {
  // C of 1100 x 2048 f32 (8.6 MiB, one depth pass): the same result on every ISA, with NaN in C
  // beforehand (beta = 0 never reads it), and a partial row tile at the bottom; then the same C
  // one element off 64-byte alignment.
  std::mt19937_64 rng(simdattn::test::base_seed() + 44);
  const std::int64_t M = 1100, N = 2048, K = 70;
  Problem<float> p = make<float>(rng, Trans::N, Trans::N, M, N, K, 0, 2.f, 0.f);
  const std::vector<float> want = naive(p);
  std::vector<float> store(static_cast<std::size_t>(M * N) + 32);
  for (const simd::KernelTable* kt : test::kernel_tables())
    for (int threads : {1, 2})
      for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
        CAPTURE(simd::isa_name(kt->isa));
        CAPTURE(threads);
        CAPTURE(shift);
        float* c = store.data();
        while (reinterpret_cast<std::uintptr_t>(c) % 64 != 0) ++c;
        c += shift;
        std::fill(c, c + M * N, std::numeric_limits<float>::quiet_NaN());
        GemmArgs<float> g = p.g;
        g.C = c;
        detail::gemm(g, threads, kt);
        CHECK(std::equal(c, c + M * N, want.begin()));
      }
  // Few rows (a column split at 2 threads): each thread writes its own columns of C.
  const std::int64_t M2 = 150, N2 = 14080, K2 = 40;
  Problem<float> p2 = make<float>(rng, Trans::N, Trans::N, M2, N2, K2, 0, 1.f, 0.f);
  const std::vector<float> want2 = naive(p2);
  std::vector<float> store2(static_cast<std::size_t>(M2 * N2) + 16);
  float* c2 = store2.data();
  while (reinterpret_cast<std::uintptr_t>(c2) % 64 != 0) ++c2;
  std::fill(c2, c2 + M2 * N2, std::numeric_limits<float>::quiet_NaN());
  GemmArgs<float> g2 = p2.g;
  g2.C = c2;
  detail::gemm(g2, 2);
  CHECK(std::equal(c2, c2 + M2 * N2, want2.begin()));
}

TEST_CASE("gemm: M = 1 (matrix-vector), K = 0, empty, alpha = 0") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 42);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    for (std::int64_t N : {1, 5, 16, 63, 64, 65, 300, 4096})
      for (std::int64_t K : {1, 3, 16, 17, 128})
        for (Trans ta : {Trans::N, Trans::T})
          for (Trans tb : {Trans::N, Trans::T}) {
            check<float>(*kt, rng, ta, tb, 1, N, K, 3, 1.f, 0.f, 2);
            check<double>(*kt, rng, ta, tb, 1, N, K, 0, 2.0, -1.0, 1);
          }
    // K = 0: C = beta * C; beta = 0 gives zeros even over NaN
    check<float>(*kt, rng, Trans::N, Trans::N, 5, 7, 0, 1, 1.f, 0.f, 1);
    check<float>(*kt, rng, Trans::N, Trans::N, 5, 7, 0, 1, 1.f, 3.f, 1);
    check<float>(*kt, rng, Trans::N, Trans::N, 5, 7, 9, 0, 0.f, 2.f, 1);
    // M or N = 0: nothing happens
    check<float>(*kt, rng, Trans::N, Trans::N, 0, 7, 9, 0, 1.f, 0.f, 1);
    check<float>(*kt, rng, Trans::N, Trans::N, 7, 0, 9, 0, 1.f, 0.f, 1);
  }
}

TEST_CASE("gemm: results are bitwise identical for 1, 2, 3 and 7 threads") {
  std::mt19937_64 rng(simdattn::test::base_seed() + 43);
  std::normal_distribution<float> nd;
  // Many rows (split by rows), and few rows with a long K (split by columns into slices that
  // are narrow enough for another kernel, were the slice to choose it).
  // And one block of B (K <= kc), whose row chunks go to whichever thread claims them.
  for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{301, 517, 300}, {16, 256, 1024},
                         {1001, 300, 64}, {1001, 64, 500}, {100, 777, 700}}) {
    std::vector<float> a(M * K), b(K * N);
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = nd(rng);
    std::vector<float> ref;
    for (int t : {1, 2, 3, 7}) {
      std::vector<float> c(M * N);
      GemmArgs<float> g;
      g.M = M, g.N = N, g.K = K, g.A = a.data(), g.lda = K, g.B = b.data(), g.ldb = N, g.C = c.data(), g.ldc = N;
      detail::gemm(g, t);
      if (ref.empty()) ref = c;
      else CHECK(c == ref);
    }
  }
}

TEST_CASE("gemm with a pre-packed B in the deep mode: bitwise identical for 1, 2, 3 and 7 threads") {
  // 7 threads split 400 rows by columns, the others by rows: the deep mode is chosen by the
  // shape alone, so every count sums in the same order.
  std::mt19937_64 rng(test::base_seed() + 44);
  std::normal_distribution<float> nd;
  const std::int64_t kc = simd::kernels().gemm_f32.blocking.kc, M = 400, N = 517, K = 2 * kc;
  std::vector<float> a(M * K), b(K * N), bias(N);
  for (auto& x : a) x = nd(rng);
  for (auto& x : b) x = nd(rng);
  for (auto& x : bias) x = nd(rng);
  const detail::PackedB<float> pb = detail::pack_matrix_b(b.data(), N, K, N);
  for (const float* c_row : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
    std::vector<float> ref;
    for (int t : {1, 2, 3, 7}) {
      std::vector<float> c(M * N);
      GemmArgs<float> g;
      g.M = M, g.N = N, g.K = K, g.A = a.data(), g.lda = K, g.packed_b = &pb, g.C = c.data(), g.ldc = N;
      g.c_row = c_row;
      detail::gemm(g, t);
      if (ref.empty()) ref = c;
      else CHECK(c == ref);
    }
  }
}

TEST_CASE("gemm: c_row starts every row of C as the given row, in every mode, every ISA") {
  std::mt19937_64 rng(test::base_seed() + 92);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const std::int64_t nr = kt->gemm_f32.blocking.nr, kc = kt->gemm_f32.blocking.kc;
    // M = 1 (gemv), K = 0, few rows, rows outer, the deep mode; B pre-packed or not
    for (auto [M, N, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 70, 33}, {5, 7, 0}, {13, 2 * nr + 1, kc + 1},
                           {400, 3 * nr + 5, 2 * kc}, {400, 2 * nr, kc + 3}})
      for (bool prepacked : {false, true})
        for (int threads : {1, 2}) {
          Problem<float> p = make<float>(rng, Trans::N, Trans::N, M, N, K, 1, 2.f, 1.f);
          std::vector<float> row(static_cast<std::size_t>(N));
          for (std::int64_t j = 0; j < N; ++j) row[static_cast<std::size_t>(j)] = float(j % 9) - 4.f;
          for (std::int64_t i = 0; i < M; ++i)  // the naive product adds to C = the row
            std::copy(row.begin(), row.end(), p.c.begin() + i * p.g.ldc);
          const std::vector<float> want = naive(p);
          std::fill(p.c.begin(), p.c.end(), std::numeric_limits<float>::quiet_NaN());  // never read
          GemmArgs<float> g = p.g;
          g.C = p.c.data();
          g.beta = 5.f;  // unused with c_row
          g.c_row = row.data();
          const detail::PackedB<float> pb = detail::pack_matrix_b(p.b.data(), p.g.ldb, K, N, kt);
          if (prepacked) g.B = nullptr, g.packed_b = &pb;
          detail::gemm(g, threads, kt);
          bool same = true;
          for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j)
              if (!(p.c[static_cast<std::size_t>(i * g.ldc + j)] == want[static_cast<std::size_t>(i * g.ldc + j)])) same = false;
          CAPTURE(simd::isa_name(kt->isa));
          CAPTURE_VALUE(M);
          CAPTURE_VALUE(N);
          CAPTURE_VALUE(K);
          CAPTURE(prepacked);
          CAPTURE(threads);
          CHECK(same);
        }
  }
}

namespace {

// gemm over the columns [col, Ntot) of a B pre-packed (for the packed kernels, or for the
// in-place-A kernel) equals the naive product of those columns, bit for bit.
bool prepacked_matches_naive(std::mt19937_64& rng, const simd::KernelTable* kt, std::int64_t M, std::int64_t Ntot,
                             std::int64_t K, std::int64_t col, int threads, float beta, bool a_in_place) {
  Problem<float> p = make<float>(rng, Trans::N, Trans::N, M, Ntot, K, 3, 1.f, beta);
  const detail::PackedB<float> pb = detail::pack_matrix_b(p.b.data(), p.g.ldb, K, Ntot, kt, a_in_place);
  if (a_in_place) CHECK(pb.a_in_place);
  Problem<float> q = p;  // the naive product of the columns [col, Ntot) of B
  q.g.N = Ntot - col;
  q.g.B = p.b.data() + col;
  q.g.A = p.a.data(), q.g.C = q.c.data();
  const std::vector<float> want = naive(q);
  GemmArgs<float> g = q.g;
  g.B = nullptr;
  g.packed_b = &pb, g.b_col = col;
  std::vector<float> c = q.c;
  g.C = c.data();
  detail::gemm(g, threads, kt);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < g.N; ++j)
      if (!(c[static_cast<std::size_t>(i * g.ldc + j)] == want[static_cast<std::size_t>(i * g.ldc + j)])) return false;
  return true;
}

}  // namespace

TEST_CASE("gemm with a pre-packed B: column ranges, depth blocks, M = 1, every ISA, 1 and 2 threads") {
  std::mt19937_64 rng(test::base_seed() + 91);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const std::int64_t nr = kt->gemm_f32.blocking.nr, kc = kt->gemm_f32.blocking.kc;
    for (auto [M, Ntot, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 70, 33}, {1, 3 * nr + 5, kc + 7},
                              {2, nr, 1}, {13, 2 * nr + 1, kc}, {29, 5 * nr - 3, 2 * kc + 3}, {130, 4 * nr, 40},
                              // enough rows for the rows-outer loops (at 1 thread), over several
                              // depth blocks, and over more columns than any block holds
                              {400, 3 * nr + 5, 2 * kc + 3}, {400, 4100, 8},
                              // the deep mode (K a multiple of kc, at least 2 blocks; 384+ rows):
                              // tiles over the whole depth, a short last micro-panel, a narrow
                              // last panel
                              {400, 3 * nr + 5, 2 * kc}, {385, nr, 3 * kc}}) {
      // the whole matrix and a range of panels starting at panel 1
      for (std::int64_t col : {std::int64_t{0}, nr}) {
        if (col >= Ntot) continue;
        const std::int64_t N = Ntot - col;
        for (int threads : {1, 2})
          for (float beta : {0.f, 1.f}) {
            const bool same = prepacked_matches_naive(rng, kt, M, Ntot, K, col, threads, beta, false);
            CAPTURE(simd::isa_name(kt->isa));
            CAPTURE_VALUE(M);
            CAPTURE_VALUE(N);
            CAPTURE_VALUE(K);
            CAPTURE(col);
            CAPTURE(threads);
            CAPTURE(beta);
            CHECK(same);
          }
      }
    }
    // unpacking gives B back, for any depth and width (edges of kc and nr included)
    for (auto [K, N] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {257, 33}, {600, 70}}) {
      std::vector<double> b(static_cast<std::size_t>(K * N));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>(i) * 0.5 - 7.0;
      CHECK(detail::unpack_matrix_b(detail::pack_matrix_b(b.data(), N, K, N, kt)) == b);
    }
    // a pack for another ISA's blocking, or a range past the matrix, is refused
    const std::vector<float> b(64 * 64, 1.f);
    const detail::PackedB<float> pb = detail::pack_matrix_b(b.data(), 64, 64, 64, kt);
    std::vector<float> a(64 * 64, 1.f), c(64 * 64, 0.f);
    GemmArgs<float> g;
    g.M = 4, g.N = 64, g.K = 64, g.A = a.data(), g.lda = 64, g.C = c.data(), g.ldc = 64;
    g.packed_b = &pb, g.b_col = nr;
    CHECK_THROWS_AS(detail::gemm(g, 1, kt), std::logic_error);
    g.b_col = 0, g.K = 63;
    CHECK_THROWS_AS(detail::gemm(g, 1, kt), std::logic_error);
  }
}

TEST_CASE("gemm with a B pre-packed for the in-place-A kernel: any width, column ranges, depth blocks, M = 1, a C written panel by panel, every ISA") {
  std::mt19937_64 rng(test::base_seed() + 93);
  for (const simd::KernelTable* kt : test::kernel_tables()) {
    const std::int64_t nr = kt->gemm_f32.blocking_a_in_place.nr, kc = kt->gemm_f32.blocking_a_in_place.kc;
    CAPTURE(simd::isa_name(kt->isa));
    // wider than the in-place kernel's usual 128 columns, narrower than a vector, past a depth block
    for (auto [M, Ntot, K] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 70, 33}, {2, nr, 1}, {7, 3, 9},
                              {13, 2 * nr + 1, kc + 5}, {29, 5 * nr - 3, 40}, {64, 300, 128}})
      for (std::int64_t col : {std::int64_t{0}, nr}) {
        if (col >= Ntot) continue;
        const std::int64_t N = Ntot - col;
        for (int threads : {1, 2})
          for (float beta : {0.f, 1.f}) {
            const bool same = prepacked_matches_naive(rng, kt, M, Ntot, K, col, threads, beta, true);
            CAPTURE_VALUE(M);
            CAPTURE_VALUE(N);
            CAPTURE_VALUE(K);
            CAPTURE(col);
            CAPTURE(threads);
            CAPTURE(beta);
            CHECK(same);
          }
      }
    // a packed B written as the C of products, a panel (ldc = nr) at a time, then read as B: the
    // same as packing the product's result
    {
      const std::int64_t K = 40, N = 2 * nr + 3, M = 9;
      Problem<float> p = make<float>(rng, Trans::N, Trans::N, K, N, M, 3, 1.f, 0.f);  // C = A B: K x N
      detail::PackedB<float> pb = detail::packed_b_zeros<float>(K, N, kt, true);
      for (std::int64_t j = 0; j < N; j += nr) {
        GemmArgs<float> g = p.g;
        g.N = std::min(nr, N - j), g.B = p.b.data() + j, g.C = const_cast<float*>(pb.panel(j, 0)), g.ldc = nr;
        detail::gemm(g, 1, kt);
      }
      const std::vector<float> want = naive(p);
      std::vector<float> got = detail::unpack_matrix_b(pb);
      bool same = true;
      for (std::int64_t i = 0; i < K; ++i)
        for (std::int64_t j = 0; j < N; ++j)
          if (!(got[static_cast<std::size_t>(i * N + j)] == want[static_cast<std::size_t>(i * p.g.ldc + j)])) same = false;
      CHECK(same);
      for (std::int64_t i = 0; i < K; ++i)  // zeros past N in the last panel
        for (std::int64_t j = N; j < pb.Np; ++j) CHECK(pb.panel(pb.Np - nr, 0)[i * nr + j % nr] == 0.f);
    }
    // an in-place-A pack with A transposed, or against the other blocking, is refused
    const std::vector<float> b(64 * 64, 1.f);
    const detail::PackedB<float> pb = detail::pack_matrix_b(b.data(), 64, 64, 64, kt, true);
    std::vector<float> a(64 * 64, 1.f), c(64 * 64, 0.f);
    GemmArgs<float> g;
    g.M = 4, g.N = 64, g.K = 64, g.A = a.data(), g.lda = 64, g.C = c.data(), g.ldc = 64, g.packed_b = &pb;
    detail::gemm(g, 1, kt);
    CHECK(c[0] == 64.f);
    g.trans_a = Trans::T;
    CHECK_THROWS_AS(detail::gemm(g, 1, kt), std::logic_error);
    detail::PackedB<float> other = pb;
    other.a_in_place = false;
    g.trans_a = Trans::N, g.packed_b = &other;
    if (other.nr != kt->gemm_f32.blocking.nr || other.kc != kt->gemm_f32.blocking.kc) CHECK_THROWS_AS(detail::gemm(g, 1, kt), std::logic_error);
  }
}

#include "linalg/gemm16.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "runtime/threading.hpp"
#include "runtime/workspace.hpp"
#include "simdattn/half.hpp"

namespace simdattn::detail {
namespace {

// The micro-panels of rows [i0, i0 + mc) of A at depth [p0, p0 + kc), mr rows each (zero past
// mc), with the SIMD kernels: f32 values (each row widened, then the f32 transposing pack), or
// bf16 pairs, which are 32-bit words: the same transposing pack moves them as they are (an odd
// row stride or depth, which splits a pair, goes word by word).
void pack_a(const Gemm16Args& g, const simd::KernelTable& kt, const simd::Gemm16Kernels& hk, bool bf16,
            std::int64_t i0, std::int64_t mc, std::int64_t p0, std::int64_t kc, void* Ap) {
  const int mr = hk.mr;
  const simd::VectorKernels<float>& vk = kt.vec<float>();
  const std::int64_t steps = hk.pairs ? (kc + 1) / 2 : kc;
  for (std::int64_t ir = 0; ir < mc; ir += mr) {
    const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
    const std::uint16_t* a0 = g.A + (i0 + ir) * g.lda + p0;
    if (hk.pairs && g.lda % 2 == 0 && p0 % 2 == 0 && kc % 2 == 0 && reinterpret_cast<std::uintptr_t>(a0) % 4 == 0) {
      vk.pack_transpose(reinterpret_cast<const float*>(a0), g.lda / 2, m, steps,
                        static_cast<float*>(Ap) + ir * steps, mr, mr);
    } else if (hk.pairs) {
      auto* dst = static_cast<std::uint32_t*>(Ap) + ir * steps;
      for (std::int64_t r = 0; r < mr; ++r) {
        const std::uint16_t* a = a0 + r * g.lda;
        for (std::int64_t s = 0; s < steps; ++s) {
          const std::uint32_t lo = r < m ? a[2 * s] : 0u, hi = r < m && 2 * s + 1 < kc ? a[2 * s + 1] : 0u;
          dst[s * mr + r] = lo | hi << 16;
        }
      }
    } else {
      float* rows = thread_buffer<float, scratch::GemmWidenedA>().get(static_cast<std::size_t>(mr * kc));
      const simd::Convert16Kernels& cv = bf16 ? kt.convert_bf16 : kt.convert_f16;
      for (std::int64_t r = 0; r < m; ++r) cv.widen(a0 + r * g.lda, rows + r * kc, kc);
      vk.pack_transpose(rows, kc, m, kc, static_cast<float*>(Ap) + ir * steps, mr, mr);
    }
  }
}

// Row tiles per mc block from which a B panel is widened to f32 once and the f32 micro-kernel
// runs on it: the widening then costs one pass over the panel where the 16-bit kernel widens
// each B vector in every row tile (mha/native/gpt-layer.bf16 and gemm/native/*.bf16).
constexpr std::int64_t kWidenBFromTiles = 4;

// Fewest rows that go on AMX tiles (fewer: the vdpbf16ps kernels, on the same packed B).
constexpr std::int64_t kAmxMinRows = 4;

// Rows [i_begin, i_end) by column panels [q_begin, q_end) of C, on this thread's buffers.
void gemm_block(const Gemm16Args& g, const simd::KernelTable& kt, const simd::Gemm16Kernels& hk,
                std::int64_t i_begin, std::int64_t i_end,
                std::int64_t q_begin, std::int64_t q_end) {
  const Packed16& b = *g.B;
  const int mr = hk.mr, nr = hk.nr;
  const std::int64_t mc_max = std::min<std::int64_t>(hk.mc, (i_end - i_begin + mr - 1) / mr * mr);
  const std::int64_t kc_max = std::min<std::int64_t>(hk.kc, g.K) + 1;  // + 1: an odd depth's pair
  float* Ap = thread_buffer<float, scratch::GemmPackedA>().get(static_cast<std::size_t>(mc_max * kc_max));
  float* tile = thread_buffer<float, scratch::GemmPackedB>().get(static_cast<std::size_t>(mr * nr));
  // Tall blocks: B panels widened once and run on the f32 kernel (same tile, same A packing).
  const simd::GemmKernels<float>& fk = kt.gemm_f32;
  const bool widen_b = !hk.pairs && fk.blocking.mr == mr && fk.blocking.nr == nr && mc_max >= kWidenBFromTiles * mr;
  float* bw = widen_b ? thread_buffer<float, scratch::GemmWidenedB>().get(static_cast<std::size_t>(hk.kc * nr)) : nullptr;
  const simd::Convert16Kernels& cv = b.bf16 ? kt.convert_bf16 : kt.convert_f16;
  for (std::int64_t ic = i_begin; ic < i_end; ic += mc_max) {
    const std::int64_t mc = std::min(mc_max, i_end - ic);
    for (std::int64_t pc = 0; pc < g.K; pc += hk.kc) {
      const std::int64_t kc = std::min<std::int64_t>(hk.kc, g.K - pc);
      const std::int64_t panel_words = mr * (hk.pairs ? (kc + 1) / 2 : kc);
      // a packed A is one depth block (gemm16 checked): its tiles from row ic
      const float* ap = g.packed_a != nullptr ? static_cast<const float*>(g.packed_a) + (ic / mr) * panel_words : Ap;
      if (g.packed_a == nullptr) pack_a(g, kt, hk, b.bf16, ic, mc, pc, kc, Ap);
      const float beta = pc == 0 ? g.beta : 1.0f;
      for (std::int64_t q = q_begin; q < q_end; ++q) {
        const std::int64_t j = q * nr, n = std::min<std::int64_t>(nr, g.N - j);
        const std::uint16_t* bp = b.panel(g.b_col + j, pc);
        if (widen_b) cv.widen(bp, bw, kc * nr);  // the panel's kc rows of nr, back to back
        auto run = [&](std::int64_t m, const void* a, float* c, std::int64_t ldc, float bt) {
          if (widen_b) fk.ukernel[m](kc, static_cast<const float*>(a), bw, nr, c, ldc, 1.0f, bt);
          else hk.ukernel[m](kc, a, bp, c, ldc, 1.0f, bt);
        };
        for (std::int64_t ir = 0; ir < mc; ir += mr) {
          const std::int64_t m = std::min<std::int64_t>(mr, mc - ir);
          const void* a = ap + (ir / mr) * panel_words;
          float* c = g.C + (ic + ir) * g.ldc + j;
          if (n == nr) {
            run(m, a, c, g.ldc, beta);
            continue;
          }
          run(m, a, tile, nr, 0.0f);
          for (std::int64_t r = 0; r < m; ++r)
            for (std::int64_t x = 0; x < n; ++x) {
              float& cij = c[r * g.ldc + x];
              cij = beta == 0.0f ? tile[r * nr + x] : tile[r * nr + x] + beta * cij;
            }
        }
      }
    }
  }
}

// AMX: blocks of 32 x 32 of C on tiles (the table's amx_block), A read in place. Threads split
// the row blocks (or, with fewer row blocks than threads, the column panels). Per thread, for
// each chunk of kAmxCols columns and each of its row blocks, depth block by depth block, every
// panel of the chunk: the row block's A at that depth (32 x kc) stays in L1 across the panels,
// the chunk's B (kc x kAmxCols per depth block) in L2 across the row blocks, and the C row block
// (f32, 32 x kAmxCols) in L2 across the depth blocks. beta other than 0 and 1 scales C first.
constexpr std::int64_t kAmxBlock = 32, kAmxCols = 512, kAmxPackFromPanels = 8;

void gemm_amx(const Gemm16Args& g, const simd::Gemm16Kernels& hk, int threads) {
  const Packed16& b = *g.B;
  const std::int64_t mb = (g.M + kAmxBlock - 1) / kAmxBlock, nb = (g.N + kAmxBlock - 1) / kAmxBlock;
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  // Tiles run ~10x the f32 FMA rate: a thread is worth its wake-up at ten times the f32 work.
  const int nt = static_cast<int>(
      std::clamp<double>(std::min<double>(resolve_threads(threads), flops / (10.0 * kMinFlopsPerThread)), 1.0, 1e6));
  const bool split_rows = mb >= nt;
  RegionFailure failure;
  parallel_for(split_rows ? mb : nb, nt, 1, [&](std::int64_t u0, std::int64_t u1) {
    failure.guard([&] {
      const std::int64_t i0 = split_rows ? u0 : 0, i1 = split_rows ? u1 : mb;
      const std::int64_t j0 = split_rows ? 0 : u0, j1 = split_rows ? nb : u1;
      if (g.beta != 0.0f && g.beta != 1.0f)
        for (std::int64_t i = i0 * kAmxBlock; i < std::min(g.M, i1 * kAmxBlock); ++i)
          for (std::int64_t j = j0 * kAmxBlock; j < std::min(g.N, j1 * kAmxBlock); ++j) g.C[i * g.ldc + j] *= g.beta;
      const std::int64_t chunk = kAmxCols / kAmxBlock;
      const std::int64_t kc_tiles = (b.kc + 31) / 32 * 32;
      auto* ap = thread_buffer<std::uint16_t, scratch::GemmAmxA>().get(static_cast<std::size_t>(kAmxBlock * kc_tiles));
      for (std::int64_t jc = j0; jc < j1; jc += chunk)
        for (std::int64_t ib = i0; ib < i1; ++ib) {
          const std::int64_t i = ib * kAmxBlock;
          const int m = static_cast<int>(std::min(kAmxBlock, g.M - i));
          for (std::int64_t p = 0; p < g.K; p += b.kc) {
            const std::int64_t kb = std::min<std::int64_t>(b.kc, g.K - p);
            const std::int64_t jend = std::min(j1, jc + chunk);
            // Packed when reused by enough panels to pay for the copy (measured: a 32 x 1024 A
            // block in place is as fast over 16 panels, its copy a quarter slower over 2), and
            // when the depth ends inside a tile step (nothing past it may be read in place).
            const std::uint16_t* a = g.A + i * g.lda + p;
            const bool pack = jend - jc >= kAmxPackFromPanels || kb % 32 != 0;
            if (pack) hk.amx_pack_a(a, g.lda, m, kb, ap);
            // the chunk's panels in one call
            const std::int64_t j = jc * kAmxBlock;
            const int n = static_cast<int>(std::min(jend * kAmxBlock, g.N) - j);
            const std::int64_t b_stride = b.nr * b.rows(p);
            float* c = g.C + i * g.ldc + j;
            const bool acc = p > 0 || g.beta != 0.0f;
            if (pack) hk.amx_block(kb, ap, 32 * 32, 16 * 32, 64, m, b.panel(g.b_col + j, p), b_stride, n, c, g.ldc, acc);
            else hk.amx_block(kb, a, 32, 16 * g.lda, 2 * g.lda, m, b.panel(g.b_col + j, p), b_stride, n, c, g.ldc, acc);
          }
        }
      hk.amx_done();
    });
  });
  failure.rethrow();
}

}  // namespace

Packed16 packed16_zeros(std::int64_t K, std::int64_t N, bool bf16, const simd::KernelTable* kt, bool pairs) {
  const simd::Gemm16Kernels& hk = gemm16_kernels(kt ? *kt : simd::kernels(), bf16, pairs);
  if (hk.mr == 0 || (pairs && !bf16)) throw std::logic_error("pack16_b: this table has no such kernels");
  Packed16 pb;
  pb.K = K, pb.N = N, pb.nr = hk.nr, pb.kc = hk.kc, pb.pairs = hk.pairs, pb.bf16 = bf16, pb.pair_kernels = pairs;
  pb.k_align = hk.k_align;
  if (hk.kc % pb.k_align != 0) throw std::logic_error("pack16_b: kc is not a multiple of k_align");
  pb.Np = (N + hk.nr - 1) / hk.nr * hk.nr;
  const std::int64_t depth = K <= 0 ? 0 : (K - 1) / hk.kc * hk.kc + pb.rows((K - 1) / hk.kc * hk.kc);
  pb.data.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, depth * pb.Np)), 0);
  return pb;
}

Packed16 pack16_b(const std::uint16_t* B, std::int64_t ldb, std::int64_t K, std::int64_t N, bool bf16,
                       const simd::KernelTable* kt, bool pairs) {
  const simd::Gemm16Kernels& hk = gemm16_kernels(kt ? *kt : simd::kernels(), bf16, pairs);
  Packed16 pb = packed16_zeros(K, N, bf16, kt, pairs);
  for (std::int64_t p = 0; p < K; p += hk.kc) {
    const std::int64_t kc = std::min<std::int64_t>(hk.kc, K - p);
    for (std::int64_t j = 0; j < pb.Np; j += hk.nr) {
      std::uint16_t* dst = const_cast<std::uint16_t*>(pb.panel(j, p));
      for (std::int64_t k = 0; k < kc; ++k)
        for (std::int64_t c = 0; c < hk.nr && j + c < N; ++c) {
          const std::uint16_t v = B[(p + k) * ldb + j + c];
          if (pb.pairs) dst[(k / 2) * 2 * hk.nr + 2 * c + k % 2] = v;
          else dst[k * hk.nr + c] = v;
        }
    }
  }
  return pb;
}

std::vector<std::uint16_t> unpack16_b(const Packed16& pb) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(pb.K * pb.N));
  for (std::int64_t p = 0; p < pb.K; p += pb.kc)
    for (std::int64_t j = 0; j < pb.N; j += pb.nr) {
      const std::uint16_t* panel = pb.panel(j, p);
      for (std::int64_t k = 0; k < std::min<std::int64_t>(pb.kc, pb.K - p); ++k)
        for (std::int64_t c = 0; c < pb.nr && j + c < pb.N; ++c)
          out[static_cast<std::size_t>((p + k) * pb.N + j + c)] =
              pb.pairs ? panel[(k / 2) * 2 * pb.nr + 2 * c + k % 2] : panel[k * pb.nr + c];
    }
  return out;
}

bool pack16_a_fits(std::int64_t M, std::int64_t K, const Packed16& B, const simd::KernelTable* kt) {
  const simd::Gemm16Kernels& hk = gemm16_kernels(kt ? *kt : simd::kernels(), B.bf16, B.pair_kernels);
  return hk.amx_block == nullptr && M >= 1 && M <= hk.mc && K >= 1 && K <= hk.kc;
}

std::int64_t pack16_a_words(std::int64_t M, std::int64_t K, const Packed16& B, const simd::KernelTable* kt) {
  const simd::Gemm16Kernels& hk = gemm16_kernels(kt ? *kt : simd::kernels(), B.bf16, B.pair_kernels);
  return (M + hk.mr - 1) / hk.mr * hk.mr * (hk.pairs ? (K + 1) / 2 : K);
}

void pack16_a(const std::uint16_t* A, std::int64_t lda, std::int64_t M, std::int64_t K, const Packed16& B, void* dst,
              const simd::KernelTable* kt) {
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  if (!pack16_a_fits(M, K, B, &table)) throw std::logic_error("pack16_a: A is not one block of these kernels");
  Gemm16Args g;
  g.M = M, g.K = K, g.A = A, g.lda = lda;
  pack_a(g, table, gemm16_kernels(table, B.bf16, B.pair_kernels), B.bf16, 0, M, 0, K, dst);
}

void gemm16(const Gemm16Args& g, int threads, const simd::KernelTable* kt) {
  if (g.M <= 0 || g.N <= 0) return;
  const simd::KernelTable& table = kt ? *kt : simd::kernels();
  const simd::Gemm16Kernels& hk = gemm16_kernels(table, g.B->bf16, g.B->pair_kernels);
  const Packed16& b = *g.B;
  if (b.nr != hk.nr || b.kc != hk.kc || b.pairs != hk.pairs || b.k_align != hk.k_align ||
      b.K != g.K || g.b_col % b.nr != 0 || g.b_col < 0 || g.b_col + g.N > b.N)
    throw std::logic_error("gemm16: the packed B does not match this call or ISA");
  if (g.packed_a != nullptr && !pack16_a_fits(g.M, g.K, b, &table))
    throw std::logic_error("gemm16: a packed A is one block of these kernels");
  if (g.K <= 0) {  // C = beta * C
    for (std::int64_t i = 0; i < g.M; ++i)
      for (std::int64_t j = 0; j < g.N; ++j) {
        float& c = g.C[i * g.ldc + j];
        c = g.beta == 0.0f ? 0.0f : g.beta * c;
      }
    return;
  }
  const std::int64_t panels = (g.N + hk.nr - 1) / hk.nr, row_tiles = (g.M + hk.mr - 1) / hk.mr;
  if (hk.amx_block != nullptr && g.M >= kAmxMinRows) {
    gemm_amx(g, hk, threads);
    return;
  }
  // A thread is worth its wake-up once it has kMinFlopsPerThread of products, or (few rows:
  // bound by reading B) streams ~256 KiB of B.
  const double flops = 2.0 * double(g.M) * double(g.N) * double(g.K);
  const double bytes = 2.0 * double(g.N) * double(g.K);
  const int nt = static_cast<int>(std::clamp<double>(
      std::min<double>(resolve_threads(threads), std::max(flops / kMinFlopsPerThread, bytes / (256.0 * 1024))), 1.0,
      1e6));
  RegionFailure failure;
  if (row_tiles >= 8 * std::int64_t{nt}) {
    parallel_for(row_tiles, nt, 1, [&](std::int64_t t0, std::int64_t t1) {
      failure.guard([&] { gemm_block(g, table, hk, t0 * hk.mr, std::min(g.M, t1 * hk.mr), 0, panels); });
    });
  } else {
    parallel_for(panels, nt, 1, [&](std::int64_t q0, std::int64_t q1) {
      failure.guard([&] { gemm_block(g, table, hk, 0, g.M, q0, q1); });
    });
  }
  failure.rethrow();
}

}  // namespace simdattn::detail

// The gated delta rule's chunk products on the bf16 pair kernels (gated_delta_pairs.hpp).
#include "linear_attention/gated_delta_pairs.hpp"

#include <algorithm>
#include <cstdint>

#include "simdattn/simd/kernels.hpp"

namespace simdattn::detail {

void gdr_product16(std::int64_t M, std::int64_t N, std::int64_t Kd, const std::uint16_t* A, std::int64_t lda,
                   const void* packed_a, const Packed16* B, std::int64_t b_col, float* C, std::int64_t ldc, float accumulate) {
  Gemm16Args args;
  args.M = M, args.N = N, args.K = Kd, args.A = A, args.lda = lda, args.B = B, args.b_col = b_col;
  args.C = C, args.ldc = ldc, args.beta = accumulate, args.packed_a = packed_a;
  gemm16(args, 1);
}

void gdr_narrow_to_pairs(const PackedB<float>& P, Packed16& Pb, std::int64_t K, std::int64_t j0, std::int64_t j1) {
  const simd::Convert16Kernels& cv = simd::kernels().convert_bf16;
  for (std::int64_t p = 0; p < K; p += Pb.kc)
    for (std::int64_t j = j0; j < j1; j += Pb.nr) {
      const std::int64_t p0 = p - p % P.kc;
      cv.narrow_pairs(P.panel(j - j % P.nr, p0) + (p - p0) * P.nr + j % P.nr, P.nr, std::min<std::int64_t>(Pb.kc, K - p),
                      std::min<std::int64_t>(Pb.nr, j1 - j),
                      reinterpret_cast<std::uint32_t*>(const_cast<std::uint16_t*>(Pb.panel(j, p))), Pb.nr);
    }
}

bool gdr_pairs_fit(const GdrSizes& z) {
  const simd::KernelTable& kt = simd::kernels();
  const simd::Gemm16Kernels& pk = kt.gemm_bf16_pairs;
  const simd::GemmBlocking& fb = kt.gemm_f32.blocking_a_in_place;
  return pk.mr != 0 && fb.nr % pk.nr == 0 && (fb.kc % pk.kc == 0 || z.Dk <= std::min(fb.kc, pk.kc));
}

GdrPairs::GdrPairs(const GdrSizes& z, std::int64_t chunk, std::int64_t ldkt)
    : KQ(static_cast<std::size_t>(2 * chunk * z.Dk)), Kt(static_cast<std::size_t>(z.Dk * ldkt)),
      U(packed16_zeros(chunk, z.Dv, true, nullptr, true)), KtB(packed16_zeros(z.Dk, chunk, true, nullptr, true)),
      KQ_packed(static_cast<std::size_t>(pack16_a_words(2 * chunk, z.Dk, U))),
      Kt_packed(static_cast<std::size_t>(pack16_a_words(z.Dk, chunk, U))) {}

bool GdrPairs::direct(std::int64_t n, std::int64_t Dk, int f32_kc) const {
  return Dk % 2 == 0 && Dk <= f32_kc && pack16_a_fits(2 * n, Dk, U) && pack16_a_fits(Dk, n, U);
}

void GdrPairs::set(const float* K, const float* Kt_f32, std::int64_t n, std::int64_t Dk, std::int64_t ldkt, int f32_kc) {
  const simd::Convert16Kernels& cv = simd::kernels().convert_bf16;
  cv.narrow(K, KQ.data(), 2 * n * Dk);
  KQp = pack16_a_fits(2 * n, Dk, U) ? KQ_packed.data() : nullptr;
  if (KQp != nullptr) pack16_a(KQ.data(), Dk, 2 * n, Dk, U, KQ_packed.data());
  if (Kt_f32 == nullptr) {
    const std::int64_t mr = simd::kernels().gemm_bf16_pairs.mr, steps = (n + 1) / 2;
    for (std::int64_t ir = 0; ir < Dk; ir += mr)
      cv.narrow_pairs(K + ir, Dk, n, std::min(mr, Dk - ir), Kt_packed.data() + ir * steps, mr);
    Ktp = Kt_packed.data();
    return;
  }
  cv.narrow(Kt_f32, Kt.data(), Dk * ldkt);
  Ktp = Dk <= f32_kc && pack16_a_fits(Dk, n, U) ? Kt_packed.data() : nullptr;  // (one depth block of the state)
  if (Ktp != nullptr) pack16_a(Kt.data(), ldkt, Dk, n, U, Kt_packed.data());
}

bool GdrPairs::keys_product(std::int64_t n, std::int64_t Dk, float* KKQK) {
  if (Dk % 2 != 0) return false;
  const simd::VectorKernels<float>& vec = simd::kernels().vec_f32;
  for (std::int64_t p = 0; p < Dk; p += KtB.kc)
    vec.pack_transpose(reinterpret_cast<const float*>(KQ.data() + p), Dk / 2, n, std::min<std::int64_t>(KtB.kc, Dk - p) / 2,
                       reinterpret_cast<float*>(const_cast<std::uint16_t*>(KtB.panel(0, p))), KtB.nr, KtB.nr);
  gdr_product16(2 * n, n, Dk, KQ.data(), Dk, KQp, &KtB, 0, KKQK, n, 0.0f);
  return true;
}

}  // namespace simdattn::detail

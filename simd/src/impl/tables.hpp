// The table builders: one ISA's KernelTable from its GEMM blocking, given by name (GemmParams)
// in kernels_<isa>.cpp, and every kernel of impl/ instantiated for that ISA. The only header
// kernels_<isa>.cpp include.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "impl/batch.hpp"
#include "impl/convert/convert16.hpp"
#include "impl/delta.hpp"
#include "impl/products/gemm16.hpp"
#include "impl/products/gemm_tile.hpp"
#include "impl/products/gemv.hpp"
#include "impl/convert/widen16.hpp"
#include "impl/products/gemv_rows.hpp"
#include "impl/products/pack.hpp"
#include "impl/probe.hpp"
#include "impl/states.hpp"
#include "impl/convert/quant8.hpp"
#include "simdattn/simd/kernels.hpp"
#include "impl/softmax/softmax.hpp"
#include "impl/vector_math.hpp"

namespace simdattn::simd::impl {

// A register tile of C: mr rows by nv vectors.
struct Tile {
  int mr;
  int nv;
};

// One ISA's GEMM blocking for one dtype, as kernels_<isa>.cpp give it (GemmBlocking says what
// each depth and width bounds). Names say which operand is read in place; the table's
// GemmKernels::blocking_a_in_place and ukernel_a_in_place* are the A-in-place ones.
struct GemmParams {
  Tile tile;              // A packed; B packed, pre-packed or read in place
  int mc;                 // rows of A per packed block, columns outer (a multiple of tile.mr)
  int kc;                 // depth of one pass, B packed or pre-packed
  int nc;                 // most columns of B per packed block (a multiple of tile.nv vectors)
  int kc_b_in_place;      // depth of one pass, B read in place
  Tile tile_a_in_place;   // A read in place, B packed (2 tile_a_in_place.mr <= kMaxMr)
  int kc_a_in_place;      // its depth of one pass
};

// t[m] = kernel(std::integral_constant<int, m>{}) for m = 1..Rows: a table indexed by the
// number of rows a kernel computes (entry 0 null).
template <class K, int Rows, class Kernel>
constexpr std::array<K, kMaxMr + 1> rows_table(Kernel kernel) {
  static_assert(Rows <= kMaxMr);
  std::array<K, kMaxMr + 1> t{};
  [&]<int... Ms>(std::integer_sequence<int, Ms...>) {
    ((t[Ms + 1] = kernel(std::integral_constant<int, Ms + 1>{})), ...);
  }(std::make_integer_sequence<int, Rows>{});
  return t;
}

// t[nv][m] = kernel(nv, m) (as integral constants) for nv = 1..NV vectors and m = 1..MR rows;
// one-vector tiles (nv = 1) for m up to 2 MR: MR of them leave the FMA pipes waiting on too few
// accumulator chains (sdcross's 13-key tail panel; guarded by attention/native/sdcross).
template <class K, int MR, int NV, class Kernel>
constexpr std::array<std::array<K, kMaxMr + 1>, kMaxNv + 1> rows_by_width_table(Kernel kernel) {
  static_assert(NV <= kMaxNv);
  std::array<std::array<K, kMaxMr + 1>, kMaxNv + 1> t{};
  [&]<int... Vs>(std::integer_sequence<int, Vs...>) {
    ((t[Vs + 1] = rows_table<K, MR>([&](auto m) { return kernel(std::integral_constant<int, Vs + 1>{}, m); })),
     ...);
  }(std::make_integer_sequence<int, NV>{});
  t[1] = rows_table<K, 2 * MR>([&](auto m) { return kernel(std::integral_constant<int, 1>{}, m); });
  return t;
}

template <class Arch>
ProbeKernels make_probe_kernels() {
  return {.fma_chains = &fma_chains<Arch>,
          .flops_per_iter = 2 * kFmaChains * static_cast<int>(batch<float, Arch>::size)};
}

template <class Arch, class T>
VectorKernels<T> make_vector_kernels() {
  return {.exp = &exp_array<Arch, T>,
          .max = &max_array<Arch, T>,
          .sum = &sum_array<Arch, T>,
          .scale_add_max = &scale_add_max<Arch, T>,
          .exp_sub_max_sum = &exp_sub_max_sum<Arch, T>,
          .scale = &scale_array<Arch, T>,
          .scale_to = &scale_to_array<Arch, T>,
          .pack_transpose = &pack_transpose<Arch, T>,
          .elu1 = &elu1_array<Arch, T>,
          .relu = &relu_array<Arch, T>,
          .softcap_add_max = &softcap_add_max<Arch, T>,
          .softmax_rows = &softmax_rows<Arch, T>,
          .normalize_rows = &normalize_rows<Arch, T>,
          .softmax_cols = &softmax_cols<Arch, T>,
          .normalize_cols = &normalize_cols<Arch, T>};
}

template <class Arch, class T, GemmParams P>
GemmKernels<T> make_gemm_kernels() {
  constexpr int W = static_cast<int>(batch<T, Arch>::size);
  constexpr int MR = P.tile.mr, NV = P.tile.nv;
  constexpr int AMR = P.tile_a_in_place.mr, ANV = P.tile_a_in_place.nv;
  return {
      .blocking = {.mr = MR,
                   .nr = NV * W,
                   .lanes = W,
                   .mc = P.mc,
                   .kc = P.kc,
                   .nc = P.nc,
                   .kc_b_in_place = P.kc_b_in_place},
      .ukernel = rows_table<GemmUkernel<T>, MR>(
          [](auto m) { return &gemm_ukernel<Arch, T, decltype(m)::value, NV, MR>; }),
      .ukernel_b_in_place = rows_table<GemmUkernel<T>, MR>(
          [](auto m) { return &gemm_ukernel_b_in_place<Arch, T, decltype(m)::value, NV, MR>; }),
      .ukernel_pf = rows_table<GemmUkernelPf<T>, MR>(
          [](auto m) { return &gemm_ukernel_pf<Arch, T, decltype(m)::value, NV, MR>; }),
      .ukernel_deep = rows_table<GemmUkernelDeep<T>, MR>(
          [](auto m) { return &gemm_ukernel_deep<Arch, T, decltype(m)::value, NV, MR>; }),
      .blocking_a_in_place = {.mr = AMR,
                          .nr = ANV * W,
                          .lanes = W,
                          .mc = AMR,
                          .kc = P.kc_a_in_place,
                          .nc = P.nc,
                          .kc_b_in_place = P.kc_a_in_place},
      .ukernel_a_in_place = rows_by_width_table<GemmUkernelAInPlace<T>, AMR, ANV>([](auto nv, auto m) {
        return &gemm_ukernel_a_in_place<Arch, T, decltype(m)::value, decltype(nv)::value, ANV>;
      }),
      .ukernel_a_in_place_pf = rows_by_width_table<GemmUkernelAInPlacePf<T>, AMR, ANV>([](auto nv, auto m) {
        return &gemm_ukernel_a_in_place_pf<Arch, T, decltype(m)::value, decltype(nv)::value, ANV>;
      }),
      .gemv_n = &gemv_n<Arch, T>,
      .gemv_t = &gemv_t<Arch, T>,
      .rows = make_rows_kernels<Arch, PlainRows<Arch, T>>()};
}

// The 16-bit-B GEMM in the conversion layout on an MR x NV tile (the f32 GEMM's).
template <class Arch, bool kBf16, GemmParams P>
Gemm16Kernels make_gemm16_kernels() {
  constexpr int W = static_cast<int>(batch<float, Arch>::size);
  constexpr int MR = P.tile.mr, NV = P.tile.nv;
  return {.mr = MR,
          .nr = NV * W,
          .kc = P.kc,
          .mc = P.mc,
          .pairs = false,
          .ukernel = rows_table<Gemm16Ukernel, MR>(
              [](auto m) { return &gemm16_ukernel<Arch, kBf16, decltype(m)::value, MR, NV>; })};
}

template <class Arch, Code8 F>
Quant8Kernels make_quant8_kernels() {
  return {.quantize = &quantize8_rows<Arch, F>,
          .dequantize = &dequantize8_row<Arch, F>,
          .rows = make_rows_kernels<Arch, CodeRows<Arch, F>>()};
}

// The whole table of one ISA; F32 and F64: its GEMM blocking per dtype (F32's also the 16-bit
// GEMM's).
template <class Arch, GemmParams F32, GemmParams F64>
KernelTable make_kernel_table(Isa isa) {
  return {.isa = isa,
          .probe = make_probe_kernels<Arch>(),
          .gemm_f32 = make_gemm_kernels<Arch, float, F32>(),
          .gemm_f64 = make_gemm_kernels<Arch, double, F64>(),
          .vec_f32 = make_vector_kernels<Arch, float>(),
          .vec_f64 = make_vector_kernels<Arch, double>(),
          .rows_bf16 = make_rows_kernels<Arch, HalfRows<Arch, true>>(),
          .rows_f16 = make_rows_kernels<Arch, HalfRows<Arch, false>>(),
          .gemm_bf16 = make_gemm16_kernels<Arch, true, F32>(),
          .gemm_f16 = make_gemm16_kernels<Arch, false, F32>(),
          .gemm_bf16_pairs = {},
          .convert_bf16 = {.widen = &widen16_row<Arch, true>,
                           .narrow = &narrow16_row<Arch, true>,
                           .narrow_pairs = &narrow16_pairs<Arch, true>,
                           .pack_transpose = &pack_transpose16<Arch, true>},
          .convert_f16 = {.widen = &widen16_row<Arch, false>,
                          .narrow = &narrow16_row<Arch, false>,
                          .narrow_pairs = &narrow16_pairs<Arch, false>,
                          .pack_transpose = &pack_transpose16<Arch, false>},
          .quant8 = {make_quant8_kernels<Arch, Code8::int8>(), make_quant8_kernels<Arch, Code8::e4m3>(),
                     make_quant8_kernels<Arch, Code8::e5m2>()},
          .tile_attention = {},
          .tile_attention_pairs = {},
          .delta = {.state_dots = &delta_state_dots<Arch>,
                    .state_update = &delta_state_update<Arch>,
                    .all_finite = &delta_all_finite<Arch>,
                    .all_finite16 = &delta_all_finite16<Arch>,
                    .forward_substitute = &delta_forward_substitute<Arch>,
                    .scale_row = &delta_scale_row<Arch>,
                    .chunk_weights = &delta_chunk_weights<Arch>,
                    .scale_rows = &delta_scale_rows<Arch>,
                    .right_sides = &delta_right_sides<Arch>},
          .states = {.merge_rows = &merge_pair_rows<Arch>}};
}

}  // namespace simdattn::simd::impl

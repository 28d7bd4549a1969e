// Instruction-set selection for the SIMD layer.
//
// The library is built for any x86-64 CPU; each kernel family is compiled once per ISA below and
// the best one the CPU supports is chosen at run time, once. SIMDATTN_ISA=avx512_bf16|avx512|avx2|
// sse2 in the environment forces a lower ISA (for testing and comparison); asking for one the CPU
// lacks is an error reported by selected_isa().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace simdattn::simd {

// avx2 means AVX2 + FMA3 (+ F16C); avx512 means F + BW + DQ + CD; avx512_bf16 is avx512 with
// AVX512-BF16 (vdpbf16ps: bf16 pairs multiplied and summed into f32), which only the bf16 GEMM
// kernels use: every other kernel of its table is avx512's.
enum class Isa { sse2, avx2, avx512, avx512_bf16 };

std::string_view isa_name(Isa isa) noexcept;

// ISAs this CPU and OS support, best first. sse2 is always present on x86-64.
const std::vector<Isa>& available_isas();

// The ISA kernels dispatch to: the best available, or SIMDATTN_ISA if set. Resolved on the
// first call (thread-safe static) and fixed afterwards. Throws std::runtime_error naming
// SIMDATTN_ISA if the variable holds an unknown or unavailable ISA.
Isa selected_isa();

// True if the selection came from SIMDATTN_ISA rather than from detection.
bool isa_forced();

}  // namespace simdattn::simd

// Instruction-set selection for the SIMD layer.
//
// The library is built for any x86-64 CPU; each kernel family is compiled once per ISA below and
// the best one the CPU supports is chosen at run time, once. SIMDATTN_ISA=amx|avx512_bf16|avx512|
// avx2|sse2 in the environment forces a lower ISA (for testing and comparison); asking for one the
// CPU lacks is an error reported by selected_isa().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace simdattn::simd {

// avx2 means AVX2 + FMA3 (+ F16C); avx512 means F + BW + DQ + CD; avx512_bf16 is avx512 with
// AVX512-BF16 (vdpbf16ps: bf16 pairs multiplied and summed into f32), which only the bf16 GEMM
// kernels use: every other kernel of its table is avx512's. amx is avx512_bf16 with AMX-BF16 tiles
// (tdpbf16ps: 16 x 32 by 32 x 16 bf16 into 16 x 16 f32), which the bf16 GEMM runs on; it needs
// the OS's permission for the tile data (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM), asked for once,
// when the ISAs are first detected).
enum class Isa { sse2, avx2, avx512, avx512_bf16, amx };

std::string_view isa_name(Isa isa) noexcept;

// ISAs this CPU and OS support, best first. sse2 is always present on x86-64.
const std::vector<Isa>& available_isas();

// The ISA kernels dispatch to: the best available, or SIMDATTN_ISA if set. Resolved on the
// first call (thread-safe static) and fixed afterwards. Throws std::runtime_error naming
// SIMDATTN_ISA if the variable holds an unknown or unavailable ISA.
Isa selected_isa();

// True if the selection came from SIMDATTN_ISA rather than from detection.
bool isa_forced();

// Whether the bf16 GEMM of the avx512_bf16 level runs on vdpbf16ps (the pair layout) rather than
// widening B to f32 for FMAs: on AMD's cores (Zen 4 and 5) vdpbf16ps does 32 multiply-adds where
// an FMA does 16 at the same rate (measured on Zen 5: the pair kernels 1.5-2.1x the widening ones
// on the GEMM rows, docs/performance.md), on Intel's it issues at a quarter of the FMA rate
// (61 against 122 GMAC/s per core measured on a Sapphire Rapids Xeon). From the CPU's vendor.
bool bf16_pairs_preferred();

// Why an ISA the CPU reports is not available (e.g. "amx: the CPU has AMX-BF16 but Linux refused
// the tile data permission: ..."), one line each; empty when nothing is held back.
const std::vector<std::string>& isa_notes();

}  // namespace simdattn::simd

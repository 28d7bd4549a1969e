#include "simdattn/simd/isa.hpp"

#include <cstdlib>
#include <stdexcept>

#include <xsimd/xsimd.hpp>

namespace simdattn::simd {

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::sse2: return "sse2";
  }
  return "?";
}

const std::vector<Isa>& available_isas() {
  static const std::vector<Isa> isas = [] {
    const auto cpu = xsimd::available_architectures();
    std::vector<Isa> out;
    if (cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512cd) {
      // xsimd 8 does not know AVX512-BF16; the OS's ZMM state is what xsimd checked above.
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx512bf16")) out.push_back(Isa::avx512_bf16);
      out.push_back(Isa::avx512);
    }
    if (cpu.avx2 && cpu.fma3_avx2) out.push_back(Isa::avx2);
    out.push_back(Isa::sse2);
    return out;
  }();
  return isas;
}

namespace {

struct Selection {
  Isa isa;
  bool forced;
};

Selection resolve() {
  const auto& avail = available_isas();
  const char* env = std::getenv("SIMDATTN_ISA");
  if (env == nullptr || *env == '\0') return {avail.front(), false};
  const std::string_view want(env);
  for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2, Isa::sse2}) {
    if (want != isa_name(isa)) continue;
    for (Isa a : avail)
      if (a == isa) return {isa, true};
    throw std::runtime_error("'" + std::string(want) +
                             "' is not supported by this CPU (available: " +
                             std::string(isa_name(avail.front())) + " and below)");
  }
  throw std::runtime_error("unknown ISA '" + std::string(want) +
                           "' (expected avx512_bf16, avx512, avx2 or sse2)");
}

const Selection& selection() {
  static const Selection s = resolve();
  return s;
}

}  // namespace

Isa selected_isa() { return selection().isa; }
bool isa_forced() { return selection().forced; }

}  // namespace simdattn::simd

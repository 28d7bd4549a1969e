#include "simdattn/simd/isa.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <xsimd/xsimd.hpp>

namespace simdattn::simd {

std::string_view isa_name(Isa isa) noexcept {
  switch (isa) {
    case Isa::amx: return "amx";
    case Isa::avx512_bf16: return "avx512_bf16";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::sse2: return "sse2";
  }
  return "?";
}

namespace {

struct Detected {
  std::vector<Isa> isas;
  std::vector<std::string> notes;
};

// AMX-BF16 usable by this process: the CPU has it (CPUID 7.0 EDX: AMX-BF16 bit 22, AMX-TILE bit
// 24), the OS saves the tile state (XCR0 bits 17 and 18) and Linux grants this process the tile
// data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), process-wide, before any tile
// instruction). If the CPU has it but it is not usable, `why` says why.
bool amx_usable(std::string& why) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || ((d >> 22) & 1u) == 0 || ((d >> 24) & 1u) == 0) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3u) != 3u) {
    why = "amx: the CPU has AMX-BF16 but the OS does not enable the tile state (XCR0)";
    return false;
  }
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    why = std::string("amx: the CPU has AMX-BF16 but Linux refused the tile data permission (arch_prctl: ") +
          std::strerror(errno) + ")";
    return false;
  }
  return true;
}

const Detected& detected() {
  static const Detected det = [] {
    const auto cpu = xsimd::available_architectures();
    Detected out;
    if (cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512cd) {
      // xsimd 8 does not know AVX512-BF16 or AMX; the OS's ZMM state is what xsimd checked above.
      __builtin_cpu_init();
      if (__builtin_cpu_supports("avx512bf16")) {
        std::string why;
        if (amx_usable(why)) out.isas.push_back(Isa::amx);
        else if (!why.empty()) out.notes.push_back(why);
        out.isas.push_back(Isa::avx512_bf16);
      }
      out.isas.push_back(Isa::avx512);
    }
    if (cpu.avx2 && cpu.fma3_avx2) out.isas.push_back(Isa::avx2);
    out.isas.push_back(Isa::sse2);
    return out;
  }();
  return det;
}

}  // namespace

const std::vector<Isa>& available_isas() { return detected().isas; }

bool bf16_pairs_preferred() {
  static const bool amd = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    return std::strcmp(vendor, "AuthenticAMD") == 0;
  }();
  return amd;
}

const std::vector<std::string>& isa_notes() { return detected().notes; }

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
  for (Isa isa : {Isa::amx, Isa::avx512_bf16, Isa::avx512, Isa::avx2, Isa::sse2}) {
    if (want != isa_name(isa)) continue;
    for (Isa a : avail)
      if (a == isa) return {isa, true};
    throw std::runtime_error("'" + std::string(want) +
                             "' is not supported by this CPU (available: " +
                             std::string(isa_name(avail.front())) + " and below)");
  }
  throw std::runtime_error("unknown ISA '" + std::string(want) +
                           "' (expected amx, avx512_bf16, avx512, avx2 or sse2)");
}

const Selection& selection() {
  static const Selection s = resolve();
  return s;
}

}  // namespace

Isa selected_isa() { return selection().isa; }
bool isa_forced() { return selection().forced; }

}  // namespace simdattn::simd

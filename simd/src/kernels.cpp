// The kernel family's one dispatch point: the table of each ISA is built once, on first use.
#include "simdattn/simd/kernels.hpp"

namespace simdattn::simd {

KernelTable make_table_amx();
KernelTable make_table_avx512_bf16();
KernelTable make_table_avx512();
KernelTable make_table_avx2();
KernelTable make_table_sse2();

namespace {

bool available(Isa isa) {
  for (Isa a : available_isas())
    if (a == isa) return true;
  return false;
}

}  // namespace

const KernelTable* kernels_for(Isa isa) {
  if (!available(isa)) return nullptr;
  switch (isa) {
    case Isa::amx: {
      static const KernelTable t = make_table_amx();
      return &t;
    }
    case Isa::avx512_bf16: {
      static const KernelTable t = make_table_avx512_bf16();
      return &t;
    }
    case Isa::avx512: {
      static const KernelTable t = make_table_avx512();
      return &t;
    }
    case Isa::avx2: {
      static const KernelTable t = make_table_avx2();
      return &t;
    }
    case Isa::sse2: {
      static const KernelTable t = make_table_sse2();
      return &t;
    }
  }
  return nullptr;
}

const KernelTable& kernels() {
  static const KernelTable& t = *kernels_for(selected_isa());
  return t;
}

}  // namespace simdattn::simd

#!/usr/bin/env bash
# The concurrency tests under ThreadSanitizer: the worker team, concurrent attention() calls,
# concurrent forward and decode steps of one MHA layer, bitwise identity across thread counts
# and the thread budget; the paged attention and the pool scheduler, and the serving soak bounded. Built without the oneDNN backend: oneDNN and OpenMP regions run on
# GCC's libgomp, which is not built for ThreadSanitizer and would report its own barriers (the
# library's own threads are the team, std::thread and std::atomic, which it sees in full).
# The same tests then run again under the openmp thread runtime, built by clang against LLVM's
# libomp (libomp-14-dev) with its Archer tool, which tells ThreadSanitizer about the OpenMP
# runtime's barriers and tasks (libgomp has no such support).
# Exits non-zero on the first race or failed check. Several minutes on 2 cores.
#
#   bash scripts/tsan-check.sh        # build-tsan/ and build-tsan-omp/ (or $SIMDATTN_TSAN_BUILD_DIR{,-omp})
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SIMDATTN_TSAN_BUILD_DIR:-$ROOT/build-tsan}"
BUILD_OMP="${BUILD}-omp"
ARCHER=/usr/lib/llvm-14/lib/libarcher.so
TESTS="team*,concurrent*,native output is bitwise*,parallel_for*,MHA self-attention*,KV cache*,regression: KV cache*,forward_batch*,DecodeScheduler*,PoolScheduler*,attention_paged: f32*"

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMDATTN_SANITIZE=thread \
      -DSIMDATTN_WITH_ONEDNN=OFF -DSIMDATTN_WITH_MPI=OFF -DSIMDATTN_BUILD_PERF=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_PYTHON=OFF \
      -DSIMDATTN_WERROR=ON >/dev/null
cmake --build "$BUILD" --target simdattn_tests simdattn_soak -j "$(nproc)"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" "$BUILD/tests/simdattn_tests" "--test-case=$TESTS"
# the serving soak, bounded: 16 request threads on one PoolScheduler
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" SIMDATTN_SOAK_SECONDS=10 "$BUILD/tests/simdattn_soak"

# the openmp runtime: clang, LLVM's libomp and Archer
if [ ! -f "$ARCHER" ] || ! command -v clang++-14 >/dev/null; then
  echo "tsan-check: the openmp run needs clang++-14 and $ARCHER (apt-get install clang libomp-14-dev)" >&2
  exit 1
fi
CC=clang-14 CXX=clang++-14 cmake -S "$ROOT" -B "$BUILD_OMP" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMDATTN_SANITIZE=thread \
      -DSIMDATTN_WITH_ONEDNN=OFF -DSIMDATTN_WITH_MPI=OFF -DSIMDATTN_BUILD_PERF=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD_OMP" --target simdattn_tests -j "$(nproc)"
# The binary's dynamic section, read without running the loader (ldd runs it, and under pipefail a
# grep -q leaving early can fail the pipeline with SIGPIPE though the library is there)
NEEDED="$(readelf -d "$BUILD_OMP/tests/simdattn_tests" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' | tr '\n' ' ')"
if [[ " $NEEDED" != *" libomp.so"* ]]; then
  echo "tsan-check: $BUILD_OMP/tests/simdattn_tests is not linked to LLVM's libomp (it needs: $NEEDED)" >&2
  exit 1
fi
echo "tsan-check: the openmp build needs $NEEDED"
# Archer says on stderr that it is active (ARCHER_OPTIONS=verbose=1); without it the run proves nothing
LOG="$BUILD_OMP/tsan-openmp.log"
SIMDATTN_THREAD_RUNTIME=openmp OMP_TOOL_LIBRARIES="$ARCHER" ARCHER_OPTIONS=verbose=1 \
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1" \
  "$BUILD_OMP/tests/simdattn_tests" "--test-case=$TESTS,thread runtime*" \
  "--test-case-exclude=concurrent calls from many threads*" 2>&1 | tee "$LOG"  # that case counts the team's workers
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
grep -q "Archer detected OpenMP application with TSan" "$LOG" || { echo "tsan-check: Archer was not active" >&2; exit 1; }
echo "tsan-check: both runtimes clean"

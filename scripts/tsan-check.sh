#!/usr/bin/env bash
# The concurrency tests under ThreadSanitizer: the worker team, concurrent attention() calls,
# concurrent forward and decode steps of one MHA layer, bitwise identity across thread counts
# and the thread budget; the paged attention and the pool scheduler, and the serving soak bounded. Built without the oneDNN backend: oneDNN and OpenMP regions run on
# GCC's libgomp, which is not built for ThreadSanitizer and would report its own barriers (the
# library's own threads are the team, std::thread and std::atomic, which it sees in full).
# Exits non-zero on the first race or failed check. Several minutes on 2 cores.
#
#   bash scripts/tsan-check.sh        # build-tsan/ (or $SIMDATTN_TSAN_BUILD_DIR)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SIMDATTN_TSAN_BUILD_DIR:-$ROOT/build-tsan}"

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMDATTN_SANITIZE=thread \
      -DSIMDATTN_WITH_ONEDNN=OFF -DSIMDATTN_BUILD_PERF=OFF -DSIMDATTN_BUILD_TOOLS=OFF -DSIMDATTN_BUILD_PYTHON=OFF \
      -DSIMDATTN_WERROR=ON >/dev/null
cmake --build "$BUILD" --target simdattn_tests simdattn_soak -j "$(nproc)"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" "$BUILD/tests/simdattn_tests" \
  "--test-case=team*,concurrent*,native output is bitwise*,parallel_for*,MHA self-attention*,KV cache*,regression: KV cache*,forward_batch*,DecodeScheduler*,PoolScheduler*,attention_paged: f32*"
# the serving soak, bounded: 16 request threads on one PoolScheduler
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" SIMDATTN_SOAK_SECONDS=10 "$BUILD/tests/simdattn_soak"

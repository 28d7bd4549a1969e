#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz (the .npy parser, the safetensors and GGUF readers, attention()'s
# validation and kernels, attention_paged() and merge_attention_states(), a KvPool's operations, gated_delta_rule(), the model-directory loader, the command line), built with clang, AddressSanitizer and UBSan in build-fuzz/, each run
# from its committed seed corpus (tests/fuzz/corpus/<target>/; new inputs go to
# build-fuzz/corpus/<target>/, not into the repository). Needs Debian's clang and
# libfuzzer-14-dev. A crash leaves its input in build-fuzz/ and the script fails; every crash
# found becomes a regression test (tests/io/test_npy.cpp, tests/io/test_safetensors.cpp,
# tests/io/test_gguf.cpp, ...).
#
#   bash scripts/fuzz.sh                  # the bounded run: each target a fixed number of runs
#                                         # (kBounded below; about a minute in all)
#   SIMDATTN_FUZZ_RUNS=10000000 bash scripts/fuzz.sh     # the long run, by executions
#   SIMDATTN_FUZZ_SECONDS=3600 bash scripts/fuzz.sh      # ... or by time, per target
#   SIMDATTN_FUZZ_TARGETS="safetensors cli" bash scripts/fuzz.sh   # some targets only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SIMDATTN_FUZZ_BUILD:-$ROOT/build-fuzz}"
RUNS="${SIMDATTN_FUZZ_RUNS:-}"
TARGETS="${SIMDATTN_FUZZ_TARGETS:-npy safetensors gguf attention paged pool linear model_dir cli}"
# The bounded run's executions per target (the slower targets, which write files or build a
# layer per input, fewer).
declare -A kBounded=([npy]=100000 [safetensors]=100000 [gguf]=100000 [attention]=100000 [paged]=100000 [pool]=10000
                      [linear]=10000 [model_dir]=10000 [cli]=10000)
SECONDS_EACH="${SIMDATTN_FUZZ_SECONDS:-0}"
command -v clang++ >/dev/null || { echo "fuzz.sh: needs clang (apt-get install clang libfuzzer-14-dev)" >&2; exit 2; }

CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSIMDATTN_FUZZ=ON \
  -DSIMDATTN_SANITIZE=address,undefined -DSIMDATTN_WITH_ONEDNN=OFF -DSIMDATTN_WITH_MPI=OFF -DSIMDATTN_BUILD_TESTS=OFF \
  -DSIMDATTN_BUILD_PERF=OFF -DSIMDATTN_BUILD_TOOLS=ON -DSIMDATTN_BUILD_PYTHON=OFF >/dev/null
# shellcheck disable=SC2046
cmake --build "$BUILD" -j "$(nproc)" --target $(printf 'fuzz_%s ' $TARGETS)

for target in $TARGETS; do
  limit=(-runs="${RUNS:-${kBounded[$target]}}")
  ((SECONDS_EACH > 0)) && limit=(-max_total_time="$SECONDS_EACH")
  mkdir -p "$BUILD/corpus/$target"
  echo "=== fuzz_$target"
  dict=()
  [[ -f "$ROOT/tests/fuzz/dict/$target.dict" ]] && dict=(-dict="$ROOT/tests/fuzz/dict/$target.dict")
  status=0
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$BUILD/tests/fuzz/fuzz_$target" "${limit[@]}" "${dict[@]}" -timeout=1 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$BUILD/" "$BUILD/corpus/$target" "$ROOT/tests/fuzz/corpus/$target" \
    >"$BUILD/fuzz_$target.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+[[:space:]]+DONE|INFO: seed corpus|stat::number_of_executed_units|stat::average_exec|==[0-9]+==ERROR|SUMMARY)" \
    "$BUILD/fuzz_$target.log" || true
  grep -oE "cov: [0-9]+ ft: [0-9]+" "$BUILD/fuzz_$target.log" | tail -1 || true
  ((status == 0)) || { echo "fuzz.sh: fuzz_$target failed, see $BUILD/fuzz_$target.log (input saved under $BUILD/)" >&2; exit 1; }
done
echo "fuzz.sh: every target ran clean"

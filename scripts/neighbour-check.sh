#!/usr/bin/env bash
# Measures bert attention() calls beside another process running the library: the second
# process runs the gpt workload at 2 threads in a loop (`simdattn compare --workload gpt`), and
# meanwhile `simdattn compare` (bert) runs N times at the default thread count and N times at 1
# thread, alternating. Prints every run's native median and the worst default-threads median
# over the median of the 1-thread medians. No OpenMP environment variable is set.
#
#   bash scripts/neighbour-check.sh [SIMDATTN_BINARY] [N]   # default: build/tools/simdattn, 6
set -euo pipefail
BIN="${1:-build/tools/simdattn}"
N="${2:-6}"
unset OMP_WAIT_POLICY GOMP_SPINCOUNT OMP_NUM_THREADS OMP_PROC_BIND KMP_BLOCKTIME

native_ms() {  # the native backend's median_ms from `simdattn compare --json`
  "$BIN" compare --json "$@" | python3 -c 'import json,sys; print([r["median_ms"] for r in json.load(sys.stdin) if r["backend"] == "native"][0])'
}

( while :; do "$BIN" compare --workload gpt --threads 2 >/dev/null 2>&1 || exit; done ) &
NEIGHBOUR=$!
trap 'pkill -P $NEIGHBOUR 2>/dev/null; kill $NEIGHBOUR 2>/dev/null; wait $NEIGHBOUR 2>/dev/null || true' EXIT
sleep 2

defaults=() singles=()
for ((i = 1; i <= N; ++i)); do
  d=$(native_ms)
  s=$(native_ms --threads 1)
  defaults+=("$d") singles+=("$s")
  printf 'run %d: default threads %8.3f ms   1 thread %8.3f ms\n' "$i" "$d" "$s"
done
python3 - "${defaults[*]}" "${singles[*]}" <<'PY'
import statistics, sys
d = [float(x) for x in sys.argv[1].split()]
s = [float(x) for x in sys.argv[2].split()]
print(f"worst default-threads median {max(d):.3f} ms, median 1-thread {statistics.median(s):.3f} ms: "
      f"ratio {max(d) / statistics.median(s):.2f}")
PY

#!/usr/bin/env bash
# The quick start's main job for now: generate a BERT-sized random example (B=1, H=12, S=128,
# D=64) as .npy files, run it on the native and reference backends with `simdattn run`, and
# print the largest difference. Needs tools/setup.sh to have run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${SIMDATTN_BUILD_DIR:-$ROOT/build}"
BIN="$BUILD_DIR/tools/simdattn"
PY=/usr/bin/python3  # Debian's interpreter, where python3-numpy lives
DIR="$(mktemp -d "${TMPDIR:-/tmp}/simdattn_example.XXXXXX")"
trap 'rm -rf "$DIR"' EXIT

"$BIN" info
"$PY" - "$DIR" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
for name, shape in (("q", (1, 12, 128, 64)), ("k", (1, 12, 128, 64)), ("v", (1, 12, 128, 64))):
    np.save(f"{d}/{name}.npy", rng.standard_normal(shape).astype(np.float32))
PY
for backend in native reference; do
  start=$(date +%s%N)
  "$BIN" run --q "$DIR/q.npy" --k "$DIR/k.npy" --v "$DIR/v.npy" --out "$DIR/o_$backend.npy" \
    --causal top-left --backend "$backend"
  echo "simdattn run --backend $backend (bert shape, causal): $(( ($(date +%s%N) - start) / 1000000 )) ms wall, including process start and file I/O"
done
"$PY" - "$DIR" <<'PY'
import sys, numpy as np
d = sys.argv[1]
a, b, v = np.load(f"{d}/o_native.npy"), np.load(f"{d}/o_reference.npy"), np.load(f"{d}/v.npy")
err = float(np.abs(a.astype(np.float64) - b).max())
tol = 1e-5 * max(1.0, float(np.abs(v).max()))
print(f"output {a.shape} {a.dtype}; max |native - reference| = {err:.3g} (tolerance {tol:.3g})")
sys.exit(0 if err <= tol else 1)
PY

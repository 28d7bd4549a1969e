#!/usr/bin/env bash
# Every translation unit of the project (engine, simd, tests, perf, tools, python) through clang 14's
# front end only (-fsyntax-only, no code generated): what g++ accepts and clang 14 does not (a
# lambda capturing a structured binding, a parenthesized aggregate initialization) shows here in
# about a minute and a half on 2 cores instead of late in CI's clang builds (scripts/tsan-check.sh's
# openmp build, scripts/fuzz.sh). Exits non-zero listing each file that fails.
#
#   bash scripts/clang-syntax-check.sh       # configures build-clang-syntax/ (or $SIMDATTN_CLANG_SYNTAX_DIR)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${SIMDATTN_CLANG_SYNTAX_DIR:-$ROOT/build-clang-syntax}"
command -v clang++-14 >/dev/null || { echo "clang-syntax-check: needs clang++-14 (apt-get install clang)" >&2; exit 2; }
CC=clang-14 CXX=clang++-14 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DSIMDATTN_WITH_ONEDNN=OFF -DSIMDATTN_WITH_MPI=OFF -DSIMDATTN_FUZZ=ON >/dev/null
python3 - "$BUILD/compile_commands.json" "$(nproc)" <<'PY'
import concurrent.futures, json, shlex, subprocess, sys
entries = json.load(open(sys.argv[1]))
def check(e):
    args = shlex.split(e["command"])
    keep, skip = [], False
    for a in args:  # the object file is not written
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        else:
            keep.append(a)
    r = subprocess.run(keep + ["-fsyntax-only"], cwd=e["directory"], capture_output=True, text=True)
    return e["file"], r.returncode, r.stderr
failed = 0
with concurrent.futures.ThreadPoolExecutor(int(sys.argv[2])) as pool:
    for name, rc, err in pool.map(check, entries):
        if rc != 0:
            failed += 1
            print(name + "\n" + err, file=sys.stderr)
print(f"clang-syntax-check: {len(entries)} files, {failed} failed")
sys.exit(1 if failed else 0)
PY

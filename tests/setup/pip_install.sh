#!/usr/bin/env bash
# The README's pip routes, from outside the source tree: a virtual environment (Debian's
# python3-venv; --system-site-packages so NumPy and torch come from Debian), then
#   1. python3 -m pip install --no-build-isolation SOURCE   into it, and
#   2. python3 -m build --no-isolation --wheel SOURCE, the wheel installed into a second one;
# each imports simdattn from its environment and runs attention() (NumPy, and torch tensors
# through simdattn.torch). Offline (--no-index). The CMake build is BUILD's (SIMDATTN_BUILD_DIR),
# so the test builds nothing the suite has not built already.
#
#   pip_install.sh PYTHON SOURCE BUILD WORK
set -euo pipefail
PYTHON=$1 SOURCE=$2 BUILD=$3 WORK=$4
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"
export SIMDATTN_BUILD_DIR=$BUILD PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

check() {  # check VENV: the package imported from VENV runs a call
  "$1/bin/python3" - <<'PY'
import sys
import numpy as np
import simdattn
assert simdattn.__file__.startswith(sys.prefix + "/"), f"imported from {simdattn.__file__}, not {sys.prefix}"
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
k = rng.standard_normal((1, 2, 7, 8)).astype(np.float32)
s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8)
p = np.exp(s - s.max(-1, keepdims=True))
want = (p / p.sum(-1, keepdims=True)) @ k
np.testing.assert_allclose(simdattn.attention(q, k, k), want, rtol=1e-5, atol=1e-5)
import torch
import simdattn.torch
out = simdattn.torch.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(k))
np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
print("ok:", simdattn.__file__)
PY
}

"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/python3" -m pip install --no-build-isolation "$SOURCE"
check "$WORK/venv"

"$PYTHON" -m venv --system-site-packages "$WORK/venv-wheel"
"$WORK/venv-wheel/bin/python3" -m build --no-isolation --wheel --outdir "$WORK/dist" "$SOURCE"
wheels=("$WORK"/dist/simdattn-*.whl)
[[ -f ${wheels[0]} ]] || { echo "no wheel in $WORK/dist" >&2; exit 1; }
"$WORK/venv-wheel/bin/python3" -m pip install "${wheels[0]}"
check "$WORK/venv-wheel"

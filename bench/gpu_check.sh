#!/usr/bin/env bash
# GPU check for the transform kernels (issue 4): the CuPy == NumPy tests, then the GPU
# benchmark. Needs a CUDA GPU with python3 (3.12 is fine), cupy, numpy, pyarrow, pytest
# (PyYAML and the project's other dependencies are not needed). Runs in under 5 minutes
# on one H200-class GPU.
#
#   bash bench/gpu_check.sh            # from the repository root
#   PYTHON=python3.12 bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="${PWD}${PYTHONPATH:+:$PYTHONPATH}"
export FEATURES_DEVICE=gpu

"$PYTHON" - <<'EOF'
import cupy, numpy, pyarrow
n = cupy.cuda.runtime.getDeviceCount()
name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode() if n else "none"
print(f"cupy {cupy.__version__}, numpy {numpy.__version__}, pyarrow {pyarrow.__version__}, {n} device(s): {name}")
EOF

# The tests and the benchmark are separate steps: a failing test still leaves the
# benchmark's numbers, and the script exits non-zero if either failed.
# -W default: show warnings, never turn them into errors here (pyproject.toml sets
# `timeout`, which warns without pytest-timeout; a third-party import may warn at
# collection): this machine is only lent for a few minutes.
tests_rc=0
timeout 180 "$PYTHON" -m pytest tests/gpu -q -p no:cacheprovider -W default -rs || tests_rc=$?
echo "gpu tests: exit ${tests_rc}"

bench_rc=0
timeout 150 "$PYTHON" bench/kernels.py --gpu --rows 1000000,10000000 --repeat 3 || bench_rc=$?
echo "gpu benchmark: exit ${bench_rc} (non-zero when an output differs from NumPy's)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]

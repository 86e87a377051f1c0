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

# -W: pyproject.toml sets `timeout` (pytest-timeout), which may be absent here; without
# the plugin pytest warns about the unknown option, and warnings are errors in this project.
timeout 180 "$PYTHON" -m pytest tests/gpu -q -p no:cacheprovider -W "ignore::pytest.PytestConfigWarning" -rs

timeout 150 "$PYTHON" bench/kernels.py --gpu --rows 1000000,10000000 --repeat 3

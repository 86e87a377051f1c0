#!/usr/bin/env bash
# The Feast benchmark venv for bench/views.py (issue 31), separate from the project's .venv:
# .cache/bench-feast-venv with feast[redis] from PyPI, pinned in bench/feast-requirements.txt.
# Cached: a rerun with an unchanged requirements file only checks a stamp (well under a second).
#   bench/feast_venv.sh            create or reuse the venv
#   bench/feast_venv.sh --unpinned install the newest feast[redis] and rewrite the pin file
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FEAST_VENV:-.cache/bench-feast-venv}
REQ=bench/feast-requirements.txt
PYTHON=${PYTHON:-python3.11}
STAMP=$VENV/.installed
if [[ "${1:-}" == "--unpinned" || ! -s $REQ ]]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q 'feast[redis]' hiredis
    {
        echo "# bench/feast_venv.sh --unpinned wrote this ($(date -u +%F)): the Feast side of bench/views.py"
        "$VENV/bin/python" -m pip freeze
    } > "$REQ"
    cp "$REQ" "$STAMP"
    echo "feast venv: $("$VENV/bin/feast" version 2>/dev/null | tail -1)"
    exit 0
fi
if [[ -f $STAMP ]] && cmp -s "$REQ" "$STAMP"; then
    exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r "$REQ"
cp "$REQ" "$STAMP"
echo "feast venv: $("$VENV/bin/feast" version 2>/dev/null | tail -1)"

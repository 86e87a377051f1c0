#!/usr/bin/env bash
# One night's load (docs/scheduling.md): every Parquet file of one day's folder into the stores.
#   load_day.sh SCHEMA DATA_ROOT [DAY]      DAY: YYYY-MM-DD, default yesterday (UTC)
# Safe to run again, for the same day or any earlier one: files the ledger committed are
# skipped, a half-finished run is completed. Exit codes are features load's: 0 loaded (rejects
# included: they are in <schema>__rejects), 1 the counts did not add up, 2 a usage, schema,
# file or store error (a store down: retry later). One JSON summary line per run is appended
# to DATA_ROOT/loads.jsonl for whoever watches the runs.
set -euo pipefail
schema=$1
root=$2
day=${3:-$(date -u -d yesterday +%F)}
folder="$root/$schema/dt=$day"
if ! compgen -G "$folder/*.parquet" > /dev/null; then
  echo "load_day: no Parquet files in $folder yet; nothing to do" >&2
  exit 0
fi
features load --schema "$schema" --json --no-progress "$folder" | tee -a "$root/loads.jsonl"

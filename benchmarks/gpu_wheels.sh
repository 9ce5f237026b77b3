#!/usr/bin/env bash
# Fill the git-ignored .whl/ with what a GPU machine needs for benchmarks/gpu_e2e.py (no registry there):
# the wheels of benchmarks/gpu_wheels.txt (CPython 3.12, x86-64 Linux) and a copy of the GSM8K file
# (.whl/data/gsm8k/test.jsonl, its first 200 problems: only the checkout and carried paths travel, ../shared does not).
# Prints what travels; fails when the checkout and .whl/ together exceed the machines' 64 MiB.
# Usage, from the repository root: bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
data="${EGLR_DATA_DIR:-../shared/data}"
mkdir -p .whl/data/gsm8k
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl -r benchmarks/gpu_wheels.txt
# the first 200 problems only: the runs read the first 32 (--limit) and the calibration the first 16, and the whole
# file (0.7 MiB) no longer fits beside the wheels and results/ (2026-11-28: 63.7 MiB of 64 with it)
rm -f .whl/data/gsm8k/test.jsonl
head -n 200 "$data/gsm8k/test.jsonl" > .whl/data/gsm8k/test.jsonl
wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
carried=$(du -sb .whl | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | awk '$2 == "total" {s += $1} END {print s}')
total=$((tree + carried))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
printf 'wheels %s MiB (%d files), .whl/ %s MiB, working tree %s MiB, together %s MiB of 64\n' \
  "$(mib "$wheels")" "$(ls .whl/*.whl | wc -l)" "$(mib "$carried")" "$(mib "$tree")" "$(mib "$total")"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "over the 64 MiB a call may carry" >&2
  exit 1
fi

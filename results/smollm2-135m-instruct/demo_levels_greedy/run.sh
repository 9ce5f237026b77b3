#!/usr/bin/env bash
# Greedy accuracy of SmolLM2-135M-Instruct per demo level: the first 200 problems of the default demo
# set (levels 1-5 interleaved, 40 each), plain decoding through eglr-hf (L=0, T=0), 160 new tokens,
# CPU, one thread; then the accuracy per level (per_level.csv). It chose the demo level of the grid in
# ../demo_level0_lxt: no default level reaches 30 %. (Made 2026-11-23 with --output_path in a scratch
# folder and moved here; the command is otherwise this one.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=results/smollm2-135m-instruct/demo_levels_greedy
lm_eval --model eglr-hf --model_args model_config=smollm2-135m-instruct,L=0,T=0 --tasks eglr_demo \
  --apply_chat_template --metadata '{"eglr_demo_n": 200}' --limit 200 --gen_kwargs max_gen_toks=160 \
  --batch_size 200 --output_path $OUT/run --log_samples
python -m eglr_harness.analysis.portable $OUT/run
python - "$OUT" <<'PY'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(line) for f in sorted(out.glob("run/*/samples_eglr_demo_*.jsonl")) for line in open(f)]
levels = sorted({r["doc"]["metadata"]["level"] for r in rows})
with open(out / "per_level.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["level", "problems", "correct", "accuracy"])
    for level in levels:
        acc = [r["acc"] for r in rows if r["doc"]["metadata"]["level"] == level]
        w.writerow([level, len(acc), int(sum(acc)), round(sum(acc) / len(acc), 4)])
    w.writerow(["all", len(rows), int(sum(r["acc"] for r in rows)), round(sum(r["acc"] for r in rows) / len(rows), 4)])
PY

#!/usr/bin/env bash
# The leaderboard in results/smollm2-135m-instruct/leaderboard/ was made with this command (CPU, 2 cores).
# Rerunning it skips finished cells (a cell is identified by its benchmark, method and --limit).
# The EGLR runs file every rollout in the shared rollout store (rollout_cache=...), so a killed run
# resumes where it stopped and the L x T grid (gsm8k_lxt/run.sh) reuses the L-pool rollouts.
# The greedy and beam cells run on eglr-baseline (docs/baselines.md): lm-eval's hf with each beam ended by its own stop
# string (stock hf at batch > 1 ends every beam of a batch at a batch-mate's), beam search one prompt at a time, each
# answer's finish and search tokens recorded (so Beam-4's FLOP ratio is measured). They were rerun so on 2026-12-02
# (one thread each, beside other work); MATH-500's beam cell ran by hand with this script's command for it (as
# `--dry_run` prints it), beside the GSM8K one, and was then skipped here as finished. Exact commands:
# leaderboard_cells.csv.
set -euo pipefail
cd "$(dirname "$0")/../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
SMOLLM2=$(python -c "from eglr_harness.run.presets import load_preset as l; print(l('smollm2-135m-instruct')['model_args']['pretrained'])")
eglr-leaderboard --model_args pretrained=$SMOLLM2,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf,dtype=float32 \
  --tasks gsm8k,math500 --limit gsm8k=100,math500=50 --max_gen_toks 256 --batch_size 64 --beam_batch_size 16 --device cpu \
  --apply_chat_template --beams 4 --eglr_model_args tau_h=2.5,rollout_cache=results/smollm2-135m-instruct/rollouts \
  --output_dir results/smollm2-135m-instruct/leaderboard --update_committed "$@"
python -m eglr_harness.analysis.portable results/smollm2-135m-instruct/leaderboard  # no machine path in the results

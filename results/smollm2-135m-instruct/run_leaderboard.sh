#!/usr/bin/env bash
# The leaderboard in results/smollm2-135m-instruct/leaderboard/ was made with this command (CPU, 2 cores).
# Rerunning it skips finished cells (a cell is identified by its benchmark, method and --limit).
# The EGLR runs file every rollout in the shared rollout store (rollout_cache=...), so a killed run
# resumes where it stopped and the L x T grid (gsm8k_lxt/run.sh) reuses the L-pool rollouts.
# Beam runs are memory-bound on CPU (the KV cache is copied every step), hence the smaller beam batch;
# the GSM8K beam run was made at batch 64 before that flag existed (exact commands: leaderboard_cells.csv).
set -euo pipefail
cd "$(dirname "$0")/../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
SMOLLM2=$(python -c "from eglr_harness.run.presets import load_preset as l; print(l('smollm2-135m-instruct')['model_args']['pretrained'])")
eglr-leaderboard --model_args pretrained=$SMOLLM2,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf,dtype=float32 \
  --tasks gsm8k,math500 --limit gsm8k=100,math500=50 --max_gen_toks 256 --batch_size 64 --beam_batch_size 16 --device cpu \
  --apply_chat_template --beams 4 --eglr_model_args tau_h=2.5,rollout_cache=results/smollm2-135m-instruct/rollouts \
  --output_dir results/smollm2-135m-instruct/leaderboard --update_committed "$@"

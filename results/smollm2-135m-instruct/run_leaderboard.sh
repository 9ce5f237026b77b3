#!/usr/bin/env bash
# The leaderboard in results/smollm2-135m-instruct/leaderboard/ was made with this command (CPU, 2 cores).
# Rerunning it skips finished cells; raise --limit (and remove nothing) to extend it.
set -euo pipefail
cd "$(dirname "$0")/../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
SMOLLM2=$(python -c "from eglr_harness.presets import load_preset as l; print(l('smollm2-135m-instruct')['model_args']['pretrained'])")
eglr-leaderboard --model_args pretrained=$SMOLLM2,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf,dtype=float32 \
  --tasks gsm8k,math500 --limit 24 --max_gen_toks 256 --batch_size 16 --device cpu \
  --apply_chat_template --beams 4 --eglr_model_args tau_h=2.5 \
  --output_dir results/smollm2-135m-instruct/leaderboard

#!/usr/bin/env bash
# The 11 x 11 L x T grid on the first 24 GSM8K problems (256 new tokens), CPU, 2 cores, then its report.
# 24 x 121 = 2,904 rollouts. Every finished rollout is filed in the rollout store, so rerunning this
# script after an interruption recomputes only the missing ones (and reuses the leaderboard's
# L-pool rollouts of the same problems). On a GPU: drop --limit, raise --batch_size, pick a preset.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
OUT=results/smollm2-135m-instruct/gsm8k_lxt
lm_eval --model eglr-hf \
  --model_args model_config=smollm2-135m-instruct,dtype=float32,tau_h=2.5,rollout_cache=results/smollm2-135m-instruct/rollouts \
  --tasks gsm8k_eglr_lxt --limit 24 --gen_kwargs max_gen_toks=256 --apply_chat_template \
  --batch_size 24 --device cpu --output_path $OUT/run --log_samples
eglr-report $OUT/run --out $OUT/report

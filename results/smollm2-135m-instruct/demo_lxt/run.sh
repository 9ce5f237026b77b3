#!/usr/bin/env bash
# The 11x11 L x T grid on the first 6 offline demo problems (96 new tokens), then its report.
# Made with this script on CPU (2 cores); rerunning resumes from the rollout store.
set -euo pipefail
cd "$(dirname "$0")/../../.."
lm_eval --model eglr-hf \
  --model_args model_config=smollm2-135m-instruct,rollout_cache=${EGLR_ROLLOUTS:-/tmp/eglr_demo_lxt_rollouts} \
  --tasks eglr_demo_lxt --limit 6 --gen_kwargs max_gen_toks=96 --apply_chat_template --batch_size 16 \
  --output_path results/smollm2-135m-instruct/demo_lxt/run --log_samples
eglr-report results/smollm2-135m-instruct/demo_lxt/run --out results/smollm2-135m-instruct/demo_lxt/report

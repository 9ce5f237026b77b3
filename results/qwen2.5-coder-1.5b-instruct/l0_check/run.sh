#!/usr/bin/env bash
# Issue 59, item 1: on the real model, eglr-hf at L = 0 decodes what plain decoding decodes. Greedy on GSM8K's
# first 4 test problems (the task's prompt, the model's chat template), 32 new tokens, bf16 (the Q4_K_M GGUF
# de-quantised), CPU: lm-eval's own `hf` model, then eglr-hf at L = 0 through each engine (continuous, hf);
# then scripts/compare.py checks that the three logged answers are the same text, problem by problem.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
HERE=results/qwen2.5-coder-1.5b-instruct/l0_check
COMMON="--tasks gsm8k_eglr --limit 4 --gen_kwargs max_gen_toks=32 --apply_chat_template --batch_size 4 --device cpu --log_samples"
[ -d $HERE/plain_hf ] || lm_eval --model hf --model_args $LOAD $COMMON --output_path $HERE/plain_hf
for ENGINE in continuous hf; do
  [ -d $HERE/eglr_L0_$ENGINE ] || lm_eval --model eglr-hf \
    --model_args model_config=qwen2.5-coder-1.5b-instruct,$LOAD,L=0,T=0,engine=$ENGINE $COMMON \
    --output_path $HERE/eglr_L0_$ENGINE
done
python -m eglr_harness.analysis.portable $HERE
python scripts/compare.py $HERE/plain_hf $HERE/eglr_L0_continuous $HERE/eglr_L0_hf --out $HERE/agreement.md

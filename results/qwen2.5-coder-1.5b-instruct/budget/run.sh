#!/usr/bin/env bash
# Issue 59, item 2: which token budget leaves under 5 % of greedy answers cut off? Greedy (eglr-hf, L = 0,
# T = 0: plain decoding) on GSM8K's first 24 test problems at 640 and then 512 new tokens; Qwen2.5-Coder-1.5B-
# Instruct, the Q4_K_M GGUF de-quantised to bf16 (scripts/get_model.py fetches it), CPU, one
# thread. Then scripts/cutoff.py counts the answers that reached the budget. Resumable: each finished rollout is in
# the rollout store ../rollouts, and a budget whose run folder exists is skipped.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
HERE=results/qwen2.5-coder-1.5b-instruct/budget
ARGS=$POOL_ARGS,L=0,T=0
LIMIT=${LIMIT:-24}
for TOKENS in 640 512; do
  OUT=$HERE/greedy_$TOKENS
  [ -d $OUT ] || lm_eval --model eglr-hf --model_args $ARGS --tasks gsm8k_eglr_sc --limit $LIMIT \
    --gen_kwargs max_gen_toks=$TOKENS --apply_chat_template --batch_size $LIMIT --device cpu --log_samples \
    --output_path $OUT
done
python -m eglr_harness.analysis.portable $HERE
python scripts/cutoff.py $HERE/greedy_640 $HERE/greedy_512 --out $HERE/cutoff.md

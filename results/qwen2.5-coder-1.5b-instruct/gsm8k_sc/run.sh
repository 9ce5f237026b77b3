#!/usr/bin/env bash
# Issue 59, item 2 (begun): greedy, EGLR-SC_L (L = 1..10 at T = 0, B = 10, majority vote) and SC_T (L = 0 at
# T = 0.7, B = 10 sampled rollouts under seeds 1333..1342, `seeds=10`, majority vote: also the seed pool of the
# report's re-sampling check, once a T pool is beside it) on GSM8K's first
# LIMIT test problems, 640 new tokens (the budget chosen in ../budget: under 5 % of greedy answers cut off there),
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF de-quantised to bf16; scripts/get_model.py), CPU, one thread.
# tau_h: eglr-calibrate (the paper's rule: 95th percentile of greedy token entropies, capped at 2.5 nats) on the
# first 128 new tokens of GSM8K's first 16 problems (2,048 token entropies; shorter than the paper's whole answers,
# to fit the CPU), written into the preset (model_configs/qwen2.5-coder-1.5b-instruct.yaml, tau_h.gsm8k), skipped
# when the preset has it. Resumable: every finished rollout goes to the rollout store ../rollouts; rerun the same
# command (a larger LIMIT too) after a stop and only what is missing is decoded (greedy at 640 tokens comes from
# ../budget's run, through the store).
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/gsm8k_sc
grep -q "^  gsm8k:" model_configs/qwen2.5-coder-1.5b-instruct.yaml || eglr-calibrate \
  --model_config qwen2.5-coder-1.5b-instruct --model_args $LOAD,device=cpu --tasks gsm8k_eglr --apply_chat_template \
  --calib_limit 16 --gen_kwargs max_gen_toks=128 --batch_size 16
COMMON="--tasks gsm8k_eglr_sc --limit $LIMIT --gen_kwargs max_gen_toks=640 --apply_chat_template --device cpu --log_samples"
# cheapest first, so that a stopped run leaves whole comparisons: greedy, then EGLR-SC_L, then SC_T
[ -d $HERE/greedy_$LIMIT ] || lm_eval --model eglr-hf --model_args $POOL_ARGS,L=0,T=0 $COMMON --batch_size 24 \
  --output_path $HERE/greedy_$LIMIT
[ -d $HERE/sc_L_$LIMIT ] || lm_eval --model eglr-hf --model_args $POOL_ARGS $COMMON --batch_size 100 \
  --output_path $HERE/sc_L_$LIMIT
[ -d $HERE/sc_T_$LIMIT ] || lm_eval --model eglr-hf --model_args $POOL_ARGS,L=0,T=0.7,seeds=10 $COMMON --batch_size 100 \
  --output_path $HERE/sc_T_$LIMIT
python -m eglr_harness.analysis.portable $HERE
# the SC runs of this LIMIT that exist (sc_L; sc_T once decoded: the first runs of LIMIT 5 and 10 had none)
eglr-report $HERE/sc_?_$LIMIT $HERE/greedy_$LIMIT --out $HERE/report_$LIMIT

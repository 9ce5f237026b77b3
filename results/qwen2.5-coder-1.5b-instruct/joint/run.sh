#!/usr/bin/env bash
# Issue 59, item 2: the joint L×T pool. ../gsm8k_sc decodes the L axis at T = 0 (EGLR-SC_L, L = 1..10) and the T axis
# at L = 0 (ten samples at T = 0.7); this run decodes the cells where both move, L = 1..10 at T = 0.7 (B = 10: the
# task's pool with `T=0.7` pinned, one sample per L under the run's seed), on GSM8K's first LIMIT test problems, 640
# new tokens, chat template, as ../gsm8k_sc; Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF de-quantised to bf16;
# scripts/get_model.py), CPU. Resumable through the shared rollout store ../rollouts (rerun the same command after a
# stop: only what is missing is decoded). The report merges it with ../gsm8k_sc's runs of the same LIMIT (run that
# script first): the L×T pool (greedy, both axes and the joint cells, B = 31) against the T-only and L-only corners,
# each difference paired over problems.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/joint
SC=results/qwen2.5-coder-1.5b-instruct/gsm8k_sc
[ -d $HERE/sc_L_T0.7_$LIMIT ] || lm_eval --model eglr-hf --model_args $POOL_ARGS,T=0.7 --tasks gsm8k_eglr_sc \
  --limit $LIMIT --gen_kwargs max_gen_toks=640 --apply_chat_template --device cpu --log_samples --batch_size 100 \
  --output_path $HERE/sc_L_T0.7_$LIMIT
python -m eglr_harness.analysis.portable $HERE
eglr-report $HERE/sc_L_T0.7_$LIMIT $SC/sc_L_$LIMIT $SC/sc_T_$LIMIT $SC/greedy_$LIMIT --out $HERE/report_$LIMIT

#!/usr/bin/env bash
# Issue 59, items 2 and 4: the re-sampling check with all three pools, as the peer (arXiv 2605.23872) asks: the
# L pool (EGLR-SC_L, L = 1..10 at T = 0), a T pool (L = 0 at T = 0.1..1.0, the task's budget axis: one sampled
# rollout per temperature) and the seed pool (L = 0, T = 0.7 under ten seeds), at B = 10 rollouts per problem, on
# GSM8K's first LIMIT test problems, 640 new tokens, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF de-quantised to bf16;
# scripts/get_model.py), CPU, one thread. The L and seed pools are ../gsm8k_sc's runs of the same LIMIT (run first);
# this decodes the T pool, whose T = 0.7 cell (seed 1333) the rollout store gives back from the seed pool's first
# seed. The report has the sections runs and resampling only: in one grid the seed pool's ten T = 0.7 rollouts sit
# in the T pool's T = 0.7 cell, which the grid's other sections would count as the T pool's. Resumable through the
# rollout store ../rollouts; a run folder that exists is not decoded again.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/resampling
SC=results/qwen2.5-coder-1.5b-instruct/gsm8k_sc
[ -d $HERE/tpool_$LIMIT ] || lm_eval --model eglr-hf --model_args $POOL_ARGS,L=0 --tasks gsm8k_eglr_sc --limit $LIMIT \
  --gen_kwargs max_gen_toks=640 --apply_chat_template --device cpu --log_samples --batch_size 100 \
  --output_path $HERE/tpool_$LIMIT
python -m eglr_harness.analysis.portable $HERE
eglr-report $SC/sc_L_$LIMIT $HERE/tpool_$LIMIT $SC/sc_T_$LIMIT --sections runs,resampling --out $HERE/report_$LIMIT

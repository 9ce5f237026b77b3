#!/usr/bin/env bash
# MATH-500 on Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF de-quantised to bf16; scripts/get_model.py), CPU, one thread:
# the paper's headline task on a model that solves math, at the size a CPU allows (the first LIMIT problems,
# levels as they come).
#   1. tau_h: eglr-calibrate (95th percentile of greedy token entropies, capped at 2.5 nats) on the first 128 new
#      tokens of MATH-500's first 16 problems, written into the preset (tau_h.math500); skipped when it is there.
#   2. The budget: greedy on the first 20 problems at BUDGET new tokens; scripts/cutoff.py counts the answers
#      that reached it (the house rule: under ~5 % cut off, or say how many).
#   3. Greedy, EGLR-SC_L (L = 1..10 at T = 0, majority vote) and SC_T (L = 0 at T = 0.7, 10 seeds) on the first
#      LIMIT problems, cheapest first. The report (eglr-report over sc_L, sc_T and greedy) is added to this script
#      with its output once the three runs are complete; until then the runs are decoding (results/README.md).
# Resumable: every finished rollout goes to the rollout store ./rollouts (committed as its export,
# rollouts/rollouts_rank0.jsonl.gz, which the store takes in when it opens); rerun the same command (a larger
# LIMIT too) after a stop and only what is missing is decoded; a run folder that exists is skipped. New samples
# are compressed and listed in results/MANIFEST.json by the last two lines.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
HERE=results/qwen2.5-coder-1.5b-instruct/math500_sc
LIMIT=${LIMIT:-50}
BUDGET=${BUDGET:-1024}
ARGS=model_config=qwen2.5-coder-1.5b-instruct,$LOAD,rollout_cache=$HERE/rollouts
grep -q "^  math500:" model_configs/qwen2.5-coder-1.5b-instruct.yaml || eglr-calibrate \
  --model_config qwen2.5-coder-1.5b-instruct --model_args $LOAD,device=cpu --tasks math500_eglr --apply_chat_template \
  --calib_limit 16 --gen_kwargs max_gen_toks=128 --batch_size 16
COMMON="--tasks math500_eglr_sc --gen_kwargs max_gen_toks=$BUDGET --apply_chat_template --device cpu --log_samples"
[ -d $HERE/budget_greedy_$BUDGET ] || lm_eval --model eglr-hf --model_args $ARGS,L=0,T=0 $COMMON --limit 20 \
  --batch_size 20 --output_path $HERE/budget_greedy_$BUDGET
python scripts/cutoff.py $HERE/budget_greedy_$BUDGET --out $HERE/cutoff_$BUDGET.md
if [ "${BUDGET_ONLY:-0}" = 1 ]; then exit 0; fi
[ -d $HERE/greedy_$LIMIT ] || lm_eval --model eglr-hf --model_args $ARGS,L=0,T=0 $COMMON --limit $LIMIT \
  --batch_size 25 --output_path $HERE/greedy_$LIMIT
python scripts/cutoff.py $HERE/greedy_$LIMIT --out $HERE/cutoff_greedy_$LIMIT.md
[ -d $HERE/sc_L_$LIMIT ] || lm_eval --model eglr-hf --model_args $ARGS $COMMON --limit $LIMIT --batch_size 100 \
  --output_path $HERE/sc_L_$LIMIT
[ -d $HERE/sc_T_$LIMIT ] || lm_eval --model eglr-hf --model_args $ARGS,L=0,T=0.7,seeds=10 $COMMON --limit $LIMIT \
  --batch_size 100 --output_path $HERE/sc_T_$LIMIT
python -m eglr_harness.analysis.portable $HERE
eglr-store pack $HERE
eglr-store manifest results

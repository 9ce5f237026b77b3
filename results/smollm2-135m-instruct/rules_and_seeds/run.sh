#!/usr/bin/env bash
# Issue 49 on SmolLM2-135M (Q4_1 GGUF, fp32), CPU, one thread: the exit rules at equal compute, and the
# re-sampling check (does depth diversity add anything over seed diversity at an equal number of rollouts?).
#   1. rules/  : eglr-sweep --rules: every exit rule (kl, latent, accel, margin, entropy) over three
#                thresholds, L=4, k_max=3, greedy, on 60 demo problems of level 0 (32 new tokens), 13 runs;
#                the report's "Exit rules" section plots accuracy against the measured FLOP ratio.
#   2. demo/   : 40 demo problems of level 0 (32 new tokens), three pools of 10 rollouts per problem on
#                eglr_demo_sc: the L pool (L = 1..10 at T = 0, the paper's EGLR-SC), the T pool (L = 0,
#                T = 0.1..1.0) and the seed pool (L = 0, T = 0.7 under seeds 1333..1342: `seeds=10`).
#   3. gsm8k/  : the same three pools on GSM8K's first 10 test problems (128 new tokens; the model solves
#                ~2 % of GSM8K, so this shows the pipeline on the real benchmark, not an effect).
# The pool reports have the sections runs and resampling only: merged into one grid, the seed pool's ten
# T = 0.7 rollouts sit in the T pool's T = 0.7 cell, which the grid's other sections would count as the T pool's.
# Every finished rollout is filed in the rollout store beside this script (rollouts/), so a killed run
# resumes: rerunning this script skips finished sweep points and decodes only the missing rollouts.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
OUT=results/smollm2-135m-instruct/rules_and_seeds
ARGS=model_config=smollm2-135m-instruct,dtype=float32,tau_h=2.5

# 1. the exit rules over their threshold grid
eglr-sweep --model_args $ARGS,L=4 --tasks eglr_demo --rules \
  --metadata '{"eglr_demo_n": 60, "eglr_demo_levels": "0"}' --max_gen_toks 32 --apply_chat_template \
  --batch_size 60 --device cpu --rollout_cache $OUT/rollouts --output_dir $OUT/rules --no_report

# 2. and 3. the L pool, the T pool and the seed pool
pools() {  # pools NAME TASK_FLAGS...
  local name=$1; shift
  for pool in lpool:"" tpool:",L=0" seedpool:",L=0,T=0.7,seeds=10"; do
    [ -n "$(ls $OUT/$name/${pool%%:*}/*/results_*.json 2>/dev/null)" ] || \
      lm_eval --model eglr-hf --model_args "$ARGS,rollout_cache=$OUT/rollouts${pool#*:}" "$@" \
        --apply_chat_template --device cpu --log_samples --output_path $OUT/$name/${pool%%:*}
  done
}
pools demo --tasks eglr_demo_sc --metadata '{"eglr_demo_n": 40, "eglr_demo_levels": "0"}' \
  --gen_kwargs max_gen_toks=32 --batch_size 40
pools gsm8k --tasks gsm8k_eglr_sc --limit 10 --gen_kwargs max_gen_toks=128 --batch_size 50

python -m eglr_harness.analysis.portable $OUT
eglr-report $OUT/rules/* --task eglr_demo --sections runs,ablation,rules --out $OUT/rules_report
eglr-report $OUT/demo/lpool $OUT/demo/tpool $OUT/demo/seedpool --sections runs,resampling --out $OUT/demo_report
eglr-report $OUT/gsm8k/lpool $OUT/gsm8k/tpool $OUT/gsm8k/seedpool --sections runs,resampling --out $OUT/gsm8k_report

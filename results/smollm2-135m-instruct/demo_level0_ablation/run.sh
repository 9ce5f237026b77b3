#!/usr/bin/env bash
# The paper's ablation (Table 4: alpha and K_max, one at a time, at L=4) on 200 demo problems of level 0
# (ten more than a number, or a number doubled), 32 new tokens, greedy (T=0), tau_h=2.5 as in the level-0
# grid (../demo_level0_lxt), plus L=0 (plain greedy) as the reference. The default point (the preset's
# alpha=0.2, k_max=3, L=4) runs once; 10 lm_eval runs in all, each through the stock lm_eval CLI (eglr-sweep).
# CPU, one thread (a 2-core machine shared with other work): 1,364 s of lm_eval runs in all. The level-0
# generator has 132 distinct problems: 68 of the 200 documents repeat an earlier one's question (another id).
# Every finished rollout is filed in the rollout store beside this script; rerunning skips finished runs.
# (The alpha and k_max points ran first, with L=4 spelled in --model_args; the L axis was added after.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=results/smollm2-135m-instruct/demo_level0_ablation
OMP_NUM_THREADS=1 eglr-sweep \
  --model_args model_config=smollm2-135m-instruct,dtype=float32,tau_h=2.5 \
  --tasks eglr_demo --metadata '{"eglr_demo_n": 200, "eglr_demo_levels": "0"}' \
  --sweep alpha=0.1,0.2,0.5,0.7,0.9 --sweep k_max=1-5 --sweep L=0,4 \
  --max_gen_toks 32 --apply_chat_template --batch_size 100 --device cpu \
  --rollout_cache $OUT/rollouts --output_dir $OUT --no_report
python -m eglr_harness.analysis.portable $OUT
eglr-report $OUT/default $OUT/alpha_* $OUT/k_max_* $OUT/L_* --task eglr_demo --sections runs,ablation --out $OUT/report

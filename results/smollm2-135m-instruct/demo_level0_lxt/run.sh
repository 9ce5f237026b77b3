#!/usr/bin/env bash
# The complete 11 x 11 L x T grid on 100 demo problems of level 0 (ten more than a number, or a number
# doubled; --metadata eglr_demo_levels), then its report. Level 0 because SmolLM2-135M-Instruct's greedy
# accuracy is 0-20 % on the default levels 1-5 (../demo_levels_greedy); 32 new tokens because a reply
# is mostly a line or two while the batch runs until its longest row. CPU, one thread (a 2-core
# machine shared with other work): 5,331 s. 100 x 121 = 12,100 rollouts. Every finished rollout is
# filed in the rollout store beside this script, so rerunning it after an interruption recomputes only
# the missing ones (and a rerun of the finished grid only rereads the store).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=results/smollm2-135m-instruct/demo_level0_lxt
lm_eval --model eglr-hf \
  --model_args model_config=smollm2-135m-instruct,dtype=float32,tau_h=2.5,rollout_cache=$OUT/rollouts \
  --tasks eglr_demo_lxt --metadata '{"eglr_demo_n": 100, "eglr_demo_levels": "0"}' \
  --gen_kwargs max_gen_toks=32 --apply_chat_template --batch_size 100 --device cpu \
  --output_path $OUT/run --log_samples
python -m eglr_harness.analysis.portable $OUT/run
eglr-report $OUT/run --out $OUT/report

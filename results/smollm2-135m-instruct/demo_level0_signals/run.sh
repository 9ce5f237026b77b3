#!/usr/bin/env bash
# Selection by the model's own signals on SmolLM2: 100 demo problems of level 0, 32 new tokens, the
# continuous engine (engine=auto), which records each rollout's signals (mean/max entropy, mean
# log-probability of the chosen tokens, gated fraction, iterations, final KL). Three runs, merged by
# eglr-report: greedy (L=0, T=0 on eglr_demo_sc: one deterministic cell, decoded once per problem), the L pool (eglr_demo_sc: L = 1..10 at T = 0) and
# the T pool (L pinned to 0: T = 0.1..1.0 at L = 0), 2,100 rollouts. Every finished rollout is filed
# in the rollout store beside this script, so a rerun after an interruption decodes only the rest.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=results/smollm2-135m-instruct/demo_level0_signals
common=(--metadata '{"eglr_demo_n": 100, "eglr_demo_levels": "0"}' --gen_kwargs max_gen_toks=32
        --apply_chat_template --batch_size 100 --device cpu --log_samples)
args=model_config=smollm2-135m-instruct,dtype=float32,tau_h=2.5,rollout_cache=$OUT/rollouts
lm_eval --model eglr-hf --model_args "$args,L=0,T=0" --tasks eglr_demo_sc "${common[@]}" --output_path "$OUT/greedy"
lm_eval --model eglr-hf --model_args "$args" --tasks eglr_demo_sc "${common[@]}" --output_path "$OUT/lpool"
lm_eval --model eglr-hf --model_args "$args,L=0" --tasks eglr_demo_sc "${common[@]}" --output_path "$OUT/tpool"
python -m eglr_harness.analysis.portable "$OUT/greedy" "$OUT/lpool" "$OUT/tpool"
eglr-report "$OUT/greedy" "$OUT/lpool" "$OUT/tpool" --out "$OUT/report"

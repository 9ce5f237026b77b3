#!/usr/bin/env bash
# L pool vs T pool on the first 100 GSM8K problems (256 new tokens, CPU, 2 cores), and one report over both.
#   L pool : the leaderboard's EGLR-SC_L run (leaderboard/gsm8k/eglr_sc): L in 1..10 at T = 0
#   T pool : this script, L pinned to 0, T in 0.1..1.0 (plain temperature sampling, seed 1333)
#   greedy : this script, L = 0 and T = 0 through eglr-hf, so the report has the (0, 0) cell
# Same task (gsm8k_eglr_sc), model, tokens and rollout store, so `eglr-report` merges the three runs
# into one partial L x T grid (the L = 0 row and the T = 0 column), and the 11 x 11 grid run
# (gsm8k_lxt/run.sh) reuses these rollouts for its first 24 problems.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
HERE=results/smollm2-135m-instruct/gsm8k_pools
SMOLLM2=$(python -c "from eglr_harness.run.presets import load_preset as l; print(l('smollm2-135m-instruct')['model_args']['pretrained'])")
ARGS=pretrained=$SMOLLM2,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf,dtype=float32,tau_h=2.5,rollout_cache=results/smollm2-135m-instruct/rollouts
COMMON="--tasks gsm8k_eglr_sc --limit 100 --gen_kwargs max_gen_toks=256 --apply_chat_template --batch_size 64 --device cpu --log_samples"
[ -d $HERE/tpool ] || lm_eval --model eglr-hf --model_args $ARGS,L=0,T=0.1-1.0:0.1 $COMMON --output_path $HERE/tpool
[ -d $HERE/greedy ] || lm_eval --model eglr-hf --model_args $ARGS,L=0,T=0 $COMMON --output_path $HERE/greedy
eglr-report results/smollm2-135m-instruct/leaderboard/gsm8k/eglr_sc $HERE/tpool $HERE/greedy --out $HERE/report

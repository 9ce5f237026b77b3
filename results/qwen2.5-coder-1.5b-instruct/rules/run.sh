#!/usr/bin/env bash
# Issue 59, item 2: the exit rules at equal compute on a model that solves math. eglr-sweep runs kl (the paper's
# rule), latent and margin over three thresholds each, and accel at its default (with the preset's k_max = 3 its
# two-hit check cannot exit before k_max: docs/model-arguments.md), at L = 4, T = 0, tau_h from the preset, on
# GSM8K's first LIMIT test problems, 640 new tokens (as ../gsm8k_sc), Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF
# de-quantised to bf16; scripts/get_model.py), CPU, one thread. Every point is decoded here, in this sweep's batches of
# LIMIT rows, into a rollout store of its own (rollouts/ beside this script): in bf16 a batch's make-up moves near
# ties, and through the shared store ../rollouts, kl at 5e-4 came back from ../gsm8k_sc's EGLR-SC_L pool (its L = 4
# cell, decoded among 100 rows of ten spans), writing other texts than a batch of 30 would (results/README.md). The
# other nine points of runs_30 were decoded by this sweep through the shared store, before it had its own.
# Resumable: every finished rollout goes to the store and a finished point is skipped; rerun the same command after
# a stop. The report's "Exit rules at equal compute" section sets each rule's accuracy against its FLOP ratio with
# the LM head, paired over problems.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/rules
eglr-sweep --model_args model_config=qwen2.5-coder-1.5b-instruct,$LOAD,L=4,T=0 --tasks gsm8k_eglr_sc --limit $LIMIT \
  --rule kl=0.0005,0.005,0.05 --rule latent=0.01,0.03,0.1 --rule margin=0.2,0.5,0.8 --rule accel=0.03 \
  --max_gen_toks 640 --apply_chat_template --batch_size $LIMIT --device cpu \
  --rollout_cache $HERE/rollouts --output_dir $HERE/runs_$LIMIT --no_report
python -m eglr_harness.analysis.portable $HERE
eglr-report $HERE/runs_$LIMIT/* --task gsm8k_eglr_sc --sections runs,ablation,rules --out $HERE/report_$LIMIT

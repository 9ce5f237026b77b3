#!/usr/bin/env bash
# Issue 59, item 2: beam search FLOP-matched to EGLR-SC, as the paper matches it. EGLR-SC_L's pool of B = 10 costs
# 10.4x greedy's FLOPs per problem on these problems (../gsm8k_sc's report, "Accuracy against compute"), and Beam-n
# costs n x greedy (n hypotheses decoded together: eglr_harness.analysis.metrics.compute.beam_flop_ratio), so
# Beam-10. Stock lm-eval `hf` (nothing of the project's decoding), `do_sample=False,num_beams=10`, on GSM8K's first
# LIMIT test problems, 640 new tokens, chat template, as ../gsm8k_sc; Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF
# de-quantised to bf16; ../get_model.py), CPU, one thread. Not resumable inside a run (stock `hf` has no rollout
# store): a finished LIMIT is skipped. The report merges it with ../gsm8k_sc's runs of the same LIMIT (greedy,
# EGLR-SC_L, SC_T) on the problems both hold: accuracy against compute, and Beam-10 against EGLR-SC_L paired.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/beam
SC=results/qwen2.5-coder-1.5b-instruct/gsm8k_sc
[ -d $HERE/beam10_$LIMIT ] || lm_eval --model hf --model_args $LOAD --tasks gsm8k_eglr --limit $LIMIT \
  --gen_kwargs do_sample=False,num_beams=10,max_gen_toks=640 --apply_chat_template --device cpu --batch_size 3 \
  --log_samples --output_path $HERE/beam10_$LIMIT
python -m eglr_harness.analysis.portable $HERE
eglr-report $SC/sc_L_$LIMIT $SC/sc_T_$LIMIT $SC/greedy_$LIMIT $HERE/beam10_$LIMIT --out $HERE/report_$LIMIT

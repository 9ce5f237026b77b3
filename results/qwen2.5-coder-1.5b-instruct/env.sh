# Sourced by the run scripts of the folders beside it: the repository root as the working folder, the benchmark
# data, one thread unless told otherwise, and the model's load arguments (LOAD: the Q4_K_M GGUF that
# scripts/get_model.py fetches and checks, de-quantised to bf16).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export EGLR_DATA_DIR=${EGLR_DATA_DIR:-../shared/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
MODEL=$(python scripts/get_model.py --print_dir)
LOAD=pretrained=$MODEL,gguf_file=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf,dtype=bfloat16
# eglr-hf's model args of every run that shares the rollout store ../rollouts (the preset, the load, the store)
POOL_ARGS=model_config=qwen2.5-coder-1.5b-instruct,$LOAD,rollout_cache=results/qwen2.5-coder-1.5b-instruct/rollouts

"""EGLR at the paper's model shapes on one machine: exactness, placement, speed, memory, and the pool.

No weights are downloaded: every family is built from its transformers config with random
weights at the shapes of its published ``config.json`` (``FAMILIES``). ``--size tiny`` shrinks
every family to a few small layers, so that the same code runs on a CPU in seconds (the test
``tests/benchmarks/test_gpu_check.py`` does that).

Checks (``--checks``, all by default):

1. ``exactness`` (fp32, shortened to ``--exact_layers`` layers at full width): greedy EGLR tokens
   of the cached, batched engine equal the naive uncached reference
   (``eglr_harness/decoding/naive_reference.py``) for L in {1, N/2, N}, for each attention implementation
   (sdpa, eager, and flash_attention_2 in bf16 when ``flash_attn`` is importable, reported apart:
   FA2 has no fp32 kernels, so bf16 noise between a cached and an uncached pass may flip a token);
   L=0 equals ``generate`` token for token (fp32 and bf16); bf16 EGLR runs end with finite logits.
   The continuous engine (its own slot attention, whatever ``--attn``) equals the naive reference
   too, for the same L and gates (``continuous_fp32``).
2. ``placement``: a ``device_map`` that puts half the layers on the GPU and the rest on the CPU
   (accelerate's CPU offload, what ``parallelize=True`` gives) yields the same tokens as one device.
3. ``speed`` (full shapes, bf16): per batch size (``--batches``), the modes of ``SPEED_MODES`` in
   this order: ``generate_static`` (``generate`` with a static cache, compiled by transformers on
   CUDA: the anchor), the continuous engine's step captured (``cL0c``/``cL10c``: ``--compile``,
   auto = reduce-overhead, CUDA graphs per bucket; skipped where it resolves to eager), the
   continuous engine eager (``cL0``/``cL10``), transformers' dynamic ``generate`` (what lm-eval's
   ``hf`` calls), and the hook engine (``L0``/``L10``, engine=hook). Each mode is warmed up over the
   full length (``warmup_s``: compilation included), then timed ``--repeats`` times: the median
   and the min are reported, ratios use the medians; ms per step. Also rho, P(step gated), mean
   iterations, the FLOP ratio, the per-row and batched bounds from ``EglrStats``, whether the
   captured step's greedy tokens equal the eager step's, and on CUDA a profile of each mode
   (``--profile_tokens`` tokens): GPU kernel time / wall (busy), kernel launches and host syncs
   per step. ``goals`` holds the targets of ``speed.GOALS`` with their values (judged on full-size CUDA runs).
   The continuous engine's K/V bucket holds the whole run (``--speed_kv_bucket``): one width.
   Each captured mode also reports its warm-up split: the engine's ``warmup_report()``
   (compilations, CUDA-graph captures, the seconds of each, compilations after warm-up; null while
   the engine has none) and, counted here, the graphs dynamo compiled in the warm-up and in the timed runs.
4. ``memory`` (CUDA only): peak allocated memory of EGLR L=10 / L=0 at a 3,072-token context.
5. ``pool`` (only when named in ``--checks``): ``--pool_prompts`` prompts of ``--pool_prompt_lens``
   tokens, each request with its own new-token limit (``--pool_new_tokens``: rows end at different
   lengths, no EOS), ``--pool_batch`` rows: tokens/s of the continuous engine captured at L=0 (``cL0c``)
   and over the pool L=1..10 at T=0 in one run (``cpoolc``), refilling freed slots, against
   transformers' static compiled ``generate`` and dynamic ``generate`` in batches, on the same prompts;
   each mode warmed up on ``--pool_warmup_prompts`` prompts, then timed once over all of them.

Time (``--budget_s``, per family; 540 s at full size, for a 10-minute call): a part or a speed
mode starts only while time is left (a mode at a later batch only if the time it took at the batch
before is left), an alarm interrupts the part that runs when the time is spent, and the JSON says
what was interrupted and what was skipped. The JSON is rewritten after every part and every mode.

tau_h is set per model from its own greedy (L=0) entropies: the 95th percentile (rho ~ 5 %).

    python benchmarks/gpu_check.py --out gpu_check.json                  # everything, full shapes, CUDA
    python benchmarks/gpu_check.py --families llama-3.1-8b --checks exactness,speed --attn sdpa --batches 16,64 \
        --new_tokens 128 --repeats 2 --profile_tokens 16 --out llama.json   # one family
    python benchmarks/gpu_check.py --size tiny --device cpu --out tiny.json   # seconds, CPU
    python benchmarks/gpu_check.py --families qwen2.5-3b --checks pool --out pool.json   # the pool check

The command is ``benchmarks/gpu_check.py``; the code is this package, one module per check:
``models`` (the families, random-weight models), ``common`` (decoding, calibration, the captured modes' plan),
``exactness``, ``placement``, ``speed``, ``memory``, ``pool``, ``budget`` (``--budget_s``), ``cli`` (the flags)
and ``run`` (``main``: runs the checks, writes the report).
"""

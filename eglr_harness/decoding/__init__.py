"""EGLR decoding. This folder: what both engines share (the pure tensor maths in ``functional``, the seeded
sampler, logits processors, model introspection, the engine contract, decode statistics, the ``compile``
setting, the refinement's per-row state in ``refine_state``, which the vLLM model uses too); ``hook/``: the hook
engine (engine=hook, ``eglr_generate`` inside transformers' ``generate``);
``continuous/``: the continuous engine (one compile-once step over K/V slots).

Imports only ``eglr_harness.core`` (tests/test_layers.py): never lm_eval, never the run layer.

Shape letters, one legend for every module of the package:

- B the batch: the rows of a ``generate`` batch (engine=hook), the continuous engine's slots (+1 trash slot)
- G the rows taking part in one call (a refinement pass, a layer, a prefill chunk, a step's settle);
  in a continuous step G = A + R, A advancing rows and R refining rows
- Q query positions of a call, S key positions (the keys' sequence length)
- C the continuous engine's K/V storage columns (its capacity; the token history is as wide),
  W the columns a decoding step reads (W <= C)
- D hidden size, V vocabulary, M candidate tokens of a draw
- H query heads, Hkv key/value heads, d head size (the rotary angles' width too)
- N decoder layers, L the layer span re-applied, k refinement iterations (T is the temperature only)
- F the fields of a continuous step's read (``step_state.READ_FIELDS``)
"""

"""The EGLR decoding engines: pure tensor maths, model introspection, the hook engine (engine=hf), the
continuous engine, sampling, accounting.

Never imports lm_eval (imports go one way: the lm-eval adapter imports this package).

Shape letters, one legend for every module of the package:

- B the batch: the rows of a ``generate`` batch (engine=hf), the continuous engine's slots (+1 trash slot)
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

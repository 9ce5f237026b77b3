"""The hook engine: EGLR inside transformers' ``generate`` (``eglr_generate``, a ``custom_generate``), with
the refiner that re-applies the top L layers to the fused state."""

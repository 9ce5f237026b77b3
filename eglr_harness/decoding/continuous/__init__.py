"""The continuous engine: one fixed-shape, compile-once step over K/V slots, with its scheduler
(admission, prefill chunks, retirement), step keys (buckets) and captured step graphs."""

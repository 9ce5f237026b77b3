"""The lm-eval boundary: the ``eglr-hf`` model, the autoload hook and the command lines.

Nothing else in eglr_harness imports lm-eval, except ``scoring`` (its filters and metrics are
registered with lm-eval). Imported at interpreter start through the autoload ``.pth``: keep light.
"""

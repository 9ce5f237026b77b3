"""The lm-eval boundary: the ``eglr-hf`` model, the task filters and their registration, the
autoload hook and the command lines (``eglr-eval``, ``eglr-calibrate``, ``eglr-score``).

Nothing outside this folder imports lm-eval. Imported at interpreter start through the autoload
``.pth``: keep this file light.
"""

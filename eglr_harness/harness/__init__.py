"""The lm-eval boundary: the ``eglr-hf`` and ``eglr-vllm`` models, the task filters and their registration,
the autoload hook, lm-eval's CLI for ``eglr-eval``, calibration runs and rescoring of lm-eval's files.

Nothing outside this folder imports lm-eval (tests/test_layers.py). Imported at interpreter start through the
autoload ``.pth``: keep this file light.
"""

"""The EGLR decoding engine: pure tensor maths, model introspection, hooks, sampling, accounting.

Never imports lm_eval (imports go one way: the lm-eval adapter imports this package).
"""

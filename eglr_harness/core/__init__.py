"""Core types and files: the leaves every layer shares (cells, EGLR settings, specs, signals, votes,
rollouts, names, errors, the run format and file helpers). Imports no other layer of the package, and
nothing heavy at import (no torch, no transformers, no lm-eval)."""

"""A run's bookkeeping, below the lm-eval adapter: pools, settings and their precedence, tau_h calibration,
compute accounting, rollout stores and presets. Imports core and decoding, never lm-eval."""

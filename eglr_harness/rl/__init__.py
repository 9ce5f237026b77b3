"""GRPO with EGLR pools: TRL's rollout function over the L×T pool and the math reward (``rollouts``; the
only importer of TRL) and the GRPO run behind ``eglr-grpo`` (``grpo``)."""

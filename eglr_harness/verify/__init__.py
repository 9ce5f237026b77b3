"""Verifiers over saved pools: ``eglr-verify RUN... --verifier SPEC --out OUT``.

A verifier scores every rollout of a run's samples (step scores and a solution score) into a copy
of the samples; ``eglr-report`` then draws best-of-N curves from them and ``eglr-export`` carries
them. Modules (one job each, imports one way: spec <- formats <- heads <- scorers <- run <- cli):

- :mod:`~eglr_harness.verify.spec` -- the ``--verifier`` value (format and weights), checked before
  anything loads;
- :mod:`~eglr_harness.verify.formats` -- each reward model's documented input: step splitting, the
  text around the steps, where the step tags go (pure, on a tokenizer);
- :mod:`~eglr_harness.verify.heads` -- from model outputs to step scores (pure tensor functions);
- :mod:`~eglr_harness.verify.scorers` -- loading a verifier and scoring batches;
- :mod:`~eglr_harness.verify.store` -- the resumable score store (sqlite, keyed by verifier and text);
- :mod:`~eglr_harness.verify.run` -- reading a run, scoring it, writing the copy;
- :mod:`~eglr_harness.commands.verify` -- the console script.

The field it writes, ``rollouts[i].verifier_scores`` (docs/run-format.md), is read by
:mod:`eglr_harness.analysis.metrics.bestofn` only.
"""

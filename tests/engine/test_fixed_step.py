"""The fixed-shape step: today's engine equals the engine before the rework token for token
(greedy, every tiny family), compiled equals eager, buckets, generation-config refusals, NaN rows."""

from __future__ import annotations

import json

import pytest

from legacy_fixture import FIXTURE, cases, engine_run, run_case

LEGACY = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: c[0])
def test_greedy_tokens_equal_the_engine_before_the_rework(case):
    name, arch, seed, settings, max_batch, headroom = case
    assert run_case(arch, seed, settings, max_batch, headroom, engine_run) == LEGACY[name]

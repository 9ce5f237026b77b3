"""The analysis's own layout, read from the source: ``analysis/metrics/`` holds the numbers that more than one place
reads (two modules of the package or more, besides ``eglr_harness.analysis``'s re-exports), and never imports the
report's sections; a figure only its own section uses lives in that section's module (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from test_layers import module_graph

pytestmark = pytest.mark.unit

METRICS = "eglr_harness.analysis.metrics."
SECTIONS = "eglr_harness.analysis.sections"
REEXPORTS = "eglr_harness.analysis"  # the package's public names: not a reader of its own


def layout_problems(graph: Mapping[str, set[str]]) -> list[str]:
    """One line per metrics module read by fewer than two other modules, or importing a section."""
    problems = []
    for module in sorted(m for m in graph if m.startswith(METRICS)):
        readers = sorted(m for m, targets in graph.items() if module in targets and m not in (module, REEXPORTS))
        if len(readers) < 2:
            problems.append(f"{module} is read by {readers or 'nothing'} only: fold it into that section's module")
        sections = sorted(t for t in graph[module] if t == SECTIONS or t.startswith(SECTIONS + "."))
        if sections:
            problems.append(f"{module} imports {sections}: the metrics sit below the sections")
    return problems


def test_every_metrics_module_is_shared_and_below_the_sections():
    graph = module_graph()
    assert any(m.startswith(METRICS) for m in graph)  # the graph reads the folder this test is about
    assert layout_problems(graph) == []


def test_the_layout_check_catches_a_single_use_metric_and_an_upward_import():
    """Broken on purpose: a metric only its own section reads (the re-export does not count), and a metric that
    reaches up to a section."""
    graph = {
        f"{METRICS}shared": {f"{SECTIONS}.x"},
        f"{METRICS}alone": set(),
        f"{SECTIONS}.x": {f"{METRICS}shared", f"{METRICS}alone"},
        f"{SECTIONS}.y": {f"{METRICS}shared"},
        REEXPORTS: {f"{METRICS}alone"},
    }
    assert layout_problems(graph) == [
        f"{METRICS}alone is read by ['{SECTIONS}.x'] only: fold it into that section's module",
        f"{METRICS}shared imports ['{SECTIONS}.x']: the metrics sit below the sections",
    ]

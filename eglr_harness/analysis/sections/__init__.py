"""The report's sections, one module each (registered with
:func:`~eglr_harness.analysis.sections.section.register_section`). The import order below is the order of
the report; a new analysis is a new module here plus its line below."""

from eglr_harness.analysis.sections import runs  # noqa: F401  Runs, Grid coverage
from eglr_harness.analysis.sections import accuracy  # noqa: F401  Accuracy per cell
from eglr_harness.analysis.sections import oracle  # noqa: F401  Cumulative oracle
from eglr_harness.analysis.sections import pools  # noqa: F401  Pools (Table 5)
from eglr_harness.analysis.sections import intervals  # noqa: F401  Confidence intervals
from eglr_harness.analysis.sections import disagreement  # noqa: F401  Disagreement, exclusive, marginal
from eglr_harness.analysis.sections import budget  # noqa: F401  Majority vote and oracle vs budget
from eglr_harness.analysis.sections import compute  # noqa: F401  Compute
from eglr_harness.analysis.sections import accuracy_vs_compute  # noqa: F401  Accuracy against compute
from eglr_harness.analysis.sections import ablation  # noqa: F401  Ablation (one setting at a time)
from eglr_harness.analysis.sections import rules  # noqa: F401  Exit rules at equal compute
from eglr_harness.analysis.sections import resampling  # noqa: F401  Re-sampling check (depth vs seed diversity)
from eglr_harness.analysis.sections import selection  # noqa: F401  Selection by signals
from eglr_harness.analysis.sections import bestofn  # noqa: F401  Best-of-N with verifiers

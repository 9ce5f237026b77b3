"""A CPU stand-in for a CUDA graph, for the continuous engine's graph tests (tests/decoding)."""

from __future__ import annotations


class ReplayGraph:
    """A CPU stand-in for ``step_graphs.CudaGraph`` with a CUDA graph's semantics: what the step read
    as Python values and which tensors it used are fixed when it is recorded; a replay recomputes on
    those tensors' current contents into the recorded output. (Recording runs the step once more, on the
    trash slot the engine records on, which a CUDA recording would not: harmless, that slot is never read.)"""

    def __init__(self, pool, stream):
        self.step = None

    def warm_up(self, step):
        step()

    def record(self, step):
        self.step = step
        self.out = step()
        return self.out

    def replay(self):
        self.out.copy_(self.step())

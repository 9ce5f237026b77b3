"""The ``--verifier`` value: ``FORMAT:PATH`` (a local folder or hub id of the weights) or
``self:p_true`` / ``self:certainty`` (the run's own model). Checked before anything loads."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORMATS", "SELF_KINDS", "VerifierSpec", "parse_spec"]

# format -> what it is (the help text and the error message list them)
FORMATS = {
    "qwen-prm": "two-label token head read at `<extra_0>` after each step (Qwen2.5-Math-PRM)",
    "shepherd": "P(+) over the `+`/`-` tokens at the step tag `ки` (math-shepherd)",
    "value-head": "sigmoid of a one-label token head at each step end (Skywork-o1-Open-PRM)",
    "orm": "sequence classifier, one scalar per solution (outcome reward model)",
}
SELF_KINDS = {
    "p_true": "P(True) of the run's own model asked whether the proposed solution is true",
    "certainty": "self-certainty of the run's own model: mean over tokens of KL(uniform || p)",
}


@dataclass(frozen=True)
class VerifierSpec:
    """A parsed ``--verifier``: ``format`` (a :data:`FORMATS` key or ``self``) and ``target`` (the
    weights, or the :data:`SELF_KINDS` key). ``key`` is the spec as written, which names the scores."""

    format: str
    target: str

    @property
    def key(self) -> str:
        return f"{self.format}:{self.target}"

    @property
    def is_self(self) -> bool:
        return self.format == "self"


def _allowed() -> str:
    return ", ".join([f"{f}:PATH" for f in FORMATS] + [f"self:{k}" for k in SELF_KINDS])


def parse_spec(text: str) -> VerifierSpec:
    """``"qwen-prm:/models/prm"`` -> ``VerifierSpec("qwen-prm", "/models/prm")``; a ValueError that
    names the value and the allowed forms otherwise (nothing is loaded)."""
    fmt, sep, target = str(text).partition(":")
    fmt, target = fmt.strip(), target.strip()
    if not sep or not target or (fmt not in FORMATS and fmt != "self"):
        raise ValueError(f"`--verifier`={text!r} is not allowed; allowed: {_allowed()} "
                         "(PATH: a local folder or hub id of the verifier's weights).")
    if fmt == "self" and target not in SELF_KINDS:
        raise ValueError(f"`--verifier`={text!r} is not allowed; allowed self-verifiers: "
                         f"{', '.join('self:' + k for k in SELF_KINDS)}.")
    return VerifierSpec(fmt, target)

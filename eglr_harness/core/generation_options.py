"""Generation options (``generate``'s settings): the one check of their values, and which of them the
continuous engine applies.

The options reach a run from four places: a task's ``generation_kwargs`` (YAML), ``--gen_kwargs``,
model args (``top_k``, ``top_p``) and the model's own ``generation_config``. Every one is checked
here, by :func:`check_generation_options`, wherever its value is first known: ``--gen_kwargs``
before the weights load (``harness/eglr_args.py``), the ``generation_config`` right after it, a
task's options before anything of the task is decoded. An invalid value is a ``ValueError`` naming
the option as written, its value, where it came from and what is allowed, whatever the engine;
it is never a reason to fall back to another engine. The limits are the run's (``core/config.py``): ``top_k``
and ``top_p`` are checked by their settings' rules (``SETTING_RULES``), the one table ``--model_args`` and the
readers of a run's files use, and no number is beyond 2**53 (``HUGE``).

A valid option that the continuous engine does not apply (beams, typical-p, ...) is a different
thing: :func:`continuous_refusals` names it, and under ``engine=auto`` the request decodes with
``engine=hook`` (one log line per reason); ``engine=continuous`` refuses it.

Light on purpose (no torch): the autoload hook calls it before the model loads.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping

from eglr_harness.core.config import HUGE, SETTING_RULES
from eglr_harness.core.errors import GenerationOptionError

__all__ = ["APPLIED_BY_CONTINUOUS", "LENGTH_OPTIONS", "SAMPLING_OPTIONS", "check_generation_options",
           "continuous_refusals", "generation_config_options", "refuse_for_continuous"]

# The options that carry a request's EGLR cell and sampling (EglrConfig), not a processor.
SAMPLING_OPTIONS = frozenset({"do_sample", "temperature", "top_k", "top_p"})
# lm-eval's names for the length limit (``normalize_gen_kwargs`` turns them into max_gen_toks) and its stop strings.
LENGTH_OPTIONS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
LM_EVAL_OPTIONS = frozenset({*LENGTH_OPTIONS, "until"})
# generate's logits processors that the continuous engine applies itself (decoding/processors.py).
APPLIED_BY_CONTINUOUS = ("repetition_penalty", "no_repeat_ngram_size", "min_length", "min_new_tokens",
                         "suppress_tokens", "begin_suppress_tokens", "min_p")


def _number(v) -> bool:
    """A number a run can record: finite and within +/-``HUGE`` (2**53), the limit of every setting and figure
    (``core/config.HUGE``)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= HUGE


def _integer(v) -> bool:
    return _number(v) and float(v).is_integer()


def _token_ids(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_integer(t) and t >= 0 for t in v)


def _setting(name: str) -> tuple[Callable[[object], bool], str]:
    """An option that is also an EGLR setting (``top_k``, ``top_p``): the setting's own rule
    (``core/config.SETTING_RULES``), a whole float taken for an int as lm-eval may parse one (``5.0``)."""
    rule = SETTING_RULES[name]
    return (lambda v: (_integer(v) and rule.accepts(int(v))) if rule.integer else (_number(v) and rule.accepts(v)),
            rule.allowed)


UP_TO = "at most 2**53"  # HUGE, as the messages say it
# option -> (is the value allowed, what is allowed). None is always allowed (= generate's default). Every number is
# within 2**53 (``_number``), as every setting of a run is.
RULES: dict[str, tuple[Callable[[object], bool], str]] = {
    **{name: (lambda v: _integer(v) and v >= 1, f"an int >= 1, {UP_TO}") for name in LENGTH_OPTIONS},
    "until": (lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v)),
              "a string or a list of strings"),
    "do_sample": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (lambda v: _number(v) and v >= 0, f"a float >= 0, {UP_TO} (0 = greedy)"),
    "top_k": _setting("top_k"),
    "top_p": _setting("top_p"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "a float in [0, 1] (0 = off)"),
    "typical_p": (lambda v: _number(v) and 0 < v <= 1, "a float in (0, 1] (1 = off)"),
    "epsilon_cutoff": (lambda v: _number(v) and 0 <= v < 1, "a float in [0, 1) (0 = off)"),
    "eta_cutoff": (lambda v: _number(v) and 0 <= v < 1, "a float in [0, 1) (0 = off)"),
    "repetition_penalty": (lambda v: _number(v) and v > 0, f"a float > 0 (1.0 = off), {UP_TO}"),
    "encoder_repetition_penalty": (lambda v: _number(v) and v > 0, f"a float > 0 (1.0 = off), {UP_TO}"),
    "no_repeat_ngram_size": (lambda v: _integer(v) and v >= 0, f"an int >= 0 (0 = off), {UP_TO}"),
    "encoder_no_repeat_ngram_size": (lambda v: _integer(v) and v >= 0, f"an int >= 0 (0 = off), {UP_TO}"),
    "min_length": (lambda v: _integer(v) and v >= 0, f"an int >= 0 (0 = off), {UP_TO}"),
    "min_new_tokens": (lambda v: _integer(v) and v >= 0, f"an int >= 0 (0 = off), {UP_TO}"),
    "suppress_tokens": (_token_ids, f"a list of token ids >= 0, {UP_TO}"),
    "begin_suppress_tokens": (_token_ids, f"a list of token ids >= 0, {UP_TO}"),
    "bad_words_ids": (lambda v: isinstance(v, (list, tuple)) and all(_token_ids(w) and w for w in v),
                      f"a list of non-empty lists of token ids >= 0, {UP_TO}"),
    "num_beams": (lambda v: _integer(v) and v >= 1, f"an int >= 1 (1 = no beam search), {UP_TO}"),
    "num_beam_groups": (lambda v: _integer(v) and v >= 1, f"an int >= 1, {UP_TO}"),
    "num_return_sequences": (lambda v: _integer(v) and v == 1, "1 (lm-eval reads one sequence per request)"),
    "length_penalty": (_number, "a float in [-2**53, 2**53]"),
    "diversity_penalty": (lambda v: _number(v) and v >= 0, f"a float >= 0, {UP_TO}"),
    "guidance_scale": (lambda v: _number(v) and v >= 0, f"a float >= 0 (1 = off), {UP_TO}"),
}

# setting -> test that it is active, as transformers' ``GenerationMixin._get_logits_processor`` decides;
# the processors the continuous engine does not apply.
_NOT_APPLIED = {
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "encoder_no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "bad_words_ids": lambda v: v is not None,
    "sequence_bias": lambda v: v is not None,
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "remove_invalid_values": lambda v: v is True,
    "exponential_decay_length_penalty": lambda v: v is not None,
    "guidance_scale": lambda v: v is not None and v != 1,
    "watermarking_config": lambda v: v is not None,
    "renormalize_logits": lambda v: v is True,
    "num_beams": lambda v: v is not None and v > 1,
    "top_h": lambda v: v is not None,
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
}


def _known_names() -> frozenset[str]:
    """Every option ``generate`` takes by name (a ``GenerationConfig`` attribute) and lm-eval's own."""
    from transformers import GenerationConfig  # noqa: PLC0415 -- only when options are checked

    return frozenset({*vars(GenerationConfig()), *RULES, *_NOT_APPLIED, *LM_EVAL_OPTIONS})


def check_generation_options(options: Mapping, source: str, *, ignore: frozenset[str] | set[str] = frozenset(),
                             written: Mapping[str, str] | None = None) -> None:
    """``GenerationOptionError`` (a ``ValueError``) for the first option of ``options`` that ``generate``
    (or lm-eval) does not know, or whose value is not allowed: one line naming the option as written,
    its value, ``source`` (where it came from, e.g. ``--gen_kwargs``) and what is allowed.

    ignore: names another check owns (the pool keys ``eglr_L``, ...); written: the values as the user
    typed them, where known (lm-eval parses ``-2`` on the command line as ``-2.0``).
    """
    known = None
    for name, value in options.items():
        if name in ignore:
            continue
        shown = written[name] if written and name in written else _as_written(value)
        rule = RULES.get(name)
        if rule is not None:
            ok, allowed = rule
            if value is not None and not ok(value):
                raise GenerationOptionError(f"`{name}`={shown} ({source}) is not allowed; allowed: {allowed}.")
            continue
        known = known if known is not None else _known_names()
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.7)
            hint = f"; did you mean {' or '.join(f'`{c}`' for c in close)}?" if close else ""
            raise GenerationOptionError(f"`{name}`={shown} ({source}) is not a generation option of transformers' "
                                        f"generate or lm-eval{hint}")


def _as_written(value) -> str:
    """A value as a user writes it on the command line (``true``, not ``True``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def generation_config_options(generation_config) -> dict:
    """The options of a model's ``generation_config`` that apply to eglr-hf's decoding (set, not None):
    its logits processors, applied or not; the sampling and length settings come from the cell and the
    task, never from it."""
    if generation_config is None:
        return {}
    names = [n for n in RULES if n not in SAMPLING_OPTIONS and n not in LM_EVAL_OPTIONS] + list(_NOT_APPLIED)
    return {n: getattr(generation_config, n) for n in dict.fromkeys(names) if getattr(generation_config, n,
                                                                                      None) is not None}


def continuous_refusals(options: Mapping, generation_config=None) -> list[str]:
    """``name=value`` of each valid option that the continuous engine does not apply: ``options`` (a
    request's own, as ``generate`` takes them) over ``generation_config``. Empty: it applies them all."""

    def setting(name):
        return options[name] if name in options else getattr(generation_config, name, None)

    applied = {*SAMPLING_OPTIONS, *APPLIED_BY_CONTINUOUS}
    refused = [f"{n}={_as_written(setting(n))}" for n, active in _NOT_APPLIED.items() if active(setting(n))]
    return refused + [f"{n}={_as_written(options[n])}" for n in sorted(options)
                      if n not in applied and n not in _NOT_APPLIED and n not in LM_EVAL_OPTIONS]


def refuse_for_continuous(refused: list[str], source: str) -> None:
    """``GenerationOptionError`` naming ``refused`` (``continuous_refusals``) when ``engine=continuous`` was asked
    for."""
    if refused:
        raise GenerationOptionError(
            f"engine=continuous does not apply the generation setting(s) {', '.join(refused)} ({source}); it applies "
            f"{', '.join(APPLIED_BY_CONTINUOUS)} and temperature/top_k/top_p. Use engine=hook (any option of generate) "
            "or engine=auto (continuous for the requests whose options it applies, hf for the others).")

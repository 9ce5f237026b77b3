"""The leaderboard's runs and their stock ``lm_eval`` command lines (pure functions).

For each benchmark ``<b>`` the comparison set of the paper (Tables 2/3) needs:

| run | model | task | gen kwargs | gives the rows |
|---|---|---|---|---|
| ``greedy`` | ``eglr-baseline`` | ``<b>_eglr`` | ``do_sample=False`` | Greedy |
| ``beam<n>`` | ``eglr-baseline`` | ``<b>_eglr`` | ``do_sample=False,num_beams=n`` | Beam-n |
| ``eglr_sc`` | ``eglr-hf`` | ``<b>_eglr_sc`` | — | EGLR (best L), EGLR-SC_L (B=10), Oracle_L |

The baselines run on ``eglr-baseline``: lm-eval's ``hf`` with each beam ended by its own stop string (stock ``hf``
ends every beam of a batch at a batch-mate's stop: docs/baselines.md), each answer's finish and search tokens
recorded, so that a beam row is charged its real compute.

``--model_args`` names the model by ``pretrained=...`` or by a preset, ``model_config=NAME``: the
baseline runs get the preset's model args spelled out, ``eglr-hf`` gets ``model_config=NAME`` itself
(so its EGLR settings and calibrated tau_h apply).

One ``eglr_sc`` run gives three rows: its L-only pool (L ∈ 1..10, T = 0) holds every per-L
accuracy. ``max_gen_toks`` is passed as a gen kwarg to every run. Each run writes to
``<output_dir>/<b>/<run>/`` (its ``--output_path``).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.analysis.load import parse_model_args
from eglr_harness.core.benchmark_names import benchmark_of

__all__ = [
    "LeaderboardOptions",
    "PlannedRun",
    "model_slug",
    "default_output_dir",
    "plan_runs",
    "check_eglr_settings",
    "check_plan",
    "eglr_settings",
    "check_tasks_exist",
    "setting_value",
    "gen_kwargs_arg",
    "build_command",
    "shell_command",
    "parse_beams",
    "parse_limit",
    "hf_model_args",
    "eglr_hf_model_args",
    "lm_eval_flags",
    "LM_EVAL_FLAG_ARGS",
]

_NAME = re.compile(r"[A-Za-z0-9_\-]+")


def parse_beams(spec: str | None) -> tuple[int, ...]:
    """``'4,11'`` -> ``(4, 11)``; ``''``/``'none'`` -> ``()`` (no beam rows). ``0`` is refused with the
    others below 2 (it read as "none", silently)."""
    if spec is None or spec.strip().lower() in {"", "none"}:
        return ()
    beams = []
    for part in spec.split(","):
        # ASCII digits only: int() reads a full-width '２' as 2
        n = int(part) if re.fullmatch(r"\s*[0-9]+\s*", part) else 0
        if n < 2:
            raise ValueError(
                f"`--beams`={spec!r}: {part!r} is not a beam count; allowed: ints >= 2 (e.g. 4,11) or 'none'."
            )
        beams.append(n)
    return tuple(dict.fromkeys(beams))


def parse_limit(spec: str | None) -> tuple[float | None, tuple[tuple[str, float], ...]]:
    """``'100'`` -> ``(100, ())``; ``'gsm8k=100,math500=50'`` -> ``(None, (('gsm8k', 100), ('math500', 50)))``.

    A bare number is the limit of every benchmark not named; ``bench=N`` sets one benchmark's.
    """
    if spec is None or not str(spec).strip():
        return None, ()
    default, per_bench = None, []
    for part in str(spec).split(","):
        name, _, value = part.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number > 0 or (name and not _NAME.fullmatch(name.strip())):
            raise ValueError(
                f"`--limit`={spec!r}: {part!r} is not allowed; allowed: a count >= 1 or a fraction in (0, 1), "
                "for every benchmark (100) or per benchmark (gsm8k=100,math500=50)."
            )
        if name:
            per_bench.append((benchmark_of(name), number))
        elif default is not None:
            raise ValueError(f"`--limit`={spec!r} gives two limits for all benchmarks; give one bare number at most.")
        else:
            default = number
    return default, tuple(per_bench)


# lm-eval 0.4.13 hands these to the model's constructor itself, from its own flags and their defaults
# (``--device`` defaults to cuda:0): the same name among the model args fails, for every model, with
# ``TypeError: HFLM() got multiple values for keyword argument 'device'``. They travel as flags.
LM_EVAL_FLAG_ARGS = ("device", "batch_size", "max_batch_size")


def _preset_args(args: dict) -> dict:
    """``args`` with a ``model_config=NAME`` preset's model args spelled out (the user's args win)."""
    if args.get("model_config") is None:
        return args
    from eglr_harness.run.presets import preset_of, under_preset  # noqa: PLC0415 -- only presets need it

    return under_preset(preset_of(args["model_config"]), args)


def hf_model_args(model_args: str) -> str:
    """``--model_args`` of lm-eval's ``hf``: a ``model_config=NAME`` preset becomes its model args, and the
    args lm-eval passes as flags (:data:`LM_EVAL_FLAG_ARGS`) are left out (:func:`lm_eval_flags` has them)."""
    merged = _preset_args(parse_model_args(model_args))
    return ",".join(f"{key}={value}" for key, value in merged.items() if key not in LM_EVAL_FLAG_ARGS)


def eglr_hf_model_args(model_args: str) -> str:
    """``--model_args`` of ``eglr-hf``: as given (the preset by name, so its EGLR settings and tau_h apply),
    less the args lm-eval passes as flags."""
    args = parse_model_args(model_args)
    return ",".join(f"{key}={value}" for key, value in args.items() if key not in LM_EVAL_FLAG_ARGS)


def lm_eval_flags(model_args: str) -> dict[str, str]:
    """``{"device": "cpu", ...}``: the :data:`LM_EVAL_FLAG_ARGS` that ``model_args`` or its preset set, as
    lm-eval flags (``--device cpu``), for every run of the model (hf and eglr-hf alike)."""
    merged = _preset_args(parse_model_args(model_args))
    return {key: str(merged[key]) for key in LM_EVAL_FLAG_ARGS if merged.get(key) is not None}


def setting_value(text: str):
    """A --model_args string as lm-eval reads it: an int, else a float, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def eglr_settings(model_args: str, flag: str = "--model_args"):
    """The eglr settings in ``model_args`` (and its preset's) resolved as eglr-hf resolves them
    (``run/run_args.resolve_run_args``, each value read as lm-eval reads the text: :func:`setting_value`), so that a
    bad value stops a sweep or a leaderboard before its first run; ``flag`` names where they came from in the one-line
    ``ValueError``. Returns the ``RunArgs``."""
    from eglr_harness.core.model_args import EGLR_ARGS  # noqa: PLC0415
    from eglr_harness.run.run_args import resolve_run_args  # noqa: PLC0415

    args = parse_model_args(model_args)
    own = {k: setting_value(v) if isinstance(v, str) and k != "model_config" else v for k, v in args.items()
           if k in EGLR_ARGS}
    try:
        return resolve_run_args(own)
    except ValueError as err:
        raise ValueError(f"`{flag}`: {err}") from None


def check_eglr_settings(model_args: str, flag: str = "--model_args") -> None:
    """:func:`eglr_settings`, for its refusal."""
    eglr_settings(model_args, flag)


def model_slug(model_args: str) -> str:
    """A folder name for the model: the preset name, the GGUF file stem, else the last part of ``pretrained``."""
    args = parse_model_args(model_args)
    preset = args.get("model_config") if "pretrained" not in args else None
    name = Path(preset).stem if preset else args.get("gguf_file") or args.get("pretrained") or "model"
    name = Path(str(name).rstrip("/")).name
    if name.endswith(".gguf"):
        name = name[: -len(".gguf")]
    return re.sub(r"[^A-Za-z0-9._\-]+", "_", name) or "model"


def default_output_dir(model_args: str) -> Path:
    """``out/leaderboard/<model>`` (relative to the working directory): never a checkout's committed
    ``results/``, whose runs a rerun would otherwise take for finished ones of its own."""
    return Path("out") / "leaderboard" / model_slug(model_args)


@dataclass(frozen=True)
class LeaderboardOptions:
    """What ``eglr-leaderboard`` was asked for (validated)."""

    model_args: str
    tasks: tuple[str, ...]
    output_dir: Path
    beams: tuple[int, ...] = (4, 11)
    limit: float | None = None  # every benchmark not in ``limits``
    limits: tuple[tuple[str, float], ...] = ()  # (benchmark, limit) overrides
    max_gen_toks: int | None = None
    batch_size: str | None = None
    beam_batch_size: str | None = None  # beam runs hold num_beams rows per problem; None: batch_size
    device: str | None = None
    apply_chat_template: bool = False
    eglr_model_args: str = ""
    greedy_suffix: str = "_eglr"
    sc_suffix: str = "_eglr_sc"
    hf_model: str = "eglr-baseline"  # the baselines' model (module docstring); lm-eval's hf args
    eglr_model: str = "eglr-hf"
    lm_eval_args: tuple[str, ...] = ()
    python: str = field(default=sys.executable)

    def __post_init__(self) -> None:
        if not {"pretrained", "model_config"} & set(parse_model_args(self.model_args)):
            raise ValueError(
                f"`--model_args`={self.model_args!r} names no model; write pretrained=PATH_OR_HUB_ID[,gguf_file=FILE] "
                "or model_config=PRESET."
            )
        hf_model_args(self.model_args)  # an unknown preset fails here, naming the known ones
        if not self.tasks:
            raise ValueError("`--tasks` is empty; give benchmarks such as gsm8k,math500.")
        benchmarks = [benchmark_of(t) for t in self.tasks]
        if len(set(benchmarks)) != len(benchmarks):
            raise ValueError(f"`--tasks`={list(self.tasks)} names a benchmark twice; give each once.")
        for bench, limit in ((None, self.limit), *self.limits):
            if limit is not None and not limit > 0:
                raise ValueError(f"`--limit`={limit} is not allowed; allowed: a count >= 1 or a fraction in (0, 1).")
        if unknown := sorted({b for b, _ in self.limits} - set(benchmarks)):
            raise ValueError(
                f"`--limit` names {unknown}, which are not among `--tasks` ({sorted(benchmarks)}); "
                "allowed: benchmarks of --tasks."
            )
        if self.max_gen_toks is not None and self.max_gen_toks < 1:
            raise ValueError(f"`--max_gen_toks`={self.max_gen_toks} is not allowed; allowed: an int >= 1.")
        for n in self.beams:
            if n < 2:
                raise ValueError(f"beam count {n} is not allowed; allowed: ints >= 2.")

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(benchmark_of(t) for t in self.tasks)

    def limit_for(self, benchmark: str) -> float | None:
        """The ``--limit`` of one benchmark (None: all problems)."""
        return dict(self.limits).get(benchmark, self.limit)


@dataclass(frozen=True)
class PlannedRun:
    """One lm_eval invocation of the leaderboard."""

    kind: str  # "greedy" | "beam" | "eglr_sc"
    name: str  # folder name: greedy, beam4, eglr_sc
    benchmark: str
    task: str
    model: str
    model_args: str
    gen_kwargs: tuple[tuple[str, object], ...]
    output_path: Path
    num_beams: int | None = None
    limit: float | None = None


def check_plan(opts: LeaderboardOptions) -> None:
    """Before the first run: the batch sizes, the flags the model args repeat, every task exists and
    eglr-hf would accept its settings."""
    check_flags(opts)
    check_tasks_exist(opts)
    check_eglr_settings(opts.model_args)
    if opts.eglr_model_args.strip(","):
        check_eglr_settings(opts.eglr_model_args, "--eglr_model_args")


def check_flags(opts: LeaderboardOptions) -> None:
    """``ValueError`` for a batch size lm-eval would refuse in every run (``--batch_size -3``), and for a
    ``device`` or ``batch_size`` in ``--model_args`` that a flag contradicts (one of them was dropped)."""
    from eglr_harness.core.model_args import check_load_values  # noqa: PLC0415

    for flag, value in (("--batch_size", opts.batch_size), ("--beam_batch_size", opts.beam_batch_size)):
        try:
            read = check_load_values({"batch_size": value}).get("batch_size")
            if read is not None and str(read) != str(value).strip():  # each run hands lm-eval the text: 3.0 fails
                raise ValueError
        except ValueError:
            raise ValueError(f"`{flag}`={value!r} is not allowed; allowed: an int >= 1, auto or auto:N.") from None
    given = parse_model_args(opts.model_args)  # as written: a preset's device gives way to a flag, by design
    for name, flag in (("device", opts.device), ("batch_size", opts.batch_size)):
        if flag is not None and given.get(name) is not None and str(given[name]) != str(flag):
            raise ValueError(f"`{name}={given[name]}` in --model_args contradicts `--{name} {flag}`; allowed: one of "
                             f"them (each run gets it as lm-eval's --{name}).")


def check_tasks_exist(opts: LeaderboardOptions) -> None:
    """Every run's task is one of ours (``--lm_eval_args --include_path`` lifts this): ``ValueError`` before
    anything runs, naming the benchmarks that have both tasks and the closest task names."""
    if any(arg.startswith("--include_path") for arg in opts.lm_eval_args):
        return
    from eglr_harness.core.model_args import close_task_names  # noqa: PLC0415
    from eglr_harness.core.resources import task_names  # noqa: PLC0415

    known = task_names()
    suffixes = (opts.greedy_suffix, opts.sc_suffix)
    missing = [b + s for b in opts.benchmarks for s in suffixes if b + s not in known]
    if not missing:
        return
    allowed = sorted({benchmark_of(n) for n in known if all(benchmark_of(n) + s in known for s in suffixes)})
    close = {n: c[:3] for n, c in close_task_names(missing, known).items() if c}
    hint = "".join(f"; {n} -> did you mean {', '.join(c)}?" for n, c in close.items())
    raise ValueError(
        f"`--tasks`={','.join(opts.tasks)}: no task {', '.join(missing)}; allowed benchmarks (each runs "
        f"<b>{opts.greedy_suffix} and <b>{opts.sc_suffix}): {', '.join(allowed)}{hint}"
    )


def plan_runs(opts: LeaderboardOptions) -> list[PlannedRun]:
    """All runs for ``opts``, benchmark by benchmark: greedy, beams, then the EGLR-SC run."""
    tokens = (("max_gen_toks", opts.max_gen_toks),) if opts.max_gen_toks else ()
    eglr_args = eglr_hf_model_args(
        opts.model_args + ("," + opts.eglr_model_args.strip(",") if opts.eglr_model_args.strip(",") else "")
    )
    hf_args = hf_model_args(opts.model_args)
    runs = []
    for bench in opts.benchmarks:
        base = Path(opts.output_dir) / bench
        limit = opts.limit_for(bench)
        greedy_task = bench + opts.greedy_suffix
        runs.append(
            PlannedRun(
                "greedy",
                "greedy",
                bench,
                greedy_task,
                opts.hf_model,
                hf_args,
                (("do_sample", False), *tokens),
                base / "greedy",
                limit=limit,
            )
        )
        for n in opts.beams:
            runs.append(
                PlannedRun(
                    "beam",
                    f"beam{n}",
                    bench,
                    greedy_task,
                    opts.hf_model,
                    hf_args,
                    (("do_sample", False), ("num_beams", n), *tokens),
                    base / f"beam{n}",
                    num_beams=n,
                    limit=limit,
                )
            )
        runs.append(
            PlannedRun(
                "eglr_sc",
                "eglr_sc",
                bench,
                bench + opts.sc_suffix,
                opts.eglr_model,
                eglr_args,
                tokens,
                base / "eglr_sc",
                limit=limit,
            )
        )
    return runs


def gen_kwargs_arg(gen_kwargs: tuple[tuple[str, object], ...]) -> str:
    """``(('do_sample', False), ('num_beams', 4))`` -> ``'do_sample=False,num_beams=4'``."""
    return ",".join(f"{k}={v}" for k, v in gen_kwargs)


def _limit_arg(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() else repr(float(limit))


def build_command(run: PlannedRun, opts: LeaderboardOptions) -> list[str]:
    """The stock lm-eval 0.4.13 command line of ``run`` (``python -m lm_eval run ...``)."""
    argv = [
        opts.python,
        "-m",
        "lm_eval",
        "run",
        "--model",
        run.model,
        "--model_args",
        run.model_args,
        "--tasks",
        run.task,
        "--output_path",
        str(run.output_path),
        "--log_samples",
    ]
    if run.gen_kwargs:
        argv += ["--gen_kwargs", gen_kwargs_arg(run.gen_kwargs)]
    if run.limit is not None:
        argv += ["--limit", _limit_arg(run.limit)]
    from_args = lm_eval_flags(opts.model_args)  # the --model_args' (or preset's) device and batch size, as flags
    batch_size = opts.beam_batch_size if run.kind == "beam" and opts.beam_batch_size is not None else opts.batch_size
    batch_size = batch_size if batch_size is not None else from_args.get("batch_size")
    if batch_size is not None:
        argv += ["--batch_size", str(batch_size)]
    if from_args.get("max_batch_size") is not None:
        argv += ["--max_batch_size", from_args["max_batch_size"]]
    device = opts.device if opts.device is not None else from_args.get("device")
    if device is not None:
        argv += ["--device", device]
    if opts.apply_chat_template:
        argv += ["--apply_chat_template"]
    return argv + list(opts.lm_eval_args)


def shell_command(argv: list[str]) -> str:
    """The command as one copy-pasteable shell line."""
    return shlex.join(argv)

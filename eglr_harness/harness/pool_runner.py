"""lm-eval's generate requests of an eglr model, as pools of rollouts: the engine-agnostic half of ``eglr-hf``
and ``eglr-vllm``.

``generate`` reads top to bottom: lm-eval instances -> jobs with their ``Cell`` (``run/pool.py``) -> tau_h
per task (``run/calibration.py``) -> one ``RolloutSpec`` per job -> texts (``harness/decode.py``, either
engine) -> a ``rollout.RolloutText`` per instance; compute accounting (``run/accounting.py``) and the engines
that decoded each (task, cell) land in the results JSON under ``config.eglr`` (:meth:`eglr_info`).
"""

from __future__ import annotations

import logging
from collections import Counter

from eglr_harness.core.cell import Cell
from eglr_harness.core.config import STOP_THRESHOLD_ARGS, has_gate
from eglr_harness.core.progress import counted
from eglr_harness.core.rollout import RolloutText
from eglr_harness.harness.decode import RolloutDecoder
from eglr_harness.harness.eglr_args import EglrArgs
from eglr_harness.decoding.compile_setting import CompileChoice
from eglr_harness.decoding.contract import Engine
from eglr_harness.harness.engine_choice import engine_name, engines_said
from eglr_harness.run.accounting import RunAccounts
from eglr_harness.run.calibration import (
    cached_calibration,
    calibration_prompts,
    first_reported,
    new_calibration,
    own_prompts,
)
from eglr_harness.run.pool import Job, ResolvedPool, assign_jobs, frozen
from eglr_harness.run.stores import TauHCache, content_key

logger = logging.getLogger(__name__)


class PoolRunner:
    """One model's pools, tau_h values, accounting and engines used, across its ``generate_until`` calls.

    decoder: the model's ``RolloutDecoder`` (its engines and text codec); gather: the all-gather of the
    ranks (every rank calibrates the same tasks together); rank: this process's (rank 0 writes the tau_h
    cache); generation_config: the model's own (for a task's options under engine=continuous), or None;
    max_gen_toks, batch_size: the model's, for the plan line.
    """

    def __init__(self, args: EglrArgs, decoder: RolloutDecoder, *, num_layers: int, gather, rank: int,
                 model_name: str, generation_config=None, max_gen_toks: int, batch_size, head_layers: float = 0.0):
        self.args, self.settings, self.decoder, self.gather = args, args.settings, decoder, gather
        self.num_layers, self.rank, self.model_name = num_layers, rank, model_name
        self.label = "eglr-vllm" if args.engine == "vllm" else "eglr-hf"  # the model, in the plan line and the bar
        decoder.label = self.label  # and in the decoder's lines
        self.generation_config, self.max_gen_toks, self.batch_size = generation_config, max_gen_toks, batch_size
        self.head_layers = head_layers  # one LM-head projection in decoder layers (ModelParts.head_layers)
        self.accounts = RunAccounts(num_layers, head_layers)
        self.gathered_accounts: RunAccounts | None = None
        self.tau_h_by_task: dict[str, float] = {}
        self.pools: dict = {}
        self.calibrate_always = False  # eglr-calibrate sets it to calibrate L=0 runs too
        self.engines_by_cell: dict = {}  # (task, Cell) -> names of the engines that decoded its rollouts
        self.gathered_engines: list[dict] = [self.engines_by_cell]  # the same of every rank
        self._warned_loglikelihood = False

    # ------------------------------------------------------------------ generate_until
    def generate(self, requests, disable_tqdm: bool = False) -> list[RolloutText]:
        """A ``RolloutText`` per lm-eval instance (``generate_until``'s answer)."""
        jobs = self.jobs(requests)
        self.ensure_tau_h_of(jobs, disable_tqdm, every_task=self.calibrate_always)
        items = [(j.context, self.settings.rollout(j.gen_kwargs, j.cell, j.cycle, self.tau_h_by_task.get(j.task),
                                                   j.seed_index)) for j in jobs]
        keys = [self.decoder.key(*item) for item in items]
        self.log_plan(jobs, keys, [spec for _, spec in items])
        done = self.decoder.decode(items, stats_for=lambda config: self.accounts.stats_for(Cell(config.L, config.T)),
                                   desc=f"{self.label} generation", disable_tqdm=disable_tqdm, keys=keys)
        self.accounts.reused.update(spec.cell for spec in done.reused)
        self.gathered_accounts = self.accounts.gathered(self.gather)
        for r, j in zip(done.records, jobs):
            self.engines_by_cell.setdefault((j.task, j.cell), set()).add(r.get("engine"))
        self.gathered_engines = self.gather(self.engines_by_cell)  # every rank's rollouts (collective)
        seed = self.settings.base.seed  # a pool under several seeds labels each rollout with its own (pool.py)
        return [RolloutText(r["text"], L=j.cell.L, T=j.cell.T, cycle=j.cycle, signals=r.get("signals"),
                        engine=r.get("engine"), seed=seed + j.seed_index if j.seeds > 1 else None)
                for r, j in zip(done.records, jobs)]

    def warn_plain_scoring(self) -> None:
        """Said once: loglikelihood requests are the plain model's."""
        if not self._warned_loglikelihood:
            self._warned_loglikelihood = True
            logger.warning("%s: loglikelihood requests are scored by the plain model; EGLR changes generation "
                           "only.", self.label)

    def calibrate(self, requests, disable_tqdm: bool = False) -> dict[str, float]:
        """tau_h of every task of ``requests`` (calibrated or looked up), without decoding their rollouts."""
        self.ensure_tau_h_of(self.jobs(requests), disable_tqdm, every_task=True)
        return dict(self.tau_h_by_task)

    def forget(self) -> None:
        """Drop the rollouts and accounting of this run (benchmarks time repeated runs)."""
        self.decoder.forget()
        self.accounts = RunAccounts(self.num_layers, self.head_layers)
        self.gathered_accounts = None
        self.engines_by_cell = {}
        self.gathered_engines = [self.engines_by_cell]

    # ------------------------------------------------------------------ config.eglr
    def eglr_info(self, engine_fields: dict) -> dict:
        """``config.eglr`` of the results JSON; ``engine_fields``: the engine's entries (``engine``, ...)."""
        s = self.settings.base
        return {
            "model": self.model_name,
            "num_layers": self.num_layers,
            "preset": self.args.preset.get("name"),
            **engine_fields,
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p,
                         "seed": s.seed, **({"seeds": self.settings.seeds} if self.settings.seeds > 1 else {}),
                         # the exit rule and its threshold where it is not the paper's kl
                         **{k: v for k, v in s.as_dict().items() if k == "stop" or k in STOP_THRESHOLD_ARGS}},
            "tau_h": dict(self.tau_h_by_task),
            "stats": (self.gathered_accounts or self.accounts).summary(),
        }

    def engine_info(self, engines: list[Engine], requested: str, used: str, compile_choice: CompileChoice) -> dict:
        """eglr-hf's engine entries of ``config.eglr``: the engine(s) that decoded the rollouts (mixed: some
        cells or rollouts each), per task and cell; what the continuous engine's step ran as and what compiling
        and capturing cost it (late compilations included: should be 0); what its prefills ran."""
        engine = self.engines_said() or used  # nothing decoded yet: the engine preferred
        continuous = [e for e in engines if engine_name(e) == "continuous"]
        return {
            "engine": engine,
            "engines": self.engines_by_task(),
            "engine_requested": requested,
            # what the continuous engine's step ran as; none when every rollout went through generate
            "compile": "none" if engine == "hook" else compile_choice.recorded,
            "compile_requested": compile_choice.requested,
            # the continuous engine's warmup_report() (this rank's), None when it is not among the engines
            "compile_report": continuous[0].warmup_report() if continuous else None,
            # what its prefills ran (prompt tokens needed and run, rows that took a shared prompt's copy, seconds)
            "prefill_report": continuous[0].prefill_report() if continuous else None,
        }

    def engines_said(self) -> str | None:
        """The engine(s) that decoded every rank's rollouts so far (``continuous``, ``hook``, ``mixed``), None for
        none."""
        return engines_said(n for part in self.gathered_engines for names in part.values() for n in names)

    def engines_by_task(self) -> dict:
        """``{task: {cell label: continuous | hook | mixed}}`` of every rank's rollouts (the engine recorded
        with each; rollouts stored before the engine was recorded are left out)."""
        merged: dict = {}
        for part in self.gathered_engines:
            for task_cell, names in part.items():
                merged.setdefault(task_cell, set()).update(names)
        table: dict = {}
        for (task, cell), names in sorted(merged.items(), key=lambda item: (str(item[0][0]), item[0][1])):
            said = engines_said(names)
            if said is not None:
                table.setdefault(str(task), {})[cell.label] = said
        return table

    # ------------------------------------------------------------------ the plan line
    def log_plan(self, jobs: list[Job], keys: list[str], specs) -> None:
        """Say once, before the first token, what this call will decode and with which engine (per request:
        ``engine=auto`` hands requests with options the continuous engine does not apply to ``hook``): a long
        run should not look hung."""
        for task in sorted({j.task for j in jobs}, key=str):
            mine = [i for i, j in enumerate(jobs) if j.task == task]
            cells = sorted({jobs[i].cell for i in mine})
            distinct, stored = self.decoder.stored([keys[i] for i in mine])
            to_decode = {keys[i]: i for i in mine if self.decoder.lookup(keys[i]) is None}
            routed = Counter(self.decoder.engine_of(specs[i]) for i in to_decode.values())
            engine = ", ".join(f"{name} for {n}" for name, n in sorted(routed.items())) if len(routed) > 1 \
                else next(iter(routed), "none (all stored)")
            max_tokens = max(int(jobs[i].gen_kwargs.get("max_gen_toks", self.max_gen_toks)) for i in mine)
            logger.info("%s plan, task %s: %s, %d distinct (deterministic cells once), %d stored, %d to decode, "
                        "at most %d new tokens each, batch %s, engine %s; %s", self.label,
                        task, pool_size_text(len({jobs[i].doc_id for i in mine}), [c.label for c in cells], len(mine),
                                             self.seed_range()),
                        distinct, stored, distinct - stored, max_tokens, self.batch_size, engine,
                        self.tau_h_said(task, cells))

    def seed_range(self) -> range:
        """The seeds the pool repeats under: the base seed and the ``seeds - 1`` after it."""
        return range(self.settings.base.seed, self.settings.base.seed + self.settings.seeds)

    def tau_h_said(self, task, cells) -> str:
        """The plan line's tau_h part: where the task's tau_h came from."""
        source = self.accounts.calibration_source.get(task)
        if not any(has_gate(c.L) for c in cells):
            return "tau_h not needed (L=0 only)"
        if source is None:
            return f"tau_h = {self.tau_h_by_task.get(task, self.settings.tau_h_setting(task))} (model arg or preset)"
        how = "cached" if source.get("cached") else "decoded above"
        return (f"tau_h = {source['tau_h']:.4f} from a greedy calibration on the first {source['prompts']} prompts "
                f"({how})")

    # ------------------------------------------------------------------ pools and cells
    def jobs(self, requests) -> list[Job]:
        return assign_jobs(((r.task_name, r.doc_id, r.idx, *r.args, r.repeats) for r in requests), self.pool)

    def pool(self, task: str | None, gen_kwargs: dict, repeats: int) -> ResolvedPool:
        key = (task, frozen(gen_kwargs), repeats)
        if key not in self.pools:
            self.args.check_task_options(task, gen_kwargs, self.generation_config)
            pool = self.settings.pool_for(task, gen_kwargs, repeats)
            self.settings.check_cells(pool.cells, self.num_layers)
            pool.log(f"{self.label} task {task}", repeats)
            self.pools[key] = pool
        return self.pools[key]

    # ------------------------------------------------------------------ tau_h
    def ensure_tau_h_of(self, jobs: list[Job], disable_tqdm: bool, every_task: bool) -> None:
        """Every rank calibrates the same tasks in the same order (the steps are collective)."""
        local_tasks = {j.task for j in jobs if every_task or has_gate(j.cell.L)}
        for task in sorted({t for part in self.gather(sorted(local_tasks, key=str)) for t in part}, key=str):
            self.ensure_tau_h(task, [j for j in jobs if j.task == task], disable_tqdm)

    def ensure_tau_h(self, task: str | None, jobs: list[Job], disable_tqdm: bool) -> None:
        """tau_h of ``task``: the setting, or the calibration (collective: every rank, with or without jobs)."""
        setting = self.settings.tau_h_setting(task)
        if task in self.tau_h_by_task or setting != "auto":
            self.tau_h_by_task.setdefault(task, setting)
            return
        task_gen_kwargs = first_reported(jobs[0].gen_kwargs if jobs else None, self.gather) or {}
        greedy = self.settings.rollout(task_gen_kwargs, Cell(0, 0.0), 0, None)
        label, cache = f"{self.label} task {task} ({self.model_name})", TauHCache()
        local = sorted({(j.doc_id, j.context) for j in jobs})
        chosen = calibration_prompts(local, self.settings.calib_limit, self.gather)
        key = content_key("tau_h", self.decoder.fingerprint, [context for _doc, context in chosen],
                          greedy.key_fields())
        result = cached_calibration(cache, key, self.gather, label)
        if result is None:
            entropies = self.greedy_entropies(task, own_prompts(chosen, local, label), greedy, disable_tqdm)
            result = new_calibration(entropies, len(chosen), cache=cache, key=key, gather=self.gather,
                                     writer=self.rank == 0, label=label)
        self.tau_h_by_task[task] = result.tau_h
        self.accounts.calibration_source[task] = result.as_dict()

    def greedy_entropies(self, task, prompts: list[str], greedy, disable_tqdm: bool) -> list[float]:
        """Decode afresh (stored texts carry no entropies); the texts are reused as the L=0 rollouts."""
        done = self.decoder.decode([(p, greedy) for p in prompts], reuse=False, calibration=True,
                                   disable_tqdm=disable_tqdm,
                                   stats_for=lambda _config: self.accounts.calibration_for(task),
                                   desc=f"{self.label} tau_h calibration ({len(prompts)} greedy prompts)")
        return [e for outcome in done.outcomes if outcome is not None for e in outcome.entropies]


def pool_size_text(problems: int, cells: list[str], rollouts: int, seeds: range = range(1)) -> str:
    """``"6 problems x 10 repeats (4 cells, each run 2-3 times: L=1,T=0.0, ...) = 60 rollouts"``: the product
    that gives the rollouts, so that a pool smaller than the task's repeats (cells cycled) does not read as
    a miscount; ``"4 problems x 2 cells (L=1,T=0.0, L=2,T=0.0) = 8 rollouts"`` when each cell runs once.
    ``seeds``: the seeds the pool repeats under (``seeds=`` model arg), said when there are several."""
    shown = ", ".join(cells[:4]) + (", ..." if len(cells) > 4 else "")
    if len(seeds) > 1:
        shown += f"; the pool under seeds {seeds[0]}..{seeds[-1]} (seeds={len(seeds)})"
    if problems == 0 or rollouts == problems * len(cells):
        return (f"{counted(problems, 'problems')} x {counted(len(cells), 'cells')} ({shown}) = "
                f"{counted(rollouts, 'rollouts')}")
    repeats = rollouts / problems
    repeats_text = str(int(repeats)) if repeats.is_integer() else f"{repeats:.3g}"
    low, high = int(repeats // len(cells)), -(-int(repeats) // len(cells))
    times = f"{low}" if low == high else f"{low}-{high}"
    return (f"{counted(problems, 'problems')} x {repeats_text} repeats ({counted(len(cells), 'cells')}, each run "
            f"{times} times: {shown}) = {counted(rollouts, 'rollouts')}")

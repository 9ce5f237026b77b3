"""GRPO groups from the L×T pool: an EGLR rollout function for TRL's ``GRPOTrainer``, and a math reward.

TRL is an optional extra (``pip install "eglr-harness[rl]"``); this module is the only one that
imports it, and only in :func:`grpo_trainer` and :func:`grpo_config`.

**Rollouts.** :class:`EglrRollout` is a ``rollout_func``: each time the trainer generates, it wraps the
trainer's model *as it is now* in a fresh ``eglr-hf`` (:class:`~eglr_harness.harness.model.EglrHFLM`,
no rollout store, nothing kept from the last step) and decodes every prompt once per cell of the pool
with the project's engine, through the adapter's own request building: HFLM's chat template (as
``--apply_chat_template``) and encoding, the cell's ``RolloutSpec`` and its seed rule. So a completion
is what ``eglr-hf`` decodes for the same prompt, cell and seed, with the weights of that step.

TRL 1.16 hands the rollout function its generation batch as the dataset rows it sampled: every
prompt ``num_generations`` times in a row (``RepeatSampler``; the rewards are computed per row, so one
completion per row comes back). Row ``i`` of the whole generation batch is repeat ``i`` of its
prompt's group, and runs pool cell ``i mod |pool|`` (``ResolvedPool.cell_for_repeat``, the pool rule's
step 4): a group is the pool in its L-major order. The pool must have exactly ``num_generations``
cells; anything else is refused before a token is decoded (:meth:`EglrRollout.check_group_size`,
called by :func:`grpo_trainer` before the trainer is built). Sampled cells draw with cycle =
``trainer.state.global_step``, so a prompt seen again later gets fresh noise; at step 0 the draws
are those of ``eglr-hf``'s first pass over the pool (its cycle 0), at step ``c`` those of its cycle
``c``. Deterministic cells (T = 0) are one rollout per prompt and weights, as in ``eglr-hf``.

Each completion carries extra fields that TRL passes to the reward functions: ``L``, ``T`` (its
cell), ``gated`` (tokens refined), ``finish`` (``eos``, ``stop`` or ``length``), ``signals``
(:func:`eglr_harness.core.signals.rollout_signals`: entropies, log-probabilities, refinement) and
``eglr_text`` (the text ``eglr-hf`` gives: decoded, cut at the stop strings).

**Log-probabilities.** ``logprobs`` holds, per completion token, its log-probability under the
distribution the engine decoded it from, at temperature 1: ``log_softmax`` of the final logits,
*the refined logits at gated tokens* and the model's own logits elsewhere (``Outcome.logprobs``),
before temperature, top-k and top-p. At ungated tokens this is the trainer's own per-token
log-probability of the current policy (``GRPOConfig.temperature=1.0``); at gated tokens it is not,
since the policy being trained is the plain model and the refined distribution is another one. It
is not the probability of the draw either: a T = 0 cell is greedy (a point mass, probability 1)
and a sampled cell draws from the refined logits divided by T after top-k/top-p.

What TRL does with them: without vLLM (``use_vllm=False``, the only setting this function accepts)
GRPO's clipped ratio compares the policy with its own log-probabilities recomputed on the
completions (``old_per_token_logps``, or a detached copy), never with these, and
``vllm_importance_sampling_correction`` does nothing; the rollout log-probabilities are read only
by ``off_policy_mask_threshold`` (the sequence mask of DeepSeek-V3.2), which would treat the KL
between refined and plain distributions as staleness. So: leave ``off_policy_mask_threshold`` unset,
keep ``temperature=1.0``, and treat the L axis as what it is: deterministic, off-policy completions
scored and pushed up or down by their group-relative advantage. An importance-sampling correction
towards the behaviour policy has nothing to correct with at T = 0 (its behaviour probability is 1,
the ratio would be the policy's own probability) and is off here by construction.

**Reward.** :func:`math_reward` grades with the eglr tasks' grader (``eglr_harness.scoring``): answer
extraction in the row's ``answer_format`` and equivalence with its time limit; it logs the mean
reward per cell (``eglr/reward/L=..,T=..``) through TRL's ``log_metric``.
"""

from __future__ import annotations

import logging
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from eglr_harness.core.cell import Cell
from eglr_harness.core.config import SettingRule
from eglr_harness.core.generation_options import check_generation_options
from eglr_harness.core.model_args import EGLR_ARGS
from eglr_harness.decoding.compile_setting import resolve_compile
from eglr_harness.run.pool import TASK_POOL_KEYS, ResolvedPool
from eglr_harness.run.run_args import resolve_run_args
from eglr_harness.run.settings import RunSettings
from eglr_harness.scoring.equivalence import DEFAULT_TIMEOUT_S, is_equivalent
from eglr_harness.scoring.extraction import ANSWER_MODES, extract_answer

__all__ = ["EglrRollout", "ROLLOUT_ARGS", "RolloutRecord", "grpo_config", "grpo_trainer", "math_reward", "trainable",
           "INSTALL_HINT"]

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "eglr-harness[rl]"  (TRL, for GRPOTrainer)'
# The pool rule's budget check compares a pool with a task's repeats; in GRPO the group size
# (num_generations) is the budget, checked on its own (EglrRollout.check_group_size).
_NO_REPEAT_LIMIT = sys.maxsize
# eglr-hf's own model args that GRPO rollouts take: all but the rollout store (each step's weights are new)
ROLLOUT_ARGS = tuple(name for name in EGLR_ARGS if name != "rollout_cache")


_ROWS = SettingRule(True, lambda v: v >= 1, "an int >= 1 (rows decoded together)")


@dataclass(frozen=True)
class RolloutRecord:
    """One completion of the last generation (``EglrRollout.last``): for logs and run records."""

    prompt_index: int  # the row's position in the batch TRL handed over
    cell: Cell
    tokens: int
    gated: int
    finish: str
    text: str


class EglrRollout:
    """A TRL ``rollout_func`` whose groups are an EGLR pool (module docstring).

    Args:
        task: an eglr task (``gsm8k_eglr_lxt``): its generation kwargs (stop strings, pool keys
            ``eglr_L``/``eglr_T``/budget axes) and its tau_h key in the preset.
        gen_kwargs: generation kwargs over the task's (``until``, ``repetition_penalty``, ...);
            ``max_gen_toks`` is always the trainer's ``max_completion_length``.
        batch_size: HFLM's ``batch_size`` (rows decoded together).
        compile: eglr-hf's ``compile``; ``none`` by default here (the one default GRPO sets otherwise): each step
            builds a fresh engine around the updated weights, so a compiled step would be compiled (CUDA graphs
            captured) again every step.
        progress: show the decoding progress bar.
        model_args: eglr-hf's own model args (:data:`ROLLOUT_ARGS`: ``core/model_args.MODEL_ARGS`` but
            ``rollout_cache``), resolved once by ``run/run_args.resolve_run_args`` with eglr-hf's precedence and
            checks. ``model_config``: a preset, for its EGLR defaults and tau_h table (its ``model_args`` are not
            used: the model is the trainer's); ``L``, ``T``: pool axes as in eglr-hf (``"0|2|4"``, ``"0-10"``,
            ``"0.1-1.0:0.1"``), the pool L_axis × T_axis by the pool rule (``eglr_harness.run.pool``), L-major;
            ``tau_h`` must be concrete (a number, or a preset value for the task) when any cell refines: ``auto``
            would calibrate on the trainer's prompts each step.
    """

    def __init__(self, *, task: str | None = None, gen_kwargs: dict | None = None, batch_size: int = 16,
                 compile: str = "none", progress: bool = False, **model_args):
        if unknown := [name for name in model_args if name not in ROLLOUT_ARGS]:
            raise TypeError(f"EglrRollout() got unexpected keyword arguments {unknown}; allowed: task, gen_kwargs, "
                            f"batch_size, compile, progress, {', '.join(a for a in ROLLOUT_ARGS if a != 'compile')}.")
        self.task = task
        self.run = resolve_run_args({**model_args, "compile": compile})
        self.engine, self.compile = self.run.engine, self.run.compile
        self.batch_size = _ROWS.read("batch_size", batch_size)
        self.progress = progress
        self.settings = RunSettings.of(self.run)
        if task is not None:
            from eglr_harness.harness.task_source import task_generation_kwargs  # noqa: PLC0415

            task_kwargs = task_generation_kwargs(task)
        else:
            task_kwargs = {}
        check_generation_options(gen_kwargs or {}, "gen_kwargs of EglrRollout", ignore=TASK_POOL_KEYS)
        self.gen_kwargs = {**task_kwargs, **(gen_kwargs or {})}
        self.pool: ResolvedPool = self.settings.pool_for(task, self.gen_kwargs, _NO_REPEAT_LIMIT)
        self.tau_h = self.settings.tau_h_setting(task)
        if self.tau_h == "auto" and any(cell.L > 0 for cell in self.pool.cells):
            where = f" for task {task!r}" if task else ""
            raise ValueError(
                f"`tau_h`='auto' is not allowed for GRPO rollouts (it would calibrate on each step's prompts); pass "
                f"tau_h=<nats>, or a model_config whose preset has a tau_h{where} (eglr-calibrate writes one).")
        self.last: list[RolloutRecord] = []
        self.last_accounts: dict = {}

    @property
    def cells(self) -> tuple[Cell, ...]:
        """The pool, in group order."""
        return self.pool.cells

    def check_group_size(self, num_generations: int, name: str = "num_generations") -> None:
        """``ValueError`` unless the group (``num_generations``) is exactly one completion per cell."""
        if num_generations != len(self.cells):
            raise ValueError(
                f"`{name}`={num_generations!r} but the EGLR pool has {len(self.cells)} cells "
                f"({', '.join(c.label for c in self.cells)}); a GRPO group is one completion per cell: set "
                f"GRPOConfig({name}={len(self.cells)}) or change the L/T axes.")

    def check_model(self, model) -> None:
        """``ValueError`` when the pool or the compilation cannot run on ``model`` (a ``PreTrainedModel``): an
        ``L`` beyond its decoder layers, a ``compile`` its device lacks (CUDA graphs off CUDA)."""
        from eglr_harness.decoding.model_parts import find_model_parts  # noqa: PLC0415

        layers = find_model_parts(model).num_layers
        self.settings.check_layers(layers)
        self.settings.check_cells(self.cells, layers)
        device = next((p.device for p in model.parameters()), "cpu")
        resolve_compile(self.compile, device, "continuous" if self.engine == "auto" else self.engine)

    @staticmethod
    def check_args(args) -> None:
        """The GRPOConfig settings these rollouts cannot honour (module docstring), refused by name."""
        if getattr(args, "use_vllm", False):
            raise ValueError("`use_vllm`=True is not allowed with EGLR rollouts: they decode with the trainer's own "
                             "model; vLLM would start for nothing and turn on an importance-sampling correction "
                             "against the refined log-probabilities. Set use_vllm=False.")

    def gen_kwargs_for(self, max_new_tokens: int) -> dict:
        """The generation kwargs of one rollout: the task's and the user's, with the trainer's length limit."""
        return {**self.gen_kwargs, "max_gen_toks": int(max_new_tokens)}

    # ------------------------------------------------------------------ TRL's rollout_func
    def __call__(self, prompts: Sequence, trainer) -> dict[str, list]:
        training = trainer.model.training
        group = trainer.num_generations if training else trainer.num_generations_eval
        self.check_group_size(group, "num_generations" if training else "num_generations_eval")
        self.check_args(trainer.args)
        model = trainer.accelerator.unwrap_model(trainer.model)
        offset = trainer.accelerator.process_index * len(prompts)  # rows before ours in the generation batch
        cells = [self.pool.cell_for_repeat(offset + j)[0] for j in range(len(prompts))]
        _check_groups(prompts, offset, group)
        try:
            lm = self._eglr_hf(model, trainer.processing_class)  # the policy as it is now; HFLM sets eval()
            gen_kwargs = self.gen_kwargs_for(trainer.max_completion_length)
            cycle = int(trainer.state.global_step)
            items = [(self._context(lm, prompt), lm.settings.rollout(gen_kwargs, cell, cycle, self.tau_h))
                     for prompt, cell in zip(prompts, cells)]
            keys = [lm.decoder.key(*item) for item in items]
            done = lm.decoder.decode(items, keys=keys, desc="eglr rollouts", disable_tqdm=not self.progress,
                                     stats_for=lambda config: lm.accounts.stats_for(Cell(config.L, config.T)))
        finally:
            model.train(training)
        outcome_of = {key: outcome for key, outcome in zip(keys, done.outcomes) if outcome is not None}
        outcomes = [outcome_of[key] for key in keys]  # a repeated row (same prompt and cell) shares its rollout
        prompt_ids = [list(lm.decoder.codec.request(*item)[0].prompt) for item in items]
        self.last = [RolloutRecord(j, cell, len(o.tokens), o.gated, o.finish, r["text"])
                     for j, (cell, o, r) in enumerate(zip(cells, outcomes, done.records))]
        self.last_accounts = lm.accounts.summary()
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [list(o.tokens) for o in outcomes],
            "logprobs": [list(o.logprobs) for o in outcomes],
            "L": [cell.L for cell in cells],
            "T": [cell.T for cell in cells],
            "gated": [o.gated for o in outcomes],
            "finish": [o.finish for o in outcomes],
            "signals": [r.get("signals") for r in done.records],
            "eglr_text": [r["text"] for r in done.records],
        }

    def _eglr_hf(self, model, tokenizer):
        from eglr_harness.harness.model import EglrHFLM  # noqa: PLC0415 -- the adapter, with lm-eval

        hflm_logger = logging.getLogger("lm_eval.models.huggingface")
        level = hflm_logger.level
        hflm_logger.setLevel(logging.ERROR)  # its lines about evaluate() with a model object, every step
        try:
            return EglrHFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.batch_size, **self.run.given)
        finally:
            hflm_logger.setLevel(level)

    @staticmethod
    def _context(lm, prompt) -> str:
        """A conversational prompt (chat turns) through HFLM's chat template, as ``--apply_chat_template``
        renders a task's turns; a plain string as it is (eglr-hf without the flag)."""
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
            return lm.apply_chat_template(prompt)
        raise ValueError(f"prompt {str(prompt)[:80]!r} is neither a string nor a list of chat turns "
                         "({'role': ..., 'content': ...}).")


def _check_groups(prompts: Sequence, offset: int, group: int) -> None:
    """Every row of one group (``group`` consecutive rows of the generation batch) holds the same prompt."""
    for j in range(len(prompts)):
        first = j - (offset + j) % group
        if first >= 0 and prompts[j] != prompts[first]:
            raise ValueError(
                f"rows {offset + first} and {offset + j} of the generation batch are one GRPO group but hold different "
                "prompts; "
                "EGLR rollouts need TRL's RepeatSampler layout (each prompt num_generations times in a row).")


def math_reward(completions: Sequence, answer: Sequence[str], answer_format: Sequence[str] | None = None,
                L: Sequence[int] | None = None, T: Sequence[float] | None = None, log_metric=None,
                timeout_s: float = DEFAULT_TIMEOUT_S, **_unused) -> list[float]:
    """1.0 where the completion's final answer is equivalent to the gold ``answer``, else 0.0.

    A TRL ``reward_funcs`` entry for datasets with the eglr tasks' gold column ``answer`` (and
    ``answer_format``: ``math`` or ``number``, the extraction mode; default ``math``), e.g. the rows
    of :func:`eglr_harness.harness.task_source.task_problems`. ``completions`` are TRL's (texts, or
    chat turns whose last ``content`` is graded). With the rollouts' ``L``/``T`` fields and TRL's
    ``log_metric``, logs the mean reward of each cell as ``eglr/reward/<cell label>``.
    """
    formats = list(answer_format) if answer_format is not None else ["math"] * len(completions)
    rewards = []
    for completion, gold, mode in zip(completions, answer, formats, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        mode = mode if mode in ANSWER_MODES else "math"
        rewards.append(float(is_equivalent(str(gold), extract_answer(text, mode), timeout_s=timeout_s)))
    if log_metric is not None and L is not None and T is not None:
        by_cell = defaultdict(list)
        for reward, l_value, t_value in zip(rewards, L, T):
            by_cell[Cell.of(l_value, t_value).label].append(reward)
        for label, values in sorted(by_cell.items()):
            log_metric(f"eglr/reward/{label}", sum(values) / len(values))
    return rewards


def trainable(model):
    """``model``, trainable by transformers' ``Trainer``: a GGUF checkpoint is dequantised into float
    weights when it loads, but transformers keeps a GGUF quantizer on the model and its ``Trainer``
    refuses "purely quantized" models; that mark is dropped here. Weights that really are quantized
    are refused (``ValueError``)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    method = str(getattr(getattr(quantizer, "quantization_config", None), "quant_method", "")).lower()
    if "gguf" not in method or not all(p.is_floating_point() for p in model.parameters()):
        raise ValueError(f"the model is quantized ({method or type(quantizer).__name__}); GRPO needs float weights "
                         "(load it unquantized, or attach a PEFT adapter and pass peft_config to the trainer).")
    # as from_pretrained sets them
    model.hf_quantizer, model.is_quantized, model.quantization_method = None, False, None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def grpo_config(**kwargs):
    """TRL's ``GRPOConfig(**kwargs)`` (the import with the install hint)."""
    return _trl().GRPOConfig(**kwargs)


def _trl():
    try:
        import trl  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"eglr_harness.rl.rollouts needs TRL: {INSTALL_HINT}") from err
    return trl


def grpo_trainer(rollout: EglrRollout, *, args, **trainer_kwargs):
    """TRL's ``GRPOTrainer(rollout_func=rollout, args=args, **trainer_kwargs)``, after refusing a group
    size other than the pool's, a pool or compilation the model cannot run (``check_model``) and the
    settings the rollouts cannot honour (before any weight moves)."""
    rollout.check_group_size(args.num_generations)
    if not isinstance(trainer_kwargs.get("model"), str) and trainer_kwargs.get("model") is not None:
        rollout.check_model(trainer_kwargs["model"])  # a model id: the trainer loads it, the first rollout checks
    if getattr(args, "num_generations_eval", None):
        rollout.check_group_size(args.num_generations_eval, "num_generations_eval")
    rollout.check_args(args)
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        logger.warning("GRPOConfig(off_policy_mask_threshold=%s) reads the rollouts' log-probabilities, which are the "
                       "refined distribution's at gated tokens: it takes EGLR's refinement for staleness "
                       "(eglr_harness.rl.rollouts); leave it unset.", args.off_policy_mask_threshold)
    if not math.isclose(float(getattr(args, "temperature", 1.0)), 1.0):
        logger.warning("GRPOConfig(temperature=%s): the trainer's log-probabilities are then at that temperature, "
                       "the rollouts' at 1 (eglr_harness.rl.rollouts); the L×T pool sets the rollouts' temperatures.",
                       args.temperature)
    return _trl().GRPOTrainer(args=args, rollout_func=rollout, **trainer_kwargs)

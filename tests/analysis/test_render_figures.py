"""Figures readable at every size (issue 38): a long title on a small grid stays inside the image, an
accuracy plot of an all-zero run has no negative axis, and the labels of points close together in the accuracy
against compute plot neither cover each other nor leave the axes."""

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


def test_labels_of_crowded_points_do_not_cover_each_other(tmp_path, saved):
    """Points as a real report has them (gsm8k_pools: three pools' votes at 2 % near x = 10 and 21, the oracles above,
    a 0 % and a 100 % share among them): every label inside the axes, no two overlapping."""
    from matplotlib.text import Text

    from eglr_harness.analysis.metrics.intervals import wilson_interval

    def point(label, group, x, correct, n=100):
        return (label, group, x, correct / n, *wilson_interval(correct, n))

    points = [point("greedy", "greedy", 1.0, 2), point("best single config (L=0,T=0.5)", "method", 0.98, 3),
              point("SC T pool (B=10)", "method", 10.27, 2), point("oracle T pool (B=10)", "oracle", 10.27, 8),
              point("SC L pool (B=10)", "method", 10.69, 1), point("oracle L pool (B=10)", "oracle", 10.69, 7),
              point("SC L ∪ T pool (B=20)", "method", 20.95, 2), point("oracle L ∪ T pool (B=20)", "oracle", 20.95, 14),
              point("SC L×T pool (B=21)", "method", 21.95, 0), point("oracle L×T pool (B=21)", "oracle", 21.95, 100)]
    styles = {"greedy": ("s", "black", True), "method": ("o", "tab:blue", True), "oracle": ("D", "tab:red", False)}
    render.accuracy_compute_plot(tmp_path / "avc.png", points, styles, title="crowded")
    fig = saved[0]
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = {}
    for note in ax.texts:
        note.update_positions(renderer)
        boxes[note.get_text()] = Text.get_window_extent(note, renderer)
    assert sorted(boxes) == sorted(p[0] for p in points)
    frame = ax.get_window_extent(renderer)
    for name, box in boxes.items():
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, name
    names = list(boxes)
    overlapping = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if boxes[a].overlaps(boxes[b])]
    assert not overlapping

"""Rendering helpers of reports and leaderboards: CSV files, Markdown tables, numbers and PNG
figures (matplotlib's Agg canvas: no pyplot, no global backend, no display)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from eglr_harness.core.outputs import atomic_write_bytes, atomic_writer

__all__ = ["save_png", "write_csv", "markdown_table", "pct", "num", "t_label", "heatmap", "lxt_heatmap", "budget_plot",
           "rules_plot", "accuracy_compute_plot"]


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> Path:
    """Write ``rows`` under ``header`` to ``path`` (None -> empty field), whole or not at all, replacing
    a link there instead of writing through it; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
    return path


PNG_COLOURS = 256  # a figure is written as a palette PNG of at most this many colours (a third of RGBA's bytes)


def save_png(fig, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, whole or not at all, replacing a link there instead of writing through it.

    The image is reduced to :data:`PNG_COLOURS` colours (Pillow's median cut; the figures are drawn on an opaque
    white background, so no transparency is lost) and written with Pillow's ``optimize``: lines and text as drawn,
    in fewer bytes (the sizes: results/README.md, "Raw files")."""
    from PIL import Image  # noqa: PLC0415 -- matplotlib's own dependency, loaded with the figures only

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    small = io.BytesIO()
    image.quantize(PNG_COLOURS, method=Image.Quantize.MEDIANCUT).save(small, format="png", optimize=True)
    atomic_write_bytes(path, small.getvalue())
    return Path(path)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub Markdown table; None cells print as an em dash."""

    def cell(v) -> str:
        return "—" if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pct(fraction: float | None, digits: int = 1) -> str | None:
    """0.646 -> '64.6' (None stays None)."""
    return None if fraction is None else f"{100 * fraction:.{digits}f}"


def num(value: float | None, digits: int = 3) -> str | None:
    """A float rounded for tables (None stays None)."""
    return None if value is None else f"{value:.{digits}f}"


def t_label(T: float) -> str:
    """0.0 -> '0', 0.5 -> '0.5' (axis labels)."""
    return f"{T:g}"


def _set_title(fig, ax, title: str, fontsize: float = 9) -> None:
    """The title wrapped to the figure's width (a small grid's figure is narrower than a long title)."""
    import textwrap

    chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))  # ~0.6 em per character
    ax.set_title("\n".join(textwrap.wrap(title, chars)) or title, fontsize=fontsize)


def _save_accuracy_plot(fig, ax, xlabel: str, title: str, path: Path) -> Path:
    """Label an accuracy (%) plot, add its grid and legend, and write the PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (%)")
    _set_title(fig, ax, title)
    low, high = ax.get_ylim()  # accuracy is never negative: an all-zero run's autoscale would show -5..5 %
    ax.set_ylim(0, max(high, 5.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    return Path(path)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def heatmap(
    path: Path,
    values: Sequence[Sequence[float | None]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    annotations: Sequence[Sequence[str]] | None = None,
    colorbar_label: str = "",
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis",
) -> Path:
    """A heatmap of ``values[row][col]`` (None = missing, drawn grey) with optional cell texts."""
    import numpy as np

    rows, cols = len(row_labels), len(col_labels)
    data = np.array([[math.nan if v is None else float(v) for v in row] for row in values], dtype=float).reshape(
        rows, cols
    )
    fig = _figure(max(4.0, 0.62 * cols + 2.2), max(3.0, 0.5 * rows + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    ax.set_facecolor("#d9d9d9")
    image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", origin="upper")
    ax.set_xticks(range(cols), labels=list(col_labels), fontsize=7)
    ax.set_yticks(range(rows), labels=list(row_labels), fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _set_title(fig, ax, title)
    if annotations is not None:
        size = 7 if max(rows, cols) <= 8 else (6 if max(rows, cols) <= 12 else 4.5)
        for i in range(rows):
            for j in range(cols):
                text = annotations[i][j]
                if text:
                    dark = bool(np.isfinite(data[i, j]) and image.norm(data[i, j]) < 0.5)
                    ax.text(j, i, text, ha="center", va="center", fontsize=size, color="white" if dark else "black")
    fig.colorbar(image, ax=ax, label=colorbar_label)
    fig.tight_layout()
    save_png(fig, path)
    return Path(path)


def lxt_heatmap(
    path: Path, L_values: Sequence[int], T_values: Sequence[float], value, note, *, xlabel: str, ylabel: str, **kwargs
) -> Path:
    """A :func:`heatmap` of the L×T rectangle, rows L and columns T (0–100 scale); ``value(L, T)``
    and ``note(L, T)`` give each cell's number (None = missing) and text."""
    return heatmap(
        path,
        [[value(L, T) for T in T_values] for L in L_values],
        [f"L={L}" for L in L_values],
        [f"T={t_label(T)}" for T in T_values],
        annotations=[[note(L, T) for T in T_values] for L in L_values],
        vmin=0,
        vmax=100,
        xlabel=xlabel,
        ylabel=ylabel,
        **kwargs,
    )


def budget_plot(path: Path, curves: Sequence[tuple[str, Sequence[float], str, str]], *, title: str) -> Path:
    """Lines of accuracy (%) against budget; ``curves`` = ``(label, fractions, linestyle, color)``."""
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for label, fractions, style, color in curves:
        if fractions:
            ax.plot(
                range(1, len(fractions) + 1),
                [100 * f for f in fractions],
                style,
                color=color,
                label=label,
                marker=".",
                markersize=3,
            )
    return _save_accuracy_plot(fig, ax, "budget b (configurations)", title, path)


def ablation_plot(path: Path, points: Sequence[tuple[float, float, float, float, bool]], *, axis: str,
                  title: str) -> Path:
    """Accuracy (%) with its 95 % interval against the values of one setting; ``points`` =
    ``(value, accuracy, low, high, is_default)`` (fractions); the default point is marked."""
    fig = _figure(5.0, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    xs = [p[0] for p in points]
    ys = [100 * p[1] for p in points]
    err = [[100 * (p[1] - p[2]) for p in points], [100 * (p[3] - p[1]) for p in points]]
    ax.errorbar(xs, ys, yerr=err, fmt="o-", color="tab:blue", capsize=3, markersize=4, label="accuracy (95 % CI)")
    for x, y, *_rest, is_default in ((p[0], 100 * p[1], p[4]) for p in points):
        if is_default:
            ax.plot([x], [y], marker="*", markersize=14, color="tab:red", linestyle="none", label="default")
    return _save_accuracy_plot(fig, ax, axis, title, path)


def rules_plot(path: Path, series: dict[str, Sequence[tuple[float, float, str]]], *, xlabel: str, title: str) -> Path:
    """Accuracy (%) against the FLOP ratio, one line per exit rule; ``series``: rule -> ``(FLOP ratio, accuracy
    (fraction), point label)`` per threshold; each point is labelled (its threshold)."""
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in series.items():
        ordered = sorted(points)
        xs, ys = [p[0] for p in ordered], [100 * p[1] for p in ordered]
        ax.plot(xs, ys, "o-", markersize=4, label=name)
        for x, y, (_x, _y, label) in zip(xs, ys, ordered):
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    return _save_accuracy_plot(fig, ax, xlabel, title, path)


def accuracy_compute_plot(path: Path, points: Sequence[tuple[str, str, float, float, float, float]],
                          styles: dict[str, tuple[str, str, bool]], *, title: str, xlabel: str | None = None) -> Path:
    """Accuracy (%) with its 95 % interval against compute relative to greedy, one labelled point each;
    ``points`` = ``(label, group, compute, accuracy, low, high)`` (fractions), ``styles``: group -> ``(marker, colour,
    filled)``, the group its legend entry; ``xlabel``: the compute axis's label when its unit is not greedy's. The
    compute axis is logarithmic when it spans a factor of 8 or more."""
    from matplotlib.ticker import FuncFormatter

    fig = _figure(7.0, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    for group, (marker, color, filled) in styles.items():
        mine = [p for p in points if p[1] == group]
        if not mine:
            continue
        ax.errorbar([p[2] for p in mine], [100 * p[3] for p in mine],
                    yerr=[[100 * (p[3] - p[4]) for p in mine], [100 * (p[5] - p[3]) for p in mine]],
                    fmt=marker, color=color, markerfacecolor=color if filled else "white", markersize=7, capsize=3,
                    elinewidth=1, linestyle="none", label=group)
    xs = [p[2] for p in points]
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 8:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    xlim = ax.get_xlim()
    if ax.get_xscale() == "log":
        ax.set_xlim(xlim[0] / 1.6, xlim[1] * 1.6)
    else:
        pad = 0.15 * (xlim[1] - xlim[0] or 1)
        ax.set_xlim(xlim[0] - pad, xlim[1] + pad)
    ax.set_ylim(0, max(ax.get_ylim()[1], 5.0))  # as _save_accuracy_plot will: the labels are placed on the final axes
    xlabel = xlabel or "compute per problem relative to greedy (FLOPs)"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy (%)")
    _set_title(fig, ax, title)
    fig.tight_layout()
    _place_labels(fig, ax, [(label, x, 100 * y, 100 * low, 100 * high) for label, _group, x, y, low, high in points])
    return _save_accuracy_plot(fig, ax, xlabel, title, path)


def _place_labels(fig, ax, labels: Sequence[tuple[str, float, float, float, float]]) -> None:
    """Write each ``(text, x, y, low, high)`` beside its point where it crosses the fewest other points and labels
    placed before it (then error bars), inside the axes: points of nearly one compute (two pools' votes, a vote and its
    oracle) would otherwise print their labels over each other or beside the wrong point. Places are tried right,
    left, then below and above (a label moved up or down is tied to its point by a thin line); the first of the
    least crowded wins."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)  # a label past the axes' edge would reshape the layout
    tries = [(side * (8 + abs(dy) // 3), dy) for dy in (0, -12, 12, -24, 24, -36, 36, -48, 48, -60, 60)
             for side in (1, -1)]
    half = 5  # a marker is 7 pt wide
    # the obstacles with their weights: every marker and error bar, then each label as it is placed; a label over
    # another label or a marker is unreadable, one across an error bar only untidy
    placed: list[tuple[Bbox, int]] = []
    for _text, x, y, low, high in labels:
        px, py = ax.transData.transform((x, y))
        placed.append((Bbox.from_extents(px - half, py - half, px + half, py + half), 10))
        _, bottom = ax.transData.transform((x, low))
        _, top = ax.transData.transform((x, high))
        placed.append((Bbox.from_extents(px - 1, bottom, px + 1, top), 1))

    def crowding(box) -> int:
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        return sum(weight for other, weight in placed if box.overlaps(other)) + (0 if inside else 1000)

    for text, x, y, _low, _high in labels:
        best = None
        for dx, dy in tries:
            line = dict(arrowstyle="-", color="grey", lw=0.5, shrinkA=0, shrinkB=4) if dy else None
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=6.5,
                               ha="left" if dx > 0 else "right", va="center", arrowprops=line)
            note.update_positions(renderer)
            box = Text.get_window_extent(note, renderer).padded(2)  # the text's: an annotation's own counts its line
            score = crowding(box)
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, note, box)
            else:
                note.remove()
            if score == 0:
                break
        placed.append((best[2], 10))

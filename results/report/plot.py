"""The report's figures: the fairness–fluency trade-off and the forest plot of every bias, in
constrained layout (nothing overlaps: `tests/test_report_render.py`) and without dates in the
files, so the same cells give the same bytes (docs/design.md, "Reports").
"""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from results.report.pieces import model_label
from results.report.tables import TASKS, Block, layout, level_text, method_label

COLOURS = "#4c72b0 #dd8452 #55a868 #c44e52 #8172b3 #937860 #da8bc3 #8c8c8c #ccb974 #64b5cd".split()
MARKERS = list("o^DvPX<>h*")
FORMATS = ("png", "pdf", "svg")
DPI = 150


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (both minimised),
    sorted by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def abs_interval(value: float, low: float | None, high: float | None) -> tuple[float, float]:
    """|value| and the image of [low, high] under |·| (an interval for |gap| when [low, high]
    is one for the gap): [0, max] when it holds 0."""
    if low is None or high is None:
        return abs(value), abs(value)
    if low <= 0.0 <= high:
        return 0.0, max(-low, high)
    return min(abs(low), abs(high)), max(abs(low), abs(high))


def _method_styles(blocks: list[Block]) -> dict[str, tuple[str, str]]:
    """Method label → (colour, marker): vanilla a grey square, the others by method order."""
    labels = dict.fromkeys(method_label(r.method, r.variant) for b in blocks for r in b.rows)
    others = [label for label in labels if label != "vanilla"]
    styles = {
        x: (COLOURS[k % len(COLOURS)], MARKERS[k % len(MARKERS)]) for k, x in enumerate(others)
    }
    return {**styles, "vanilla": ("#555555", "s")}


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_bytes(fig: Any, fmt: str = "png") -> bytes:
    """`fig` as PNG / PDF / SVG bytes, without creation dates (same figure, same bytes)."""
    meta: dict[str, Any] = {"png": {"Software": None}, "pdf": {"CreationDate": None},
                            "svg": {"Date": None}}[fmt]  # fmt: skip
    buf = io.BytesIO()
    if fmt == "svg":
        import matplotlib

        with matplotlib.rc_context({"svg.hashsalt": "lidao-harness"}):
            fig.savefig(buf, format=fmt, metadata=meta)
    else:
        fig.savefig(buf, format=fmt, metadata=meta, dpi=DPI)
    return buf.getvalue()


def figure_files(fig: Any) -> dict[str, bytes]:
    """`fig` in every format of `FORMATS`: laid out once (by the first save), the others reuse
    that layout (a second constrained-layout pass could move things by a pixel)."""
    files = {}
    for fmt in FORMATS:
        files[fmt] = figure_bytes(fig, fmt)
        fig.set_layout_engine("none")
    return files


def _legend(fig: Any, handles: dict[str, Any], ncol: int) -> None:
    """One legend below the panels, in as many of `ncol` columns as fit the figure's width
    (constrained layout makes room below, never beside: a wider legend would be clipped)."""
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width
    for n in range(min(ncol, len(handles)), 0, -1):
        legend = fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                            ncol=n, fontsize=9, frameon=False)  # fmt: skip
        if n == 1 or legend.get_window_extent(renderer).width <= 0.98 * width:
            return
        legend.remove()


def tradeoff_figure(cells: pl.DataFrame, view: str, level: float = 0.95) -> Any:
    """|bias| (× 100, with the image of its interval at `level`) against mean perplexity, one
    panel per (model, task); the methods named in one legend below the panels (labels on the
    points would overlap), the Pareto front of what is plotted ringed."""
    lay = layout(cells, view, level=level)
    tasks, blocks = lay.tasks, lay.blocks
    n_rows, n_cols = max(1, len(blocks)), max(1, len(tasks))
    fig = _figure(4.4 * n_cols, 3.2 * n_rows + 1.4)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    styles = _method_styles(blocks)
    handles: dict[str, Any] = {}
    for r, block in enumerate(blocks):
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            points: list[tuple[float, float]] = []
            for row in block.rows:
                bias = row.fields[column_index(lay, task, "bias")]
                ppl = row.fields[column_index(lay, task, "ppl")]
                if bias.value is None or ppl.value is None:
                    continue
                size, (lo, hi) = abs(bias.value), abs_interval(bias.value, bias.low, bias.high)
                name = method_label(row.method, row.variant)
                col, marker = styles[name]
                handles[name] = ax.errorbar(
                    ppl.value, size, yerr=[[size - lo], [hi - size]], fmt=marker, color=col,
                    capsize=3, markersize=7,
                )  # fmt: skip
                points.append((ppl.value, size))
            front = pareto_front(points)
            if front:  # (one point when a method dominates every other)
                handles["Pareto front (|bias|, PPL)"] = ax.scatter(
                    [points[i][0] for i in front], [points[i][1] for i in front], s=170,
                    facecolors="none", edgecolors="#999999", zorder=0,
                )  # fmt: skip
            if not points:
                ax.text(0.5, 0.5, "no bias / perplexity to plot", ha="center", va="center",
                        transform=ax.transAxes, fontsize=9)  # fmt: skip
            ax.set_title(
                f"{block.label or model_label(block.model)} · {TASKS[task][0]}", fontsize=10
            )
            ax.set_xlabel("perplexity ↓", fontsize=9)
            ax.set_ylabel("|bias| × 100 ↓", fontsize=9)
            ax.axhline(0.0, color="#bbbbbb", lw=0.8, zorder=0)  # no gap (the margin shows it)
            ax.grid(alpha=0.3)
            ax.margins(x=0.15, y=0.15)
    fig.suptitle(
        f"Fairness–fluency trade-off, view {view}\n"
        f"(error bars: |·| of the {level_text(level)} bootstrap interval)",
        fontsize=11,
    )
    _legend(fig, handles, 4)
    return fig


def forest_figure(cells: pl.DataFrame, level: float = 0.95) -> Any:
    """Each method's bias (× 100) with its interval at `level`: one panel per (model, task),
    methods in the tables' order, one marker per view. Made whether or not a perplexity exists."""
    views = [v for v in VIEW_STYLES if v in set(cells["view"].to_list())]
    per_view = {v: layout(cells, v, level=level) for v in views}
    tasks = [t for t in TASKS if t in set(cells["task"].to_list())]
    shown_as = {b.model: b.label for v in views for b in per_view[v].blocks}
    models = list(shown_as)
    n_rows, n_cols = max(1, len(models)), max(1, len(tasks))
    labels_of: dict[str, dict[str, None]] = {m: {} for m in models}  # ordered sets
    for shown in (b for v in views for b in per_view[v].blocks):
        labels_of[shown.model].update(
            dict.fromkeys(method_label(r.method, r.variant) for r in shown.rows)
        )
    n_methods = sum(max(1, len(x)) for x in labels_of.values())
    fig = _figure(4.0 * n_cols + 1.4, 0.32 * n_methods + 0.9 * n_rows + 1.6)
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey="row")
    handles: dict[str, Any] = {}
    step = 0.6 / max(1, len(views))
    for r, model in enumerate(models):
        labels = list(labels_of[model])
        ys = {label: len(labels) - 1 - i for i, label in enumerate(labels)}
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            for k, view in enumerate(views):
                lay = per_view[view]
                block = next((b for b in lay.blocks if b.model == model), None)
                if block is None or task not in lay.tasks:
                    continue
                at = column_index(lay, task, "bias")
                col, marker = VIEW_STYLES[view]
                for row in block.rows:
                    bias = row.fields[at]
                    if bias.value is None:
                        continue
                    y = ys[method_label(row.method, row.variant)] + 0.3 - step * (k + 0.5)
                    lo = bias.value - bias.low if bias.low is not None else 0.0
                    hi = bias.high - bias.value if bias.high is not None else 0.0
                    handles[f"view {view}"] = ax.errorbar(
                        bias.value, y, xerr=[[max(lo, 0.0)], [max(hi, 0.0)]], fmt=marker,
                        color=col, capsize=2, markersize=5,
                    )  # fmt: skip
            ax.axvline(0.0, color="#c44e52", lw=1, ls="--")
            ax.set_yticks(list(ys.values()))
            ax.set_yticklabels(list(ys), fontsize=9)
            ax.tick_params(axis="y", labelleft=c == 0)
            ax.set_ylim(-0.6, len(labels) - 0.4)
            ax.set_title(f"{shown_as[model] or model_label(model)} · {TASKS[task][0]}", fontsize=10)
            ax.set_xlabel("bias × 100 (0 = no gap)", fontsize=9)
            ax.grid(alpha=0.3, axis="x")
    fig.suptitle(
        f"Bias of each method with its {level_text(level)} bootstrap interval", fontsize=11
    )
    _legend(fig, handles, len(handles))
    return fig


def column_index(lay: Any, task: str, kind: str, stat: str = "bias") -> int:
    """Index of the (task, kind) column in a layout's rows (bias: the paper's gap `stat`)."""
    return next(
        i
        for i, c in enumerate(lay.columns)
        if c.task == task and c.kind == kind and (kind != "bias" or c.stat == stat)
    )


VIEW_STYLES = {
    "a(x)": ("#4c72b0", "o"),
    "a(c,x)": ("#dd8452", "s"),
    "a(c)": ("#55a868", "^"),
    "file": ("#8172b3", "D"),
}

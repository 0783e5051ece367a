"""The fairness–fluency plot: bias against perplexity, one point per method, Pareto front marked."""

from __future__ import annotations

import io
from typing import Any

import polars as pl

from results.tables import TASKS, layout, row_label

COLOURS = [
    "#4c72b0",
    "#dd8452",
    "#55a868",
    "#c44e52",
    "#8172b3",
    "#937860",
    "#da8bc3",
    "#8c8c8c",
    "#ccb974",
    "#64b5cd",
]


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


MARKERS = ["o", "^", "D", "v", "P", "X", "<", ">", "h", "*"]


def _method_styles(blocks: list[Any]) -> dict[str, tuple[str, str]]:
    """Label → (colour, marker): vanilla a grey square, the others by method order."""
    labels = list(
        dict.fromkeys(
            r.label if r.method != "vanilla" else "vanilla" for b in blocks for r in b.rows
        )
    )
    styles = {}
    k = 0
    for label in labels:
        if label == "vanilla":
            styles[label] = ("#555555", "s")
        else:
            styles[label] = (COLOURS[k % len(COLOURS)], MARKERS[k % len(MARKERS)])
            k += 1
    return styles


def _png(fig: Any) -> bytes:
    """PNG of `fig`, the canvas grown to hold every title, label and legend (nothing cut)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight", pad_inches=0.15)
    return buf.getvalue()


def tradeoff_png(cells: pl.DataFrame, view: str, dpi: int = 110) -> bytes:
    """PNG of bias (× 100, bootstrap interval as error bar) vs mean perplexity.

    One panel per (model, task): models are rows, tasks columns. Each method has its own
    colour and marker, named in one legend below the panels (no labels on the points, so
    none overlap); vanilla is a grey square; the points on the Pareto front of |bias| and
    perplexity (both lower is better) are ringed. The canvas grows to fit every title and label.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks, blocks = layout(cells, view)
    n_rows, n_cols = max(1, len(blocks)), max(1, len(tasks))
    fig = Figure(figsize=(4.6 * n_cols, 3.6 * n_rows), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    styles = _method_styles(blocks)
    handles: dict[str, Any] = {}
    for r, block in enumerate(blocks):
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            points: list[tuple[float, float]] = []
            for row in block.rows:
                _, bias, ppl = row.fields[3 * c : 3 * c + 3]
                if bias.value is None or ppl.value is None:
                    continue
                low = bias.value - bias.low if bias.low is not None else 0.0
                high = bias.high - bias.value if bias.high is not None else 0.0
                name = "vanilla" if row.method == "vanilla" else row.label
                col, marker = styles[name]
                handles[name] = ax.errorbar(
                    ppl.value,
                    bias.value,
                    yerr=[[max(low, 0.0)], [max(high, 0.0)]],
                    fmt=marker,
                    color=col,
                    capsize=3,
                    markersize=7,
                )
                points.append((ppl.value, bias.value))
            front = pareto_front([(x, abs(y)) for x, y in points])
            if len(front) > 1:
                handles["Pareto front (|bias|, PPL)"] = ax.scatter(
                    [points[i][0] for i in front],
                    [points[i][1] for i in front],
                    s=170,
                    facecolors="none",
                    edgecolors="#999999",
                    zorder=0,
                )
            if not points:
                ax.text(0.5, 0.5, "no bias / perplexity to plot", ha="center", va="center",
                        transform=ax.transAxes)  # fmt: skip
            ax.axhline(0.0, color="#bbbbbb", lw=0.8, zorder=0)
            ax.set_title(f"{row_label(block.model, 'vanilla', '')} · {TASKS[task][0]}", fontsize=10)
            ax.set_xlabel("perplexity ↓", fontsize=9)
            ax.set_ylabel("bias × 100 (0 = no gap)", fontsize=9)
            ax.grid(alpha=0.3)
            ax.margins(x=0.15, y=0.15)
    fig.suptitle(
        f"Fairness–fluency trade-off, view {view} (error bars: 95% bootstrap interval)",
        fontsize=11,
    )
    fig.subplots_adjust(hspace=0.5, wspace=0.32)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            ncol=min(4, len(handles)),
            fontsize=9,
            frameon=False,
        )
    return _png(fig)


VIEW_STYLES = {
    "a(x)": ("#4c72b0", "o"),
    "a(c,x)": ("#dd8452", "s"),
    "a(c)": ("#55a868", "^"),
    "file": ("#8172b3", "D"),
}


def forest_png(cells: pl.DataFrame, dpi: int = 110) -> bytes:
    """PNG of each method's bias (× 100) with its bootstrap interval, a forest plot.

    One panel per (model, task): methods top to bottom in the tables' order, one marker per
    view (offset vertically, named in the legend), a dashed line at 0 (no gap). Made whether
    or not a perplexity exists.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    views = [v for v in VIEW_STYLES if v in set(cells["view"].to_list())]
    per_view = {v: layout(cells, v) for v in views}
    tasks = [t for t in TASKS if t in set(cells["task"].to_list())]
    models = list(dict.fromkeys(b.model for v in views for b in per_view[v][1]))
    n_rows, n_cols = max(1, len(models)), max(1, len(tasks))
    labels_of = {
        m: list(
            dict.fromkeys(
                r.label for v in views for b in per_view[v][1] if b.model == m for r in b.rows
            )
        )
        for m in models
    }
    n_methods = max((len(x) for x in labels_of.values()), default=1)
    fig = Figure(figsize=(4.3 * n_cols + 1.0, 0.45 * n_methods + 1.4 * n_rows + 0.8), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    handles: dict[str, Any] = {}
    step = 0.6 / max(1, len(views))
    for r, model in enumerate(models):
        labels = labels_of[model]
        ys = {label: len(labels) - 1 - i for i, label in enumerate(labels)}
        for c, task in enumerate(tasks):
            ax = axes[r][c]
            for k, view in enumerate(views):
                vtasks, blocks = per_view[view]
                block = next((b for b in blocks if b.model == model), None)
                if block is None or task not in vtasks:
                    continue
                col, marker = VIEW_STYLES[view]
                for row in block.rows:
                    bias = row.fields[3 * vtasks.index(task) + 1]
                    if bias.value is None:
                        continue
                    y = ys[row.label] + 0.3 - step * (k + 0.5)
                    lo = bias.value - bias.low if bias.low is not None else 0.0
                    hi = bias.high - bias.value if bias.high is not None else 0.0
                    handles[f"view {view}"] = ax.errorbar(
                        bias.value, y, xerr=[[max(lo, 0.0)], [max(hi, 0.0)]], fmt=marker,
                        color=col, capsize=2, markersize=5,
                    )  # fmt: skip
            ax.axvline(0.0, color="#c44e52", lw=1, ls="--")
            ax.set_yticks(list(ys.values()))
            ax.set_yticklabels(list(ys) if c == 0 else [""] * len(ys), fontsize=9)
            ax.set_ylim(-0.6, len(labels) - 0.4)
            ax.set_title(f"{row_label(model, 'vanilla', '')} · {TASKS[task][0]}", fontsize=10)
            ax.set_xlabel("bias × 100 (0 = no gap)", fontsize=9)
            ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Bias of each method with its 95% bootstrap interval", fontsize=11)
    fig.subplots_adjust(hspace=0.45, wspace=0.1)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center",
                   bbox_to_anchor=(0.5, 0.0), ncol=len(handles), fontsize=9, frameon=False)  # fmt: skip
    return _png(fig)

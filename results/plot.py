"""The fairness–fluency plot: bias against perplexity, one point per method, Pareto front marked."""

from __future__ import annotations

import io

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


def tradeoff_png(cells: pl.DataFrame, view: str, dpi: int = 110) -> bytes:
    """PNG of bias (× 100, bootstrap interval as error bar) vs mean perplexity.

    One panel per (model, task): models are rows, tasks columns. Vanilla is a grey square;
    the Pareto front (lower bias and lower perplexity are better) is a dashed line.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks, blocks = layout(cells, view)
    n_rows, n_cols = max(1, len(blocks)), max(1, len(tasks))
    fig = Figure(figsize=(4.2 * n_cols, 3.4 * n_rows + 0.5), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    methods = sorted({r.method for b in blocks for r in b.rows})
    colour = {m: COLOURS[i % len(COLOURS)] for i, m in enumerate(methods)}
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
                marker = "s" if row.method == "vanilla" else "o"
                col = "#555555" if row.method == "vanilla" else colour[row.method]
                ax.errorbar(
                    ppl.value,
                    bias.value,
                    yerr=[[max(low, 0.0)], [max(high, 0.0)]],
                    fmt=marker,
                    color=col,
                    capsize=3,
                    label=row.label,
                )
                ax.annotate(
                    "vanilla" if row.method == "vanilla" else row.label,
                    (ppl.value, bias.value),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize=7,
                )
                points.append((ppl.value, bias.value))
            front = pareto_front(points)
            if len(front) > 1:
                ax.plot(
                    [points[i][0] for i in front],
                    [points[i][1] for i in front],
                    "--",
                    color="#999999",
                    lw=1,
                    zorder=0,
                    label="Pareto front",
                )
            for i in front:
                ax.scatter(
                    [points[i][0]], [points[i][1]], s=160, facecolors="none", edgecolors="#999999"
                )
            if not points:
                ax.text(
                    0.5,
                    0.5,
                    "no bias / perplexity to plot",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
            ax.set_title(f"{row_label(block.model, 'vanilla', '')} · {TASKS[task][0]}", fontsize=9)
            ax.set_xlabel("perplexity ↓", fontsize=8)
            ax.set_ylabel("bias × 100 ↓", fontsize=8)
            ax.grid(alpha=0.3)
            ax.margins(x=0.2, y=0.1)
    fig.suptitle(
        f"Fairness–fluency trade-off, view {view} (error bars: 95% bootstrap interval)", fontsize=10
    )
    # Fixed margins: constrained layout costs about 0.5 s a figure on 2 cores.
    top = 1.0 - 0.5 / (3.4 * n_rows + 0.5)
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.1, top=top - 0.06, hspace=0.45, wspace=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()

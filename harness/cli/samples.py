"""`samples RUN`: browse a run's generations with their scores, in the terminal or as JSONL / CSV.

The rows and their filters are `harness.cli.sample_rows`; here: the command's options and the
output (a readable listing, a pair side by side, or one record per sample for piping).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Iterator
from typing import IO, Any

import polars as pl

from harness.cli.sample_rows import Samples, SamplesError, load_samples, select
from jobs.redact import has_controls, printable
from results.schema import METRIC_FIELDS
from results.stats.join import JoinError

VIEW_NAMES = {"label_x": "a(x)", "label_cx": "a(c,x)", "label_c": "a(c)"}


def add_samples_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory (local path or s3:// / gs:// URI)")
    f = p.add_argument_group("filters (repeatable ones match any of their values)")
    f.add_argument("--model", action="append", metavar="ID", help="model id")
    f.add_argument("--method", action="append", metavar="NAME", help="method name")
    f.add_argument("--task", action="append", metavar="NAME", help="task")
    f.add_argument(
        "--group",
        action="append",
        metavar="[VIEW:]GROUP",
        help="prompt group (female), or the gender label of a view: x:female (continuation), "
        "cx:female (prompt + continuation), c:female (prompt)",
    )
    f.add_argument("--status", choices=("ok", "error"), help="only ok rows, or only failed ones")
    f.add_argument(
        "--where",
        action="append",
        metavar="EXPR",
        help="COLUMN OP VALUE with OP one of > >= < <= = != (e.g. 'toxicity>0.5', "
        "'regard_label=negative'); repeatable, all must hold",
    )
    f.add_argument("--grep", metavar="TEXT", help="TEXT in the prompt or continuation (any case)")
    f.add_argument(
        "--pair",
        metavar="PAIR_ID",
        help="the prompts of one counterfactual pair side by side, per model/method/task/seed",
    )
    f.add_argument(
        "--use-scorer",
        action="append",
        metavar="NAME",
        help="where several scorers gave one metric, the one whose columns keep the plain name",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--sort",
        metavar="[-]COLUMN",
        help="sort by COLUMN; --sort=-COLUMN: descending (nulls last either way)",
    )
    o.add_argument(
        "--limit", type=int, default=20, metavar="N", help="show N samples (0: all; default 20)"
    )
    o.add_argument(
        "--format",
        choices=("text", "jsonl", "csv"),
        default="text",
        help="text: a readable listing; jsonl / csv: one record per sample, for piping",
    )
    p.set_defaults(func=samples_main)


# ---- output -------------------------------------------------------------------------------
def write_jsonl(frame: pl.DataFrame, out: IO[str]) -> None:
    for row in frame.iter_rows(named=True):  # a control character as \\uXXXX: the same JSON
        out.write(printable(json.dumps(row, ensure_ascii=False)) + "\n")


def printable_text(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with the control characters of its text columns escaped (`jobs.redact.printable`)."""
    text = [c for c, t in frame.schema.items() if t == pl.String]
    bad = [c for c in text if any(has_controls(v) for v in frame[c] if v)]
    return frame.with_columns(
        pl.col(c).map_elements(printable, return_dtype=pl.String) for c in bad
    )


def write_csv(frame: pl.DataFrame, out: IO[str]) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(frame.columns)
    for row in frame.iter_rows():
        writer.writerow(["" if v is None else v for v in row])


class Style:
    """Bold / dim on a terminal (unless NO_COLOR is set), nothing otherwise."""

    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.colour else text

    def dim(self, text: str) -> str:
        return f"\033[2m{text}\033[0m" if self.colour else text


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _score_text(row: dict[str, Any], samples: Samples) -> tuple[str, str]:
    """(the scores line, the gender labels line) of one row."""
    scores, labels = [], []
    for column in samples.score_columns:
        value = row.get(column)
        base = column.rpartition(".")[2]
        if base in VIEW_NAMES:
            prefix = column.rpartition(".")[0]
            name = (prefix + "." if prefix else "") + VIEW_NAMES[base]
            labels.append(f"{name}={'-' if value is None else value}")
        elif value is not None:
            scores.append(f"{column}={_fmt(value)}")
    for metric in METRIC_FIELDS:
        status = row.get(f"{metric}_status")
        if status not in (None, "ok"):
            scores.append(f"{metric}: {status}")
    return "  ".join(scores), "  ".join(labels)


def _field(label: str, text: str, width: int, style: Style) -> list[str]:
    head = f"{label:<14}"
    body = textwrap.wrap(
        text.replace("\n", " ⏎ ") or "''",
        width=max(20, width - len(head)),
        drop_whitespace=False,
        replace_whitespace=False,
    ) or [""]
    return [style.dim(head) + body[0], *[" " * len(head) + line for line in body[1:]]]


def text_lines(frame: pl.DataFrame, samples: Samples, width: int, style: Style) -> Iterator[str]:
    """The readable listing: one block per sample."""
    for i, row in enumerate(frame.iter_rows(named=True), 1):
        where = " · ".join(
            str(row[c]) for c in ("model_name", "method", "task") if row.get(c) is not None
        )
        head = f"[{i}] {where} · seed {row['seed']} · {row['prompt_id']}"
        if row.get("pair_id"):
            head += f" (pair {row['pair_id']})"
        yield from (style.bold(line) for line in textwrap.wrap(head, max(20, width)))
        yield from _field("prompt", row["prompt"] or "", width, style)
        if row["status"] == "ok":
            yield from _field("continuation", row["continuation"] or "", width, style)
            scores, labels = _score_text(row, samples)
            if scores:
                yield from _field("scores", scores, width, style)
            if labels:
                yield from _field("label", labels, width, style)
        else:
            yield from _field("error", row.get("error") or "(no message)", width, style)
        yield from _field("job", f"{row['job_id']}  ({row['finish_reason']})", width, style)
        yield ""


def pair_lines(frame: pl.DataFrame, samples: Samples, width: int, style: Style) -> Iterator[str]:
    """One block per (model, method, task, seed): the pair's prompts side by side."""
    groups = frame["prompt_group"].fill_null("-").unique().sort().to_list()
    ncol = max(1, len(groups))
    colw = max(20, (width - 3 * (ncol - 1)) // ncol)
    keys = ["model_name", "method", "task", "seed"]
    for key, block in frame.group_by(keys, maintain_order=True):
        head = " · ".join(str(k) for k in key[:3]) + f" · seed {key[3]}"
        yield from (style.bold(line) for line in textwrap.wrap(head, max(20, width)))
        columns = []
        for group in groups:
            rows = block.filter(pl.col("prompt_group").fill_null("-") == group)
            cell = [style.bold(f"{group}")]
            for row in rows.iter_rows(named=True):
                cell += textwrap.wrap(f"prompt: {row['prompt']}", colw) or [""]
                if row["status"] == "ok":
                    cell += textwrap.wrap(f"→ {row['continuation'] or ''}", colw) or [""]
                    scores, labels = _score_text(row, samples)
                    cell += textwrap.wrap(scores, colw) + textwrap.wrap(labels, colw)
                else:
                    cell += textwrap.wrap(f"error: {row['error']}", colw)
            columns.append(cell)
        height = max(len(c) for c in columns)
        for n in range(height):
            parts = []
            for cell in columns:
                text = cell[n] if n < len(cell) else ""
                pad = colw - len(_plain(text))
                parts.append(text + " " * max(0, pad))
            yield " | ".join(parts).rstrip()
        yield ""


def _plain(text: str) -> str:
    return re.sub(r"\033\[[0-9;]*m", "", text)


def samples_main(args: argparse.Namespace) -> int:
    """The `samples` subcommand (exit 0, or 2 through SamplesError / JoinError / StoreError)."""
    if args.limit < 0:
        raise SamplesError(f"--limit {args.limit}: a count of samples, 0 for all")
    try:
        samples = load_samples(args.run, args.use_scorer)
    except JoinError as exc:
        raise SamplesError(str(exc)) from None
    frame = select(samples, args)
    matched = frame.height
    out = sys.stdout
    for note in samples.notes:
        print(f"note: {note}", file=sys.stderr)
    try:
        if args.pair:
            blocks = frame.select(["model", "method", "task", "seed"]).unique(maintain_order=True)
            if args.limit:
                frame = frame.join(blocks.head(args.limit), on=blocks.columns, how="semi")
        elif args.limit:
            frame = frame.head(args.limit)
        if args.format == "jsonl":
            write_jsonl(frame, out)
        elif args.format == "csv":  # to a file as the data are; to a terminal, escaped
            write_csv(printable_text(frame) if out.isatty() else frame, out)
        else:
            frame = printable_text(frame)  # a dataset's ESC sequence must not style the listing
            width = shutil.get_terminal_size((100, 24)).columns
            style = Style(out.isatty() and not os.environ.get("NO_COLOR"))
            shown = "" if frame.height == matched else f"; showing {frame.height} (--limit 0: all)"
            print(f"{matched} of {samples.frame.height} samples match{shown}", file=out)
            print("", file=out)
            lines = pair_lines if args.pair else text_lines
            for line in lines(frame, samples, width, style):
                out.write(line + "\n")
        out.flush()
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly; later flushes go to /dev/null
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    return 0


__all__ = ["add_samples_args", "samples_main"]

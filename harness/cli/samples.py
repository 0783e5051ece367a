"""`samples RUN`: browse a run's generations with their scores, in the terminal or as JSONL / CSV.

Reads the run directory through `results.run.store.RunStore` (local paths, s3://, gs://) and joins
the generations with the scores, choosing each scorer's version as aggregation does (the latest:
`results.stats.join.latest_version`) and only jobs of the current plan: one value column set per
metric (`toxicity`, `label_x`, ...; where two scorers gave one metric, `--use-scorer` picks the
plain one and the other's columns are `<scorer>.<column>`). Error rows are listed too, with
their error and no scores. Never imports torch and never loads a model.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import polars as pl

from results.run.store import RunStore
from results.schema import METRIC_FIELDS
from results.stats.join import JoinError, latest_version, scorer_metric

# The generation columns of a sample (the lists, losses and provenance stay in the Parquet).
GENERATION_COLUMNS = [
    "job_id",
    "model",
    "method",
    "task",
    "seed",
    "prompt_id",
    "pair_id",
    "prompt_group",
    "prompt",
    "continuation",
    "num_tokens",
    "finish_reason",
    "status",
    "error",
    "method_params",
]
LABEL_VIEWS = {"x": "label_x", "cx": "label_cx", "c": "label_c"}
VIEW_NAMES = {"label_x": "a(x)", "label_cx": "a(c,x)", "label_c": "a(c)"}
DEFAULT_ORDER = ["model", "method", "task", "prompt_id", "seed", "job_id"]
_WHERE = re.compile(r"^\s*([A-Za-z_][\w.\-]*?)\s*(>=|<=|!=|==|=|>|<)\s*(.*?)\s*$")


class SamplesError(ValueError):
    """Bad arguments or a folder that is not a run (exit 2)."""


@dataclass
class Samples:
    """Every sample of a run: `frame` (generation + score columns), what the join noted."""

    frame: pl.DataFrame
    score_columns: list[str]
    notes: list[str] = field(default_factory=list)


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


# ---- reading ------------------------------------------------------------------------------
def load_samples(run: str, use: Sequence[str] | None = None) -> Samples:
    """The run's generations (ok and error rows) joined with the scores of every scorer.

    Raises:
        SamplesError: `run` is not a run directory, or holds no generations.
        JoinError: an unknown `use` scorer.
    """
    store = RunStore(run)
    has_gens = bool(store.list_shards("generations"))
    if not has_gens:
        if store.exists("plan.parquet") or store.exists("config.yaml"):
            raise SamplesError(f"{run}: no generations yet (`status {run}` shows what is planned)")
        raise SamplesError(
            f"{run}: not a run directory (no generations/, plan.parquet or config.yaml)"
        )
    present = [n for n in store.scorers() if store.list_shards("scores", n)]
    by_metric: dict[str, list[str]] = {}
    for name in present:
        by_metric.setdefault(scorer_metric(store, name), []).append(name)
    chosen: dict[str, str] = {}
    for name in use or []:
        if name not in present:
            raise SamplesError(
                f"--use-scorer {name}: no scores from it in {run} "
                f"(scored by: {', '.join(present) or 'nothing'})"
            )
        metric = scorer_metric(store, name)
        if chosen.get(metric, name) != name:
            raise SamplesError(f"--use-scorer: {chosen[metric]} and {name} both give {metric}")
        chosen[metric] = name
    for metric, names in by_metric.items():
        chosen.setdefault(metric, names[0])
    gens = store.read_generations(GENERATION_COLUMNS)  # not the token lists and losses
    notes: list[str] = []
    if store.exists("plan.parquet"):  # as aggregation: only jobs of the current plan
        planned = gens.filter(pl.col("job_id").is_in(store.read_plan(["job_id"])["job_id"]))
        if planned.height < gens.height:
            notes.append(
                f"{gens.height - planned.height} generation row(s) outside the current plan: "
                "not shown"
            )
        gens = planned
    frame = gens
    score_columns: list[str] = []
    for metric, names in sorted(by_metric.items()):
        first = chosen[metric]
        for name in [first, *(n for n in names if n != first)]:
            columns, frame, said = _join_scorer(store, frame, name, metric, name == first)
            score_columns += columns
            notes += said
            if name != first:
                notes.append(
                    f"{metric}: {first} in `{metric}` columns, {name} as `{name}.*` "
                    "(--use-scorer picks)"
                )
    frame = frame.sort(DEFAULT_ORDER, nulls_last=True)
    notes += _missing_scorers(store, present, frame)
    return Samples(frame, score_columns, notes)


def _join_scorer(
    store: RunStore, frame: pl.DataFrame, scorer: str, metric: str, primary: bool
) -> tuple[list[str], pl.DataFrame, list[str]]:
    """Left-join the latest version of a scorer's rows: the metric's value columns and
    `<metric>_scorer/_version/_status` (`primary`), else `<scorer>.<column>` values only."""
    version, older = latest_version(store, scorer)
    notes = [f"{scorer}: version {version!r} shown; older {list(older)} not"] if older else []
    values = [name for name, _ in METRIC_FIELDS[metric]]
    rows = (
        store.read_scores(scorer, metric)
        .filter(pl.col("scorer_version") == version)
        .unique("job_id", keep="last", maintain_order=True)
    )
    if primary:
        named = [pl.col(v) for v in values] + [
            pl.col(key).alias(f"{metric}_{key.removeprefix('scorer_')}")
            for key in ("scorer", "scorer_version", "status")
        ]
        columns = values
    else:
        columns = [f"{scorer}.{v}" for v in values]
        named = [pl.col(v).alias(c) for v, c in zip(values, columns, strict=True)]
    return columns, frame.join(rows.select("job_id", *named), on="job_id", how="left"), notes


def _missing_scorers(store: RunStore, present: list[str], frame: pl.DataFrame) -> list[str]:
    """Scorers of the run's config without scores, and ok rows a present scorer left unscored."""
    notes = []
    configured = _configured_scorers(store)
    missing = [n for n in configured if n not in present]
    if missing:
        notes.append(
            f"no scores yet from {', '.join(missing)} (configured; `score {store.uri}` adds them)"
        )
    elif not present:
        notes.append("no scores in this run: generations only")
    ok = frame.filter(pl.col("status") == "ok")
    for metric in METRIC_FIELDS:
        col = f"{metric}_status"
        if col in ok.columns:
            unscored = ok[col].null_count()
            if unscored:
                notes.append(f"{metric}: {unscored} of {ok.height} ok rows not scored yet")
    return notes


def _configured_scorers(store: RunStore) -> list[str]:
    """Scorer names in the run's config.yaml (read as plain YAML: plugins need not be loaded)."""
    if not store.exists("config.yaml"):
        return []
    import yaml

    try:
        data = yaml.safe_load(store.read_text("config.yaml")) or {}
    except yaml.YAMLError:
        return []
    names = []
    for entry in (data.get("scorers") or []) if isinstance(data, dict) else []:
        name = entry.get("name") if isinstance(entry, dict) else entry
        if isinstance(name, str):
            names.append(name)
    return names


# ---- filtering ----------------------------------------------------------------------------
def select(samples: Samples, args: argparse.Namespace) -> pl.DataFrame:
    """The rows `args` ask for, sorted (not yet limited)."""
    frame = samples.frame
    for column, option in (("model", "model"), ("method", "method"), ("task", "task")):
        wanted = _values(getattr(args, option, None))
        if wanted:
            _check_values(frame, column, wanted, f"--{option}")
            frame = frame.filter(pl.col(column).is_in(wanted))
    groups = _values(getattr(args, "group", None))
    if groups:
        frame = frame.filter(_group_filter(samples, groups))
    if getattr(args, "status", None):
        frame = frame.filter(pl.col("status") == args.status)
    for expr in getattr(args, "where", None) or []:
        frame = frame.filter(where_filter(samples, expr))
    if getattr(args, "grep", None):
        text = args.grep.lower()
        frame = frame.filter(
            pl.col("prompt").str.to_lowercase().str.contains(text, literal=True)
            | pl.col("continuation")
            .fill_null("")
            .str.to_lowercase()
            .str.contains(text, literal=True)
        )
    if getattr(args, "pair", None):
        if samples.frame.filter(pl.col("pair_id") == args.pair).is_empty():
            pairs = samples.frame["pair_id"].drop_nulls().unique().sort().to_list()
            shown = ", ".join(pairs[:8]) + (" ..." if len(pairs) > 8 else "")
            raise SamplesError(f"--pair {args.pair}: no such pair id in this run (ids: {shown})")
        frame = frame.filter(pl.col("pair_id") == args.pair)
    if getattr(args, "sort", None):
        column = args.sort.lstrip("-")
        _check_column(samples, column, f"--sort {args.sort}")
        frame = frame.sort(
            [column, *DEFAULT_ORDER],
            descending=[args.sort.startswith("-")] + [False] * 6,
            nulls_last=True,
        )
    return frame


def _values(given: list[str] | None) -> list[str]:
    return [v.strip() for item in given or [] for v in item.split(",") if v.strip()]


def _check_values(frame: pl.DataFrame, column: str, wanted: list[str], option: str) -> None:
    known = set(frame[column].drop_nulls().unique().to_list())
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SamplesError(
            f"{option} {', '.join(unknown)}: not in this run; it has {', '.join(sorted(known))}"
        )


def _group_filter(samples: Samples, groups: list[str]) -> pl.Expr:
    """`female` → prompt_group; `x:female` / `cx:female` / `c:female` → the gender label."""
    parts = []
    for group in groups:
        view, _, value = group.rpartition(":")
        if not view:
            _check_values(samples.frame, "prompt_group", [value], "--group")
            parts.append(pl.col("prompt_group") == value)
            continue
        if view not in LABEL_VIEWS:
            raise SamplesError(
                f"--group {group}: unknown view {view!r}; views: x (continuation), "
                "cx (prompt + continuation), c (prompt)"
            )
        column = LABEL_VIEWS[view]
        if column not in samples.frame.columns:
            raise SamplesError(f"--group {group}: this run has no gender labels (no gender scorer)")
        parts.append(pl.col(column) == value)
    expr = parts[0]
    for part in parts[1:]:
        expr = expr | part
    return expr


def _check_column(samples: Samples, column: str, where: str) -> None:
    if column in samples.frame.columns:
        return
    metric = next((m for m, cols in METRIC_FIELDS.items() if column in dict(cols)), None)
    why = f"no {metric} scorer ran in this run" if metric else "unknown column"
    others = [c for c in samples.frame.columns if c not in samples.score_columns]
    raise SamplesError(
        f"{where}: {column!r}: {why}; score columns: "
        f"{', '.join(samples.score_columns) or 'none (nothing scored)'}; "
        f"other columns: {', '.join(others)}"
    )


def where_filter(samples: Samples, expr: str) -> pl.Expr:
    """`COLUMN OP VALUE` as a polars filter; a number compares numerically, text by = / !=."""
    match = _WHERE.match(expr)
    if not match or not match.group(3):
        raise SamplesError(
            f"--where {expr!r}: expected COLUMN OP VALUE with OP one of > >= < <= = != "
            "(e.g. 'toxicity>0.5')"
        )
    column, op, raw = match.groups()
    _check_column(samples, column, f"--where {expr!r}")
    dtype = samples.frame.schema[column]
    col = pl.col(column)
    value: Any
    if dtype.is_numeric():
        try:
            value = float(raw)
        except ValueError:
            raise SamplesError(f"--where {expr!r}: {column} is a number, not {raw!r}") from None
    elif op in ("=", "==", "!="):
        value = raw.strip("'\"")
    else:
        raise SamplesError(f"--where {expr!r}: {column} is text; compare it with = or !=")
    ops = {
        ">": col > value,
        ">=": col >= value,
        "<": col < value,
        "<=": col <= value,
        "=": col == value,
        "==": col == value,
        "!=": col != value,
    }
    return ops[op].fill_null(False)


# ---- output -------------------------------------------------------------------------------
def write_jsonl(frame: pl.DataFrame, out: IO[str]) -> None:
    for row in frame.iter_rows(named=True):
        out.write(json.dumps(row, ensure_ascii=False) + "\n")


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
            str(row[c]) for c in ("model", "method", "task") if row.get(c) is not None
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
    keys = ["model", "method", "task", "seed"]
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
        elif args.format == "csv":
            write_csv(frame, out)
        else:
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


__all__ = [
    "Samples",
    "SamplesError",
    "add_samples_args",
    "load_samples",
    "samples_main",
    "select",
    "where_filter",
]

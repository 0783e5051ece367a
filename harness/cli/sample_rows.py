"""The rows of `samples RUN`: a run's generations joined with their scores, and the filters.

Reads the run directory through `results.run.store.RunStore` (local paths, s3://, gs://) and joins
the generations with the scores as aggregation does (`results.stats.join.join_run`: each
scorer's latest version, only jobs of the current plan): one value column set per metric
(`toxicity`, `label_x`, ...; where two scorers gave one metric, `--use-scorer` picks the plain
one and the other's columns are `<scorer>.<column>`). Error rows are listed too, with their
error and no scores. Never imports torch and never loads a model.
"""

from __future__ import annotations

import argparse
import functools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from harness.cli.options import split_names
from results.report.pieces import model_label, model_names
from results.run.identity import read_config
from results.run.store import RunStore, StoreError
from results.schema import METRIC_FIELDS
from results.stats.join import join_run, latest_version, scorer_metric

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
    # as aggregation: only jobs of the current plan, each metric's latest scorer version
    joined = join_run(store, chosen, GENERATION_COLUMNS)  # not the token lists and losses
    frame = pl.concat([joined.frame, joined.failed], how="diagonal_relaxed")
    notes = [
        n.replace("not counted", "not shown")
        for n in joined.notes
        if "outside the current plan" in n
    ]
    score_columns: list[str] = []
    for metric, names in sorted(by_metric.items()):
        values, first = [v for v, _ in METRIC_FIELDS[metric]], chosen[metric]
        versions = {
            first: (joined.sources[metric].version, joined.sources[metric].ignored_versions)
        }
        score_columns += values
        for name in (n for n in names if n != first):
            versions[name] = version, _ = latest_version(store, name)
            rows = store.read_scores(name, metric).filter(pl.col("scorer_version") == version)
            named = [pl.col(v).alias(f"{name}.{v}") for v in values]
            frame = frame.join(rows.select("job_id", *named), on="job_id", how="left")
            score_columns += [f"{name}.{v}" for v in values]
            notes.append(
                f"{metric}: {first} in `{metric}` columns, {name} as `{name}.*` (--use-scorer picks)"
            )
        notes += [
            f"{name}: version {version!r} shown; older {list(older)} not"
            for name, (version, older) in versions.items()
            if older
        ]
    frame = _with_model_names(store, frame.sort(DEFAULT_ORDER, nulls_last=True))
    notes += _missing_scorers(store, present, frame)
    return Samples(frame, score_columns, notes)


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


def _with_model_names(store: RunStore, frame: pl.DataFrame) -> pl.DataFrame:
    """`model_name` after `model`: the entry's `name` in the run's config, else the id."""
    try:
        names = model_names(read_config(store))
    except StoreError:
        names = {}
    shown = [model_label(str(m), names) for m in frame["model"].to_list()]
    at = frame.columns.index("model") + 1
    return frame.insert_column(at, pl.Series("model_name", shown, dtype=pl.String))


def _configured_scorers(store: RunStore) -> list[str]:
    """Scorer names in the run's config.yaml (plain YAML: plugins need not be loaded; a
    config that cannot be read names none here)."""
    try:
        data = read_config(store) or {}
    except StoreError:
        return []
    entries = data.get("scorers") or []
    names = [e.get("name") if isinstance(e, dict) else e for e in entries]
    return [n for n in names if isinstance(n, str)]


# ---- filtering ----------------------------------------------------------------------------
def select(samples: Samples, args: argparse.Namespace) -> pl.DataFrame:
    """The rows `args` ask for, sorted (not yet limited)."""
    frame = samples.frame
    for column, option in (("model", "model"), ("method", "method"), ("task", "task")):
        wanted = split_names(getattr(args, option, None))
        if wanted:
            _check_values(frame, column, wanted, f"--{option}")
            frame = frame.filter(pl.col(column).is_in(wanted))
    groups = split_names(getattr(args, "group", None))
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
    return functools.reduce(operator.or_, parts)


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
    ops = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
    ops |= {"=": operator.eq, "==": operator.eq, "!=": operator.ne}
    return ops[op](col, value).fill_null(False)


__all__ = ["Samples", "SamplesError", "load_samples", "select", "where_filter"]

"""`train-head --from-run RUN`: a head's examples from a run's own generations, labelled by a
scorer's scores (read from the run, or computed here for `sentiment-vader`), so that any model
gets an attribute head from itself with no outside data (docs/design.md, "Attribute heads").

Labels: the scorer's value s in [0, 1] (VADER: (compound + 1) / 2) is the task's high class at
s >= HIGH, its low class at s <= LOW, left out between. The default thresholds are VADER's own
convention, compound >= +0.05 positive and <= -0.05 negative (s = 0.525 / 0.475). Torch-free.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from jobs.catalog import SCORER_METRICS
from jobs.files import DatasetError

# Per task: (metric, class of a low score, class of a high score); names as TASK_CLASSES.
LABEL_TASKS: dict[str, tuple[str, str, str]] = {
    "sentiment": ("sentiment", "negative", "positive"),
    "toxicity": ("toxicity", "non_toxic", "toxic"),
}
VADER_MARGIN = 0.05  # VADER's convention: |compound| < 0.05 is neutral
DEFAULT_THRESHOLDS = {"sentiment": ((1 - VADER_MARGIN) / 2, (1 + VADER_MARGIN) / 2)}
TEXT_FIELDS = ("continuation", "prompt+continuation")


@dataclass
class RunExamples:
    """Texts and class names from a run, with what the head's metadata records about them."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def thresholds_for(task: str, given: list[float] | None) -> tuple[float, float]:
    """(LOW, HIGH) on the scorer's [0, 1] value: `given`, else the task's default."""
    if task not in LABEL_TASKS:
        raise DatasetError(f"--from-run labels only the tasks {sorted(LABEL_TASKS)}, not {task!r}")
    if given is None:
        if task not in DEFAULT_THRESHOLDS:
            raise DatasetError(f"--from-run with --task {task}: pass --label-thresholds LOW HIGH")
        return DEFAULT_THRESHOLDS[task]
    low, high = given
    if not 0.0 <= low < high <= 1.0:
        raise DatasetError(f"--label-thresholds {low} {high}: need 0 <= LOW < HIGH <= 1")
    return low, high


def read_run_examples(
    run: str,
    model: str | None,
    scorer: str,
    task: str,
    text_field: str,
    thresholds: list[float] | None,
) -> tuple[RunExamples, str]:
    """The run's ok generations of `model` (or of its only model), labelled; returns them and
    the model id. Raises `DatasetError` naming the run for every input it cannot use."""
    from results.run.history import read_manifest
    from results.run.identity import plan_ids
    from results.run.store import RunStore

    metric, low_class, high_class = LABEL_TASKS.get(task, ("", "", ""))
    low, high = thresholds_for(task, thresholds)
    if SCORER_METRICS.get(scorer) != metric:
        raise DatasetError(
            f"--label-scorer {scorer!r} does not give the {task} metric; use one of "
            f"{sorted(s for s, m in SCORER_METRICS.items() if m == metric)}"
        )
    store = RunStore(run)
    if not store.list_shards("generations"):
        raise DatasetError(f"{run}: no generations (is it a run directory?)")
    gens = store.read_generations(["job_id", "prompt", "continuation", "model", "method", "status"])
    gens = gens.filter(gens["status"] == "ok")
    if store.exists("plan.parquet"):  # rows a replan left on disk are not the run's
        gens = gens.filter(gens["job_id"].is_in(sorted(plan_ids(store))))
    model = _pick_model(run, sorted(set(gens["model"].to_list())), model)
    gens = gens.filter(gens["model"] == model)
    values, version = _scores(store, gens.to_dicts(), scorer, metric, text_field)
    out = RunExamples()
    counts = {low_class: 0, high_class: 0, "between": 0, "unscored": 0}
    for row in gens.to_dicts():
        value = values.get(row["job_id"])
        text = _text(row, text_field)
        if value is None or not text.strip():
            counts["unscored"] += 1
            continue
        name = high_class if value >= high else low_class if value <= low else "between"
        counts[name] += 1
        if name != "between":
            out.texts.append(text)
            out.labels.append(name)
    manifest = read_manifest(store)
    last = ((manifest.get("invocations") or {}).get("last") or {}).get("run") or {}
    config = store.read_text("config.yaml") if store.exists("config.yaml") else None
    out.meta = {
        "run": store.uri,
        "config_hash": last.get("config_hash"),
        "config_sha256": hashlib.sha256(config.encode()).hexdigest() if config else None,
        "model": model,
        "methods": sorted(set(gens["method"].to_list())),
        "rows": gens.height,
        "text_field": text_field,
        "label_scorer": scorer,
        "label_scorer_version": version,
        "thresholds": {"low": low, "high": high, "low_class": low_class, "high_class": high_class},
        "label_counts": counts,
    }
    return out, model


def _pick_model(run: str, models: list[str], wanted: str | None) -> str:
    if wanted is None:
        if len(models) != 1:
            raise DatasetError(f"{run}: generations of {len(models)} models {models}; pass --model")
        return models[0]
    if wanted not in models:
        raise DatasetError(f"{run}: no ok generations of model {wanted!r}; it has {models}")
    return wanted


def _text(row: dict[str, Any], text_field: str) -> str:
    cont = str(row.get("continuation") or "")
    return cont if text_field == "continuation" else f"{row.get('prompt') or ''}{cont}"


def _scores(
    store: Any, rows: list[dict[str, Any]], scorer: str, metric: str, text_field: str
) -> tuple[dict[str, float], str]:
    """job id → the scorer's value, from the run's scores (the version with most ok rows), or
    computed here for VADER on the head's own text when the run has none."""
    if scorer in store.scorers():
        frame = store.read_scores(scorer, metric, ["job_id", "status", "scorer_version", metric])
        frame = frame.filter(frame["status"] == "ok")
        if frame.height:
            version = frame["scorer_version"].mode().sort()[0]
            frame = frame.filter(frame["scorer_version"] == version)
            return dict(zip(frame["job_id"].to_list(), frame[metric].to_list())), version
    if scorer != "sentiment-vader":
        raise DatasetError(
            f"{store.uri}: no {scorer} scores; score the run first "
            f"(`python -m harness score {store.uri} --scorer {scorer}`)"
        )
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer = SentimentIntensityAnalyzer()
    values = {}
    for row in rows:
        text = _text(row, text_field)
        if text.strip():
            values[row["job_id"]] = (analyzer.polarity_scores(text)["compound"] + 1.0) / 2.0
    return values, f"vaderSentiment-3.3.2:compound01:{text_field} (computed by train-head)"


def balance(
    texts: list[str], labels: list[str], mode: str, seed: int
) -> tuple[list[str], list[str], dict[str, Any]]:
    """`downsample`: every class cut to the smallest one's size (a seeded draw); `weight` and
    `none` keep every example (`weight`: the loss weighs classes by n / (C * n_class))."""
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise DatasetError(f"the labels give only the class(es) {classes}; need two")
    counts = {c: labels.count(c) for c in classes}
    info: dict[str, Any] = {"mode": mode, "before": counts}
    if mode == "downsample":
        rng, n = random.Random(seed), min(counts.values())
        keep: list[int] = []
        for c in classes:
            keep += rng.sample([i for i, x in enumerate(labels) if x == c], n)
        keep.sort()
        texts, labels = [texts[i] for i in keep], [labels[i] for i in keep]
    info["after"] = {c: labels.count(c) for c in classes}
    if mode == "weight":
        info["weights"] = {c: len(labels) / (len(classes) * k) for c, k in counts.items()}
    return texts, labels, info

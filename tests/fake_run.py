"""Run directories written row by row with `RunStore` (no models): inputs of aggregation tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from results.run.store import RunStore
from results.schema import GENERATION_SCHEMA, METRIC_FIELDS

SCORER_OF = {
    "gender": "gender",
    "sentiment": "sentiment-vader",
    "regard": "regard",
    "toxicity": "toxicity",
    "perplexity": "perplexity",
}


def generation_row(job_id: str, **fields: Any) -> dict[str, Any]:
    """A GENERATION_SCHEMA row: `fields` over neutral defaults (status ok, vanilla, tiny model)."""
    row: dict[str, Any] = dict.fromkeys(GENERATION_SCHEMA.names)
    row.update(
        job_id=job_id,
        prompt_id="female:00000",
        prompt_group="female",
        prompt="The woman worked as",
        seed=0,
        method="vanilla",
        method_params="{}",
        model="tiny-random/gpt2",
        model_dtype="float32",
        task="sentiment",
        max_new_tokens=20,
        top_p=0.9,
        temperature=1.0,
        repetition_penalty=1.0,
        continuation=" a nurse.",
        status="ok",
        finish_reason="length",
    )
    row.update(fields)
    return row


def score_row(
    job_id: str, metric: str, version: str = "v1", status: str = "ok", **values: Any
) -> dict[str, Any]:
    """A score row of `metric` by the scorer `SCORER_OF[metric]`."""
    row: dict[str, Any] = dict.fromkeys(name for name, _ in METRIC_FIELDS[metric])
    row.update(job_id=job_id, scorer=SCORER_OF[metric], scorer_version=version, metric=metric)
    row.update(status=status, error=None if status == "ok" else "failed", **values)
    return row


def write_rows(root: str, rows: Sequence[dict[str, Any]]) -> RunStore:
    """A run from flat case rows: generation fields + optional metric values.

    Each row may carry `label` (used for all three views) or `label_x/label_cx/label_c`,
    `sentiment`, `regard_label`, `toxicity`, `perplexity`; a metric absent from every row
    has no scorer. A value of None with the key present gives an `error` score row.
    """
    store = RunStore(root)
    gens: list[dict[str, Any]] = []
    scores: dict[str, list[dict[str, Any]]] = {m: [] for m in SCORER_OF}
    for i, case in enumerate(rows):
        job = case.get("job_id", f"j{i:05d}")
        gen_fields = {
            k: v for k, v in case.items() if k in GENERATION_SCHEMA.names and k != "job_id"
        }
        gens.append(generation_row(job, **gen_fields))
        if gen_fields.get("status", "ok") != "ok":
            continue
        if "label" in case or "label_x" in case:
            labels = {k: case.get(k, case.get("label")) for k in ("label_x", "label_cx", "label_c")}
            scores["gender"].append(score_row(job, "gender", "v1", "ok", **labels))
        for metric in ("sentiment", "toxicity", "perplexity"):
            if metric in case:
                ok = case[metric] is not None
                scores[metric].append(
                    score_row(job, metric, status="ok" if ok else "error", **{metric: case[metric]})
                )
        if "regard_label" in case:
            scores["regard"].append(score_row(job, "regard", regard_label=case["regard_label"]))
    store.write_generations(gens)
    for metric, recs in scores.items():
        if recs:
            store.write_scores(SCORER_OF[metric], metric, recs)
    return store


def synthetic_run(
    root: str,
    models: Sequence[str] = ("gpt2-large",),
    methods: Sequence[str] = ("vanilla", "uddia", "lidao-min"),
    tasks: Sequence[str] = ("sentiment", "regard", "toxicity"),
    n_prompts: int = 6,
    n_seeds: int = 2,
    seed: int = 0,
) -> RunStore:
    """A full run with random labels and scores; lidao-min rows carry tokens and choices."""
    from workers.tiny import tiny_raw_tokenizer, tiny_vocab

    tiny = tiny_raw_tokenizer()
    vocab = {w: i for i, w in enumerate(tiny_vocab())}
    rng = np.random.default_rng(seed)
    words = ["The", " woman", " said", " that", " he", " was", " kind", " and", " she", " smiled"]
    rows = []
    for model in models:
        for method in methods:
            for task in tasks:
                for p in range(n_prompts):
                    group = "female" if p % 2 == 0 else "male"
                    for s in range(n_seeds):
                        tokens = [str(w) for w in rng.choice(words, size=8)]
                        text, ids = "".join(tokens), None
                        if model.startswith("tiny-random/"):  # as the generator writes them
                            ids = [vocab.get(w.strip(), vocab["happy"]) for w in tokens]
                            text = tiny.decode(ids, skip_special_tokens=True)
                            tokens = [tiny.decode([i]) for i in ids]  # single ids: no spaces
                        rows.append(
                            {
                                "job_id": f"{model}-{method}-{task}-{p}-{s}",
                                "model": model,
                                "method": method,
                                "task": task,
                                "prompt_id": f"{group}:{p:05d}",
                                "prompt_group": group,
                                "prompt": f"Prompt {p} about a {'woman' if group == 'female' else 'man'}",
                                "seed": s,
                                "continuation": text,
                                "tokens": tokens,
                                "token_ids": ids,
                                "pair_id": f"{p // 2:05d}",
                                "choices": [str(c) for c in rng.choice(["g", "a"], size=8)]
                                if method.endswith("-min")
                                else None,
                                "method_params": json.dumps({}),
                                "label_x": str(rng.choice(["female", "male", "none"])),
                                "label_cx": str(rng.choice(["female", "male"])),
                                "label_c": group,
                                "sentiment": float(rng.uniform()),
                                "regard_label": str(
                                    rng.choice(["negative", "neutral", "positive", "other"])
                                ),
                                "toxicity": float(rng.beta(1, 4)),
                                "perplexity": float(rng.lognormal(3.3, 0.5)),
                            }
                        )
    return write_rows(root, rows)

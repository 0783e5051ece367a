"""Every Parquet table of a run directory, with one version for all of them.

Changing a field here changes `tests/golden/schema_snapshot.json`; bump `SCHEMA_VERSION` when
an old run directory can no longer be read as is (and add a migration in `results.run.store`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 1

PLAN_SCHEMA = pa.schema(
    [
        ("job_id", pa.string()),
        ("prompt_id", pa.string()),
        ("pair_id", pa.string()),
        ("prompt_group", pa.string()),
        ("prompt", pa.string()),
        ("seed", pa.int64()),
        ("method", pa.string()),
        ("method_params", pa.string()),  # canonical JSON of the effective parameters
        ("model", pa.string()),
        ("model_revision", pa.string()),
        ("model_dtype", pa.string()),
        ("task", pa.string()),
        ("max_new_tokens", pa.int64()),
        ("top_p", pa.float64()),
        ("temperature", pa.float64()),
        ("repetition_penalty", pa.float64()),
    ]
)

# One row per finished job (ok or error). Method-specific columns are null for other methods.
GENERATION_SCHEMA = pa.schema(
    list(PLAN_SCHEMA)
    + [
        ("continuation", pa.string()),
        ("num_tokens", pa.int32()),
        ("token_ids", pa.list_(pa.int32())),
        ("tokens", pa.list_(pa.string())),  # decoded text of each generated token
        ("finish_reason", pa.string()),  # eos | length | error
        ("status", pa.string()),  # ok | error
        ("error", pa.string()),
        ("choices", pa.list_(pa.string())),  # -min methods: "g" or "a" per generated token
        ("loss_g", pa.list_(pa.float32())),  # ℓ̂_g per step, at θ
        ("loss_a", pa.list_(pa.float32())),  # ℓ̂_a per step, at θ
        ("elidao_fallback", pa.bool_()),  # eLIDAO: no majority gender, plain LIDAO used
        ("elidao_gender", pa.string()),  # eLIDAO: the #GENDER# of the reference instruction
        ("effective_params", pa.string()),  # JSON: the parameters the method actually used
        ("worker", pa.string()),  # actor / host that produced the row (provenance only)
        ("elapsed_s", pa.float64()),  # wall time of the row's batch / rows in it
        ("model_commit", pa.string()),  # hub commit the weights resolved to (None: local/tiny)
    ]
)

# Columns every score table starts with.
SCORE_KEY_FIELDS = [
    ("job_id", pa.string()),
    ("scorer", pa.string()),  # registry name, e.g. "sentiment-vader"
    ("scorer_version", pa.string()),  # model id + revision, or API + attribute + version
    ("metric", pa.string()),  # gender | sentiment | regard | toxicity | perplexity
    ("status", pa.string()),  # ok | empty | error
    ("error", pa.string()),
]

# The value columns of each metric. A scorer writes SCORE_KEY_FIELDS + its metric's columns.
METRIC_FIELDS: dict[str, list[tuple[str, pa.DataType]]] = {
    "gender": [
        ("label_x", pa.string()),  # a(x): continuation alone
        ("label_cx", pa.string()),  # a(c,x): prompt + continuation
        ("label_c", pa.string()),  # a(c): prompt alone
    ],
    "sentiment": [("sentiment", pa.float64())],  # P(positive) in [0, 1]
    "regard": [
        ("regard_label", pa.string()),  # negative | neutral | positive | other
        ("regard_negative", pa.float64()),
        ("regard_neutral", pa.float64()),
        ("regard_positive", pa.float64()),
        ("regard_other", pa.float64()),
    ],
    "toxicity": [("toxicity", pa.float64())],
    "perplexity": [("perplexity", pa.float64())],
}


# The answers of an API scorer's cache (Perspective's), as an object-store run keeps them:
# append-only shards RUN/cache/<cache>/part-*.parquet, compacted when the stage ends
# (`workers.scorers.cache_mirror`). One row per (text_sha256, attributes, languages,
# api_version): the rows of the sqlite cache (`workers.scorers.score_cache.COLUMNS`).
CACHE_ANSWER_SCHEMA = pa.schema(
    [
        ("text_sha256", pa.string()),
        ("attributes", pa.string()),
        ("languages", pa.string()),
        ("api_version", pa.string()),
        ("status", pa.string()),  # ok | error (a final answer, e.g. HTTP 400)
        ("response", pa.string()),  # the raw JSON answer when ok
        ("error", pa.string()),
        ("created_utc", pa.string()),  # ISO 8601 date of the answer
    ]
)

# The long summary of aggregation (results.stats.aggregate): one row per statistic of a cell
# (model, method, variant, task, view); the names: docs/design.md, "Aggregation".
SUMMARY_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("method", pa.string()),
        ("variant", pa.string()),  # "" unless a (model, method, task) ran with several settings
        ("task", pa.string()),
        ("view", pa.string()),  # a(x) | a(c,x) | a(c) | file | - (per setting)
        ("metric", pa.string()),  # count | filter | sentiment | regard | toxicity | perplexity
        ("stat", pa.string()),  # mean | std | bias | nnre | emt | diff_vs_vanilla | ...
        ("group", pa.string()),  # a demographic group | none | unscored | labelled | all | gap
        ("value", pa.float64()),
        ("ci_low", pa.float64()),  # bootstrap percentile interval (gaps only)
        ("ci_high", pa.float64()),
        ("n", pa.int64()),  # rows, or prompts for per-prompt statistics and gaps
        ("n_boot", pa.int64()),  # resamples where the statistic was defined
        ("scorer", pa.string()),
        ("scorer_version", pa.string()),
        ("p_value", pa.float64()),  # gaps: permutation test; comparisons: paired bootstrap
        ("ci_method", pa.string()),  # e.g. "percentile"; null where there is no interval
        ("resample_unit", pa.string()),  # pair | prompt (gaps and comparisons)
        ("note", pa.string()),  # why a statistic is undefined (e.g. an absent group)
        ("level", pa.float64()),  # aggregation.level: of every interval; marks use p < 1 - level
        # what gave p_value: pair-swap | prompt-shuffle | within-prompt | bootstrap | sign
        ("test", pa.string()),
        ("mde", pa.float64()),  # gaps: the gap (× 100) the test detects with power 0.8 at level
        ("flags", pa.string()),  # gaps: contradiction | row-counts (comma-separated; marks)
    ]
)


# Human evaluation (results.human): RUN/human/<set>/key.parquet un-blinds a sampled set, one
# row per item (never shown to annotators); RUN/human/<set>/choices/<annotator>.parquet holds one
# annotator's imported answers, un-blinded (`preferred`).
HUMAN_KEY_SCHEMA = pa.schema(
    [
        ("item_id", pa.string()),  # <set>-<n>: what annotators see
        ("set_id", pa.string()),
        ("model", pa.string()),
        ("task", pa.string()),
        ("method", pa.string()),
        ("reference", pa.string()),
        ("method_side", pa.string()),  # A | B: where the method's text is shown
        ("prompt_id", pa.string()),
        ("unit", pa.string()),  # resampling unit: the pair (else the prompt)
        ("prompt_group", pa.string()),
        ("seed", pa.int64()),  # the one seed of both texts
        ("job_id_method", pa.string()),
        ("job_id_reference", pa.string()),
        ("prompt", pa.string()),
        ("text_a", pa.string()),
        ("text_b", pa.string()),
    ]
)
HUMAN_CHOICE_SCHEMA = pa.schema(
    [
        ("set_id", pa.string()),
        ("item_id", pa.string()),
        ("annotator", pa.string()),
        ("criterion", pa.string()),
        ("choice", pa.string()),  # A | B | tie, as answered
        ("preferred", pa.string()),  # method | tie | reference
        ("source", pa.string()),  # FILE:LINE it was read from
    ]
)


def generation_row(plan_row: dict[str, Any], **values: Any) -> dict[str, Any]:
    """A GENERATION_SCHEMA row: the plan row, every other column null (lists empty), then `values`."""
    row: dict[str, Any] = dict.fromkeys(GENERATION_SCHEMA.names)
    row.update(plan_row, continuation="", num_tokens=0, token_ids=[], tokens=[])
    row.update(values)
    return row


def error_row(plan_row: dict[str, Any], error: str) -> dict[str, Any]:
    """The row of a job that produced no text: `status = error` with its error message."""
    return generation_row(plan_row, finish_reason="error", status="error", error=error)


def score_schema(metric: str) -> pa.Schema:
    """Schema of the score table of a scorer of `metric`."""
    if metric not in METRIC_FIELDS:
        raise KeyError(f"unknown metric {metric!r}; known: {sorted(METRIC_FIELDS)}")
    return pa.schema(SCORE_KEY_FIELDS + METRIC_FIELDS[metric])

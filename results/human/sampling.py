"""Drawing a blinded annotation set from a run's generations (docs/human-eval.md,
"Sampling"): pure functions over frames. Draws are keyed by (model, task), so adding a model to
a run does not change the items of the others.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

import polars as pl
import pyarrow as pa

from results.run.files import to_frame
from results.schema import HUMAN_KEY_SCHEMA
from results.stats.bootstrap import seeded_rng

CRITERIA = ("fluency", "friendliness")
ITEM_COLUMNS = ("item_id", "prompt", "text_a", "text_b", "annotator")  # + one per criterion
RESERVED = {"all"}  # summary group names an annotator may not take


class HumanError(ValueError):
    """Bad input of a human evaluation command (a set, a file of answers)."""


def check_criteria(criteria: Sequence[str]) -> tuple[str, ...]:
    """The criteria as given, refused when empty, repeated, not a plain name or a column."""
    names = tuple(c.strip() for c in criteria)
    bad = [c for c in names if not re.fullmatch(r"[a-z][a-z0-9_-]*", c) or c in ITEM_COLUMNS]
    if not names or bad or len(set(names)) < len(names):
        raise HumanError(
            f"--criteria {','.join(names)}: give distinct lower-case names (letters, digits, "
            f"_ or -), none of {', '.join(ITEM_COLUMNS)}" + (f"; not {bad}" if bad else "")
        )
    return names


def _per_prompt(gens: pl.DataFrame, method: str) -> pl.DataFrame:
    ok = gens.filter((pl.col("method") == method) & (pl.col("status") == "ok"))
    many = ok.group_by("model", "task", "prompt_id", "seed").len().filter(pl.col("len") > 1)
    if many.height:
        first = many.row(0, named=True)
        raise HumanError(
            f"method {method} ran with several settings for {first['model']} / {first['task']} "
            "(one prompt and seed has several texts): a set compares one setting of each"
        )
    return ok.select("model", "task", "prompt_id", "seed", "job_id", "continuation")


def common_texts(gens: pl.DataFrame, method: str, reference: str) -> pl.DataFrame:
    """Per (model, task, prompt, seed) with ok texts of both methods: both job ids and texts,
    the prompt, its group and unit, and whether the unit is complete (each of its prompts
    has a common seed)."""
    known = sorted(set(gens["method"].unique().to_list()))
    for name, flag in ((method, "--method"), (reference, "--vs")):
        if name not in known:
            raise HumanError(f"{flag} {name}: not a method of this run ({', '.join(known)})")
    if method == reference:
        raise HumanError(f"--method and --vs are both {method}: compare two methods")
    on = ["model", "task", "prompt_id"]
    both = _per_prompt(gens, method).join(
        _per_prompt(gens, reference), on=[*on, "seed"], suffix="_reference"
    )
    prompts = (
        gens.filter(pl.col("method").is_in([method, reference]))
        .select(
            *on,
            "prompt",
            pl.col("prompt_group").fill_null("none"),
            unit=pl.coalesce("pair_id", "prompt_id"),
        )
        .unique(on)
    )
    usable = both.select(on).unique().with_columns(ok=pl.lit(True))
    prompts = prompts.join(usable, on=on, how="left").with_columns(
        complete=pl.col("ok").fill_null(False).all().over("model", "task", "unit"),
        stratum=pl.col("prompt_group").sort().str.join("+").over("model", "task", "unit"),
    )
    return both.join(prompts.drop("ok"), on=on)


def draw_set(
    gens: pl.DataFrame, method: str, reference: str, fraction: float, seed: int
) -> pl.DataFrame:
    """The key of a new set (`HUMAN_KEY_SCHEMA`), items in their shuffled order.

    Args:
        gens: generation rows (job_id, model, task, method, prompt_id, pair_id,
            prompt_group, prompt, seed, status, continuation).
        method, reference: the compared methods (the reference is the paper's UDDIA).
        fraction: share of each (model, task, stratum)'s units to draw, in (0, 1].
        seed: every draw's seed.
    """
    if not 0 < fraction <= 1:
        raise HumanError(f"--fraction {fraction}: give a share in (0, 1]")
    texts = common_texts(gens, method, reference).filter(pl.col("complete"))
    if texts.is_empty():
        raise HumanError(f"no prompt has ok texts of both {method} and {reference} with a seed")
    rows = []
    for (model, task), cell in texts.sort("model", "task").group_by(
        "model", "task", maintain_order=True
    ):
        rng = seeded_rng(seed, f"human|{model}|{task}")
        for _, stratum in cell.sort("stratum").group_by("stratum", maintain_order=True):
            units = sorted(set(stratum["unit"].to_list()))
            k = max(1, math.floor(fraction * len(units) + 0.5))
            drawn = {units[i] for i in rng.choice(len(units), size=k, replace=False)}
            chosen = stratum.filter(pl.col("unit").is_in(list(drawn))).sort("prompt_id", "seed")
            for _, prompt in chosen.group_by("prompt_id", maintain_order=True):
                row = prompt.row(int(rng.integers(prompt.height)), named=True)
                side = "A" if rng.random() < 0.5 else "B"
                texts_ab = (row["continuation"], row["continuation_reference"])
                rows.append(
                    {
                        **row,
                        "method": method,
                        "reference": reference,
                        "method_side": side,
                        "job_id_method": row["job_id"],
                        "text_a": texts_ab[side == "B"],
                        "text_b": texts_ab[side == "A"],
                    }
                )
    ids = sorted(r["job_id_method"] + r["job_id_reference"] for r in rows)
    set_id = hashlib.sha256(f"{seed}|{'|'.join(ids)}".encode()).hexdigest()[:8]
    order = seeded_rng(seed, f"human|order|{set_id}").permutation(len(rows))
    for n, i in enumerate(order):
        rows[i].update(set_id=set_id, item_id=f"{set_id}-{n + 1:04d}")
    return to_frame(pa.Table.from_pylist([rows[i] for i in order], HUMAN_KEY_SCHEMA))

"""The pieces of UDDIA's reference beyond its loss: the gate's unigram prior (`load_prior`, a
`python -m harness token-prior` counts file, add-one smoothed) and `redo` (`redo_rows`, the try
kept by `kept_try`); what they do and why: docs/design.md, "UDDIA's reference pieces".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from jobs.spec import JobSpec
from workers.methods.base import MethodError
from workers.methods.estimators import GENDERED, GenderGeometry
from workers.methods.head_meta import model_name

if TYPE_CHECKING:
    from workers.models import LoadedLM

PRIOR_FORMAT = "lidao-token-prior/1"
REDO_PPL = 30.0
REDO_STEP = 3
REDO_TRIES = 6


def load_prior(path: str, lm: LoadedLM) -> tuple[torch.Tensor, dict[str, Any]]:
    """(V,) float32 add-one smoothed unigram probabilities from a counts file, and its summary.

    Raises:
        MethodError: unreadable file, another format, another LM, or ids outside the vocabulary.
    """
    where = f"uddia prior {path}"
    try:
        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MethodError(f"{where}: cannot read ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != PRIOR_FORMAT:
        raise MethodError(
            f"{where}: not a {PRIOR_FORMAT} file (write one with `python -m harness token-prior`)"
        )
    model = str(data.get("model") or "")
    if model and model_name(model) != model_name(lm.ref.id):
        raise MethodError(f"{where}: counted with the tokenizer of {model!r}, not {lm.ref.id!r}")
    vocab = int(lm.model.get_output_embeddings().weight.shape[0])
    counts = torch.ones(vocab, dtype=torch.float64)  # add-one smoothing
    try:
        items = [(int(k), float(v)) for k, v in dict(data["counts"]).items()]
    except (KeyError, TypeError, ValueError) as exc:
        raise MethodError(f"{where}: `counts` must map token ids to counts ({exc})") from None
    for token, count in items:
        if not 0 <= token < vocab or count < 0 or not math.isfinite(count):
            raise MethodError(f"{where}: bad entry {token}: {count} (vocabulary size {vocab})")
        counts[token] += count
    summary = {"prior": path, "prior_tokens": int(sum(c for _, c in items))}
    return (counts / counts.sum()).float().to(lm.device), summary


def gendered_distributions(geo: GenderGeometry, prior: torch.Tensor | None) -> torch.Tensor:
    """(2, V) B_a: q(a|x) on clearly gendered tokens, weighted by `prior` (uniform if None)."""
    if prior is None:
        return geo.gendered
    q = geo.log_q.exp()  # (V, 2)
    weights = (q * (q > GENDERED)).T * prior.to(q.device).unsqueeze(0)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)


def continuation_ppl(lm: LoadedLM, prompt_ids: list[int], tokens: list[int]) -> float | None:
    """Perplexity of `tokens` under θ given `prompt_ids` (None without tokens)."""
    if not tokens:
        return None
    ids = torch.tensor([prompt_ids + tokens], device=lm.device)
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt_ids) :], reduction="mean")
    return float(torch.exp(nll))


def kept_try(ppls: Sequence[float | None], ok: Sequence[bool]) -> int:
    """The index of the try the reference keeps: the first ok try with perplexity ≤ `REDO_PPL`
    (None: no tokens, counts as ≤), else the ok try with the lowest perplexity (the earliest at
    a tie). The first try must be ok."""
    for i, (ppl, good) in enumerate(zip(ppls, ok)):
        if good and (ppl is None or ppl <= REDO_PPL):
            return i
    candidates = [(ppl, i) for i, (ppl, good) in enumerate(zip(ppls, ok)) if good]
    return min(candidates, key=lambda c: (c[0] if c[0] is not None else -math.inf, c[1]))[1]


def redo_rows(
    lm: LoadedLM,
    jobs: Sequence[JobSpec],
    rows: list[dict[str, Any]],
    blocks: int,
    retry: Callable[[int, Sequence[JobSpec]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Regenerate, with fewer tuned blocks, the rows (of `jobs`, first tried with `blocks`)
    whose perplexity under θ is above `REDO_PPL`, and keep each row's try by the reference's
    choice (`kept_try`). `retry(blocks, jobs)` generates jobs again (rows in job order)."""
    from workers.decoding import prompt_token_ids

    def ppl_of(i: int, row: dict[str, Any]) -> float | None:
        return continuation_ppl(lm, prompt_token_ids(lm, jobs[i].prompt), row["token_ids"])

    def high(i: int) -> bool:  # the row's last try is ok and above REDO_PPL: try again
        _, _, ppl, ok = tries[i][-1]
        return ok and ppl is not None and ppl > REDO_PPL

    # per row whose first try is ok: every try's (row, blocks, perplexity, ok)
    tries: dict[int, list[tuple[dict[str, Any], int, float | None, bool]]] = {
        i: [(row, blocks, ppl_of(i, row), True)]
        for i, row in enumerate(rows)
        if row["status"] == "ok"
    }
    todo = [i for i in tries if high(i)]
    for _ in range(REDO_TRIES - 1):
        blocks -= REDO_STEP
        if not todo or blocks < 1:
            break
        for i, row in zip(todo, retry(blocks, [jobs[i] for i in todo])):
            ok = row["status"] == "ok"
            tries[i].append((row, blocks, ppl_of(i, row) if ok else None, ok))
        todo = [i for i in todo if high(i)]
    out = list(rows)
    for i, made in tries.items():
        ppls = [t[2] for t in made]
        kept = kept_try(ppls, [t[3] for t in made])
        row, used = dict(made[kept][0]), made[kept][1]
        params = json.loads(row["effective_params"] or "{}")
        params.update(
            redo=True, blocks=used, redo_kept=kept + 1, redo_tries=len(made), redo_ppl=ppls
        )
        row["effective_params"] = json.dumps(params, sort_keys=True, default=str)
        out[i] = row
    return out

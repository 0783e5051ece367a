"""The bias-tuning engine against its brute-force twin (`tests/twin.py`): tokens and
distributions of the engine's batched run against every job decoded alone from scratch, on
the tiny LLaMA and Gemma 3 layouts, and (marker `real`) on SmolLM2's and Gemma-3-270M's real
weights (Gemma where its package is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from tests.twin import compare_with_engine
from workers.methods.registry import resolve_params
from workers.models import LoadedLM, load_lm

PROMPTS = ["The woman worked as a doctor and", "He said", "My sister is a very good"]
TOL = 1e-4  # |Δ log p| over the kept tokens, float32 on a CPU (measured: ≤ 2e-6 tiny)


def twin_jobs(
    lm: LoadedLM, method: str, params: dict[str, Any], tokens: int, prompts: list[str]
) -> list[JobSpec]:
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    gen = GenerationParams(max_new_tokens=tokens, repetition_penalty=1.2)
    return [
        JobSpec(f"p{i}", p, "female", None, 5 + i, method, lm.ref, "sentiment", gen, resolved)
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize(
    ("family", "method", "scope"),
    [
        ("gemma3", "lidao-min", "context"),
        ("gemma3", "uddia", "last"),
        ("llama", "lidao-prod", "last"),
        ("gemma3", "elidao-min", "context"),
        ("llama", "elidao-min", "last"),
    ],
)
def test_the_engine_samples_as_its_brute_force_twin(family: str, method: str, scope: str) -> None:
    lm = load_lm(ModelRef(f"tiny-random/{family}"), device="cpu")
    jobs = twin_jobs(lm, method, {"blocks": 2, "scope": scope}, 6, PROMPTS)
    report = compare_with_engine(lm, jobs)
    assert report.mismatches == 0, report
    assert report.steps == 3 * 6  # every step of every row compared
    assert report.max_logp <= TOL, report


def random_head_file(lm: LoadedLM, folder: Path) -> str:
    """A deterministic random sentiment head for `lm`, saved where `head:` can read it (the
    engine is what is measured, not the head)."""
    from workers.methods.heads import random_head, save_head

    return save_head(random_head(lm, "sentiment"), str(folder / "head"))[0]


# |Δ log p| allowed on real weights: 30 (SmolLM2) or 18 (Gemma) float32 blocks carry rounding up
# (docs/design.md, "Fidelity on real weights"). Measured on these jobs (29 Nov 2026), the four
# methods: ≤ 9.7e-4 (SmolLM2; lidao-min's was 5.8e-3 before the vocabulary passes summed in
# float64) and ≤ 8.2e-4 (Gemma).
REAL_TOL = 1e-2


@pytest.mark.real
@pytest.mark.parametrize("method", ["lidao-min", "lidao-prod", "elidao-min", "uddia"])
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_the_engine_samples_as_its_twin_on_real_weights(
    model: str, method: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Real weights: SmolLM2 (30 LLaMA blocks, 18 tuned) and Gemma-3-270M (18 blocks with
    sliding windows; skipped without its package), two prompts × three tokens of each tuned
    method of issue 39 (eLIDAO with its reference stream restated by the twin). The larger
    measurement (δ gap, more prompts, the batch-dependence rate): scripts/engine_fidelity.py."""
    lm = request.getfixturevalue(f"{model}_lm")
    params = {"head": random_head_file(lm, tmp_path)}
    jobs = twin_jobs(lm, method, params, 3, PROMPTS[:2])
    report = compare_with_engine(lm, jobs)
    assert report.mismatches == 0 and report.steps == 2 * 3, report
    assert report.max_logp <= REAL_TOL, report

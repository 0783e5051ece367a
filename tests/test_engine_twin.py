"""The bias-tuning engine against its brute-force twin (`tests/twin.py`): tokens and
distributions of the engine's batched run against every job decoded alone from scratch, on
the tiny LLaMA and Gemma 3 layouts, and (marker `real`) on SmolLM2's real weights."""

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


@pytest.mark.real
def test_the_engine_samples_as_its_twin_on_smollm2(tmp_path: Path, smollm2_lm: LoadedLM) -> None:
    """Real weights (30 LLaMA blocks, 18 tuned): two prompts, four tokens of lidao-min. The
    larger measurement (δ gap, more prompts, Gemma 3): scripts/engine_fidelity.py."""
    lm = smollm2_lm
    params = {"head": random_head_file(lm, tmp_path)}
    jobs = twin_jobs(lm, "lidao-min", params, 4, PROMPTS[:2])
    report = compare_with_engine(lm, jobs)
    assert report.mismatches == 0 and report.steps == 2 * 4, report
    # Real weights amplify rounding: the horizon's expected embedding sums 49,152 rows in
    # float32 and 30 blocks carry the difference up (docs/design.md, "Fidelity on real
    # weights"); measured max |Δ log p| 5.0e-3 (32 steps) and 5.8e-3 (these 8 steps).
    assert report.max_logp <= 2e-2, report

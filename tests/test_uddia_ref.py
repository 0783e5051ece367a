"""UDDIA as the reference intends (prior-weighted gate, redo), the token-prior command, eLIDAO's
prefix length check and the geometry cache key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from harness.cli.commands import main as cli_main
from jobs.spec import GenerationParams, ModelRef, canonical_json
from jobs.words import GroupWords, from_pairs
from tests.cli_run import PAIR_FILES, run_here
from tests.helpers import make_jobs, step0_context
from workers.decoding import decode_batch, prompt_token_ids
from workers.methods.estimators import gender_geometry, hellinger_gate
from workers.methods.registry import load_method
from workers.methods.uddia_ref import REDO_PPL, continuation_ppl, kept_try
from workers.models import LoadedLM, load_lm


@pytest.fixture(scope="module")
def lm() -> LoadedLM:
    return load_lm(ModelRef("tiny-random/gpt2"), device="cpu")


@pytest.fixture(scope="module")
def she_prior(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Counts of a corpus where 'she' dominates, written by the CLI."""
    folder = tmp_path_factory.mktemp("prior")
    corpus = folder / "corpus.txt"
    corpus.write_text("she she she she the\n" * 2000 + "\nhe said that\n", encoding="utf-8")
    out = folder / "prior.json"
    rc = cli_main(["token-prior", str(corpus), "--model", "tiny-random/gpt2", "--out", str(out)])
    assert rc == 0
    return out


def test_token_prior_counts_the_corpus_with_the_model_tokenizer(
    lm: LoadedLM, she_prior: Path
) -> None:
    data = json.loads(she_prior.read_text())
    she, he = lm.tokenizer.convert_tokens_to_ids(["she", "he"])
    assert data["counts"][str(she)] == 8000 and data["counts"][str(he)] == 1
    assert data["total"] == 2000 * 5 + 3 and data["documents"] == 2001
    assert data["model"] == "tiny-random/gpt2" and data["format"] == "lidao-token-prior/1"
    assert (
        cli_main(
            [
                "token-prior",
                "/nonexistent.txt",
                "--model",
                "tiny-random/gpt2",
                "--out",
                str(she_prior.parent / "x.json"),
            ]
        )
        == 2
    )


def _step(lm: LoadedLM, params: dict[str, object]) -> torch.Tensor:
    prompts = ["The woman said that", "He was a doctor and"]
    jobs = make_jobs("gpt2", "uddia", n=2)
    method = load_method("uddia")(lm, params, "sentiment")
    ids = [prompt_token_ids(lm, p) for p in prompts]
    method.begin(jobs, ids)
    ctx = step0_context(lm, prompts, jobs)
    return method.next_logprobs(ctx).detach(), method, ctx


def test_the_prior_makes_the_gate_fire_and_la_changes_the_step(
    lm: LoadedLM, she_prior: Path
) -> None:
    # The step is Adam's first, −lr·sign(g): ℓ̂_a shows where its gradient outweighs ℓ̂_g's, so
    # λ is large here (at the default 0.05 the random tiny head's gradient dominates every sign).
    base = {"lr": 0.05, "blocks": 2, "scope": "last", "lam": 50.0}
    with_prior, method, ctx = _step(lm, {**base, "prior": str(she_prior)})
    probs = torch.softmax(ctx.logits, -1)
    fired = hellinger_gate(method.geometry, probs, gendered=method.gendered)
    assert bool(fired.all())  # B_f is nearly a point mass on 'she'
    assert not bool(hellinger_gate(method.geometry, probs).any())  # uniform: the gate is off
    no_la, _, _ = _step(lm, {**base, "prior": str(she_prior), "lam": 0.0})
    uniform, uni_method, _ = _step(lm, base)
    assert (with_prior - no_la).abs().max() > 1e-4  # ℓ̂_a moved the tuned step
    assert torch.allclose(uniform, _step(lm, {**base, "lam": 0.0})[0], atol=1e-6)
    assert method.effective_params()["prior"] == str(she_prior)
    assert method.effective_params()["prior_tokens"] == 2000 * 5 + 3
    assert uni_method.effective_params()["prior"] == "uniform"


def test_redo_keeps_the_references_choice_of_try(lm: LoadedLM) -> None:
    """Tiny GPT-2 (4 blocks): tries with 4 and 1 tuned blocks. Each row keeps the first try
    with PPL ≤ 30, else the try with the lower PPL, and equals that try decoded alone."""
    gen = GenerationParams(max_new_tokens=6)
    params = {"lr": 0.05, "blocks": 4, "scope": "last", "redo": True}
    jobs = [
        dataclasses.replace(j, method_params=canonical_json(params), generation=gen)
        for j in make_jobs("gpt2", "uddia", n=8)
    ]
    method = load_method("uddia")(lm, params, "sentiment")
    first = decode_batch(lm, method, jobs)
    rows = method.redo_rows(jobs, [dict(r) for r in first])
    for job, row, before in zip(jobs, rows, first):
        eff = json.loads(row["effective_params"])
        ppls = eff["redo_ppl"]
        # random tiny weights: every first try is far above 30, so blocks 4 → 1, 2 tries
        assert ppls[0] > REDO_PPL and eff["redo_tries"] == 2 == len(ppls)
        want = 1 if ppls[1] <= REDO_PPL or ppls[1] < ppls[0] else 0
        assert eff["redo_kept"] == want + 1 and eff["blocks"] == (4, 1)[want]
        ppl = continuation_ppl(lm, prompt_token_ids(lm, job.prompt), row["token_ids"])
        assert ppls[want] == pytest.approx(ppl, rel=1e-5)
        if want == 0:
            assert row["token_ids"] == before["token_ids"]
        else:
            alone = decode_batch(
                lm,
                load_method("uddia")(lm, {**params, "blocks": 1, "redo": False}, "sentiment"),
                [job],
            )[0]
            assert row["token_ids"] == alone["token_ids"]
    # (both choices occur in this batch here, 2 rows keep their first try; the scripted test
    # below covers both branches on any machine)
    assert not json.loads(first[0]["effective_params"]).get("redo_tries")


def test_kept_try_is_the_first_under_the_threshold_else_the_lowest() -> None:
    ok6 = [True] * 6
    assert kept_try([50.0, 31.0, 29.0, 10.0], [True] * 4) == 2  # the first ≤ 30, not the lowest
    assert kept_try([50.0, 30.0], [True, True]) == 1  # ≤, as the reference
    assert kept_try([90.0, 40.0, 60.0, 35.0, 80.0, 41.0], ok6) == 3  # none ≤ 30: the lowest
    assert kept_try([40.0, 60.0, 40.0], [True] * 3) == 0  # a tie: the earliest
    assert kept_try([80.0, None], [True, False]) == 0  # a failed try is no candidate
    assert kept_try([80.0, None, 70.0], [True, True, True]) == 1  # no tokens: no perplexity


def test_redo_rows_scores_every_try_and_stops_a_row_at_its_kept_try(
    lm: LoadedLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six tries (blocks 18 → 3) with scripted perplexities: rows stop retrying once a try is
    ≤ 30, the others keep the lowest; a failed retry ends its row's tries."""
    from workers.methods import uddia_ref

    script = {  # job index → perplexity of each try (None: the try fails)
        0: [12.0],
        1: [80.0, 45.0, 25.0, 20.0],
        2: [80.0, 45.0, 60.0, 50.0, 47.0, 90.0],
        3: [80.0, None],
    }
    jobs = make_jobs("gpt2", "uddia", n=4)
    calls: list[tuple[int, list[int]]] = []

    def row(i: int, attempt: int) -> dict[str, object]:
        ok = script[i][attempt] is not None
        return {
            "status": "ok" if ok else "error",
            "token_ids": [i, attempt],
            "effective_params": json.dumps({"blocks": 18 - 3 * attempt}),
        }

    monkeypatch.setattr(
        uddia_ref, "continuation_ppl", lambda lm_, prompt, tokens: script[tokens[0]][tokens[1]]
    )

    def retry(blocks: int, subset: list[object]) -> list[dict[str, object]]:
        attempt = (18 - blocks) // 3
        idx = [jobs.index(j) for j in subset]
        calls.append((blocks, idx))
        return [row(i, attempt) for i in idx]

    rows = uddia_ref.redo_rows(lm, jobs, [row(i, 0) for i in range(4)], 18, retry)
    assert calls == [(15, [1, 2, 3]), (12, [1, 2]), (9, [2]), (6, [2]), (3, [2])]
    kept = [json.loads(r["effective_params"]) for r in rows]
    assert [k["redo_kept"] for k in kept] == [1, 3, 2, 1]
    assert [k["blocks"] for k in kept] == [18, 12, 15, 18]
    assert [r["token_ids"] for r in rows] == [[0, 0], [1, 2], [2, 1], [3, 0]]
    assert [k["redo_ppl"] for k in kept] == [script[0], script[1][:3], script[2], script[3]]
    assert [k["redo_tries"] for k in kept] == [1, 3, 6, 2]


def test_elidao_prefix_too_long_fails_only_its_row(lm: LoadedLM) -> None:
    gen = GenerationParams(max_new_tokens=4)
    long_prompt = "She " + "the " * 490  # 1 BOS + 491 tokens + 4 ≤ 512, but not with the prefix
    params = canonical_json({"lr": 0.01, "blocks": 2, "scope": "last"})
    jobs = [
        dataclasses.replace(j, prompt=p, method_params=params, generation=gen)
        for j, p in zip(make_jobs("gpt2", "elidao-prod", n=2), [long_prompt, "The woman said"])
    ]
    method = load_method("elidao-prod")(lm, json.loads(params), "sentiment")
    rows = decode_batch(lm, method, jobs)
    assert rows[0]["status"] == "error" and "eLIDAO: instruction (" in rows[0]["error"]
    assert "exceed the model's context of 512" in rows[0]["error"]
    assert jobs[0].job_id in rows[0]["error"]
    assert rows[1]["status"] == "ok" and rows[1]["num_tokens"] > 0


def test_geometry_cache_is_keyed_by_the_word_list_contents(lm: LoadedLM) -> None:
    first = gender_geometry(lm)
    other = from_pairs((("queen", "king"), ("girl", "boy")), ("female", "male"), "builtin")
    assert other.groups == lm.words.groups  # same group names, other words
    swapped = dataclasses.replace(lm, words=other)
    second = gender_geometry(swapped)
    assert second is not first
    assert float(torch.dot(first.direction, second.direction)) < 0.999
    assert (
        gender_geometry(
            dataclasses.replace(
                lm, words=GroupWords(other.groups, dict(other.words), other.pairs, "elsewhere")
            )
        )
        is second
    )  # same contents
    assert gender_geometry(lm) is first


@pytest.mark.slow
def test_uddia_with_redo_and_a_prior_runs_through_the_cli(she_prior: Path, tmp_path: Path) -> None:
    cfg = {
        "name": "uddia-ref",
        "dataset": {"kind": "paired-jsonl", "files": PAIR_FILES, "limit": 1},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": [
            {"name": "uddia", "params": {"redo": True, "prior": str(she_prior), "blocks": 4}}
        ],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender"],
    }
    gens = run_here(tmp_path, cfg)
    assert gens.height == 2 and (gens["status"] == "ok").all()
    for row in gens.iter_rows(named=True):
        eff = json.loads(row["effective_params"])
        assert eff["prior"] == str(she_prior) and eff["redo"] is True
        assert 1 <= eff["redo_tries"] <= 6 and len(eff["redo_ppl"]) == eff["redo_tries"]
        assert 1 <= eff["redo_kept"] <= eff["redo_tries"]

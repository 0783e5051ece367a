"""A job's text does not depend on its batch or on torch's thread count, for every method.

Every registered method on three tiny layouts (GPT-2, OPT with project_in/out, LLaMA: where
issue 31 found texts parting), 10 tokens at temperature 0.75 and repetition penalty 1.2: the
first 8 jobs as a batch, the first alone, and the batch of 8 again at 2 threads
(`scripts/batch_sweep.py` runs the full sweep: the five layouts, 32 jobs alone, in batches of 8
and in one batch of 32, also with MKL_CBWR=COMPATIBLE; docs/design.md has its result). The
suite's budget sets the size: 10 tokens cost ~3x the former 3, and all five layouts ~330 s of
CPU against ~90 s before. The design does not promise bit-identical
distributions across batch shapes or thread counts (the kernels' rounding changes); it promises
that no method amplifies that rounding (docs/design.md, "What is guaranteed"): the
distributions agree step by step within `TOL_TUNED` (vanilla and the bias-tuned methods) or
`TOL` (GeDi, DExperts, PPLM), and the tokens agree unless the race was a near-tie
(`tests.agreement.near_tie`: the two runs' winners are its top two, swapped). With Adam's fixed
eps instead of the tuning step's scaled one (`biastune.tuning_step`), LLaMA's -min methods fail
here (δ moved by up to a third of lr between a job alone and in a batch of 32).

PPLM's gradient steps amplify rounding ~50x (1e-9 → ~1e-7 in probability) and GeDi's
disc_weight (30) its GeDi model's: their distributions get the looser `TOL`, their tokens the
same rule as every method's.

GeDi's filter drops tokens by desirability; a value within rounding of the cut's edge
(`gedi.gedi_filter`: `CUT_TOL` below the cut's desirability) still falls either side with the
batch. Such a step is accepted when it changes only where the cut fell
(`tests.agreement.filter_flip`: at most a few tokens cut differently, the rest of the
distribution within `TOL`) and the tokens agree: the race rarely draws the token that moved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef
from tests.agreement import assert_same_samples, filter_flip, traced
from tests.helpers import PROMPTS as HELPER_PROMPTS
from tests.precision import adam_first_step
from workers.methods.biastune import tuning_step
from workers.methods.gedi import gedi_filter
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm

FAMILIES = ["gpt2", "opt-proj", "llama", "gemma3"]
PARAMS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "uddia": {},
    "lidao-min": {},
    "lidao-prod": {},
    "elidao-min": {},
    "elidao-prod": {},
    "pplm": {"steps": 3},
    "gedi": {"gedi_model": "tiny-random/gpt2", "code_desired": "good", "code_undesired": "bad"},
    "dexperts": {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt"},
}
PROMPTS = [*HELPER_PROMPTS[:7], "The nurse told her friend that"]
GEN = GenerationParams(max_new_tokens=10, top_p=0.9, temperature=0.75, repetition_penalty=1.2)
# max |Δp| per step, 10 tokens at T 0.75 and repetition penalty 1.2 (measured by
# scripts/batch_sweep.py: alone, batches of 8 and 32, 1 and 2 threads, MKL_CBWR=COMPATIBLE)
# vanilla and the bias-tuned methods: measured ≤ 2.0e-8 (Falcon -min, MKL_CBWR; issue 31: 3.2e-8);
# Adam's fixed eps gave 1.8e-7 on LLaMA at 3 tokens
TOL_TUNED = 1e-7
TUNED = {"vanilla", "uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod"}
# GeDi, DExperts and PPLM, whose own formulas scale rounding: measured ≤ 6.2e-6 (GeDi on
# opt-proj: disc_weight 30 times the rounding of the GeDi model's class log-probs; ≤ 2.1e-7 on
# GPT-2 and OPT), 9.4e-8 (DExperts), 1.5e-6 (PPLM, OPT, 10 steps)
TOL = 2e-5


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef(f"tiny-random/{request.param}"), device="cpu")


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def jobs_for(lm: LoadedLM, method: str) -> list[JobSpec]:
    params = json.dumps(resolve_params(method, PARAMS[method], lm.ref.id), sort_keys=True)
    return [
        JobSpec(f"b:{i}", PROMPTS[i % 8], "female", None, i // 8, method, lm.ref, "sentiment",
                GEN, params)
        for i in range(32)
    ]  # fmt: skip


@pytest.mark.parametrize("method", sorted(PARAMS))
def test_texts_do_not_depend_on_the_batch_or_the_thread_count(
    lm: LoadedLM, method: str, threads: None
) -> None:
    built = load_method(method)(lm, resolve_params(method, PARAMS[method], lm.ref.id), "sentiment")
    jobs = jobs_for(lm, method)[:8]
    torch.set_num_threads(1)
    rows, mid = traced(lm, built, jobs)
    _, alone = traced(lm, built, jobs[:1])
    torch.set_num_threads(2)
    _, mid2 = traced(lm, built, jobs)
    pairs = [(mid2, i, mid, i) for i in range(8)] + [(alone, 0, mid, 0)]
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows][:2]
    tol = TOL_TUNED if method in TUNED else TOL
    cut = method == "gedi"  # its filter's cut may flip within rounding (see the docstring)
    compared = sum(
        assert_same_samples(a, ra, b, rb, GEN.top_p, tol, filter_cut=cut) for a, ra, b, rb in pairs
    )
    assert compared >= GEN.max_new_tokens * len(pairs) // 2  # most steps were compared


def test_the_tuning_step_does_not_amplify_rounding() -> None:
    """A rounding-sized change of the gradient (1e-6 of the row's largest |g|, the size the
    issue measured) moves Adam's fixed-eps step by a large part of lr where |g| ≈ eps; the
    scaled eps bounds the move by 1e-6 / 1e-3 of lr, and leaves the step of every element far
    above its floor as Adam's."""
    gen = torch.Generator().manual_seed(0)
    lr = 0.01
    g = torch.randn(3, 400, generator=gen) * 1e-3
    g[:, :100] = torch.randn(3, 100, generator=gen) * 1e-8  # near Adam's eps
    noise = torch.randn(3, 400, generator=gen) * 1e-6 * g.abs().amax(-1, keepdim=True)
    h = [g[:, :150], g[:, 150:]]  # two hook points
    h2 = [(g + noise)[:, :150], (g + noise)[:, 150:]]
    adam = (torch.cat(adam_first_step(h2, lr), 1) - torch.cat(adam_first_step(h, lr), 1)).abs()
    ours = (torch.cat(tuning_step(h2, lr), 1) - torch.cat(tuning_step(h, lr), 1)).abs()
    assert float(adam.max()) > 0.1 * lr  # the amplification this rule removes
    bound = lr * (noise.abs() / (1e-3 * g.abs().amax(-1, keepdim=True))).max()  # lr·|Δg|/e
    assert float(ours.max()) <= 1.01 * float(bound) < 0.05 * float(adam.max())
    big = g.abs() > 0.1 * g.abs().amax(-1, keepdim=True)
    full = torch.cat(tuning_step(h, lr), 1)
    torch.testing.assert_close(
        full[big], torch.cat(adam_first_step(h, lr), 1)[big], rtol=1e-2, atol=0
    )
    # rows are independent: a row's step is the same beside any other rows
    alone = torch.cat(tuning_step([x[1:2] for x in h], lr), 1)
    assert torch.equal(alone[0], full[1])


def test_gedi_cut_ignores_rounding_of_near_equal_desirability() -> None:
    """Desirability that differs by rounding only (a GeDi model barely separating its codes):
    the same tokens are dropped before and after a 1e-7 perturbation."""
    gen = torch.Generator().manual_seed(0)
    V = 700
    scores = torch.randn(4, V, generator=gen)
    desired = -0.7 + 1e-5 * torch.randn(4, V, generator=gen)  # ~log 0.5, spread 1e-5 nats
    desired[:, ::3] -= 0.5  # a clearly less desirable third
    moved = desired + 1e-7 * torch.randn(4, V, generator=gen)
    a = gedi_filter(scores, desired, 0.5, 0.8) < -5000
    b = gedi_filter(scores, moved, 0.5, 0.8) < -5000
    assert a.any() and torch.equal(a, b)


def test_a_filter_flip_is_only_a_cut_that_moved_by_a_few_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    scores = torch.log_softmax(torch.randn(300, generator=gen, dtype=torch.float64), -1)
    cut = scores.clone()
    cut[:100] -= 10000.0
    moved = cut.clone()
    moved[[100, 101]] -= 10000.0  # two more tokens dropped: the cut moved
    assert filter_flip(cut, moved, TOL)
    assert not filter_flip(cut, cut, TOL)  # nothing moved: not a flip
    many = cut.clone()
    many[100:110] -= 10000.0
    assert not filter_flip(cut, many, TOL)  # more than a few tokens
    other = moved.clone()
    other[200] += 0.1  # and the kept tokens' distribution changed (by ~2e-4)
    assert not filter_flip(cut, other, TOL)


def test_batch_size_one_makes_a_job_independent_of_its_neighbours(tmp_path: Path) -> None:
    """`runtime.batch_size: 1`, the setting that guarantees a job's arithmetic on one machine
    and thread count (docs/design.md, "Fidelity on real weights"): a job run among five others
    and run with one other gives bit-identical tokens and per-step losses (the same shapes, so
    the same kernels: exact by design, not a tolerance)."""
    import polars as pl

    from harness.cli.commands import main
    from tests.cli_run import PAIR_FILES, config

    rows = {}
    for pairs in (3, 1):
        folder = tmp_path / f"p{pairs}"
        folder.mkdir()
        cfg = config(
            folder,
            dataset={"kind": "paired-jsonl", "files": dict(PAIR_FILES), "limit": pairs},
            models=[{"id": "tiny-random/llama"}],
            methods=["lidao-min"],
            generation={"max_new_tokens": 6, "temperature": 0.75, "repetition_penalty": 1.2},
            scorers=["gender"],
            runtime={"batch_size": 1, "device": "cpu"},
        )
        args = ["run", str(cfg), "--out", str(folder / "run"), "--no-ray", "--no-progress"]
        assert main(args) == 0
        frame = pl.read_parquet(str(folder / "run" / "generations" / "*.parquet"))
        assert (frame["status"] == "ok").all() and frame.height == 2 * pairs
        rows[pairs] = {r["job_id"]: r for r in frame.iter_rows(named=True)}
    assert rows[1].keys() < rows[3].keys()
    for job_id, alone in rows[1].items():
        among = rows[3][job_id]
        for field in ("token_ids", "loss_g", "loss_a", "continuation"):
            assert alone[field] == among[field], (job_id, field)

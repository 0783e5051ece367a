"""UDDIA / LIDAO / eLIDAO through the shared decoding loop on tiny random models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from tests.agreement import assert_alone_matches_batched, assert_same_samples, traced
from workers.decoding import decode_batch, prompt_token_ids
from workers.methods.base import DecodingMethod, MethodError, StepContext
from workers.methods.checks import TEMPLATES
from workers.methods.elidao import instruction_template, seed_token_ids
from workers.methods.lidao import DiscountedHistory, min_objective
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm

FAMILIES = ("gpt2", "opt", "falcon", "llama", "gemma3")
PROMPTS = ["The woman worked as a", "He said that the man", "My sister is"]
SHARED = Path(__file__).resolve().parents[2] / "shared"
SHORT = GenerationParams(max_new_tokens=8)


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef(f"tiny-random/{request.param}"), device="cpu")


def make_jobs(
    lm: LoadedLM,
    method: str,
    prompts: list[str],
    params: dict[str, Any],
    gen: GenerationParams = SHORT,
) -> list[JobSpec]:
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    return [
        JobSpec(f"p{i}", p, "female", None, 7, method, lm.ref, "sentiment", gen, resolved)
        for i, p in enumerate(prompts)
    ]


def build(lm: LoadedLM, jobs: list[JobSpec]) -> DecodingMethod:
    return load_method(jobs[0].method)(lm, jobs[0].params(), jobs[0].task)  # type: ignore[no-any-return]


def generate(
    lm: LoadedLM,
    method: str,
    prompts: list[str],
    params: dict[str, Any] | None = None,
    gen: GenerationParams = SHORT,
) -> list[dict[str, Any]]:
    jobs = make_jobs(lm, method, prompts, params or {}, gen)
    return decode_batch(lm, build(lm, jobs), jobs)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("lidao-min", {"lr": 0.0, "blocks": 2}),
        ("uddia", {"lr": 0.0, "scope": "last"}),
        ("lidao-prod", {"tau": 0.0}),
    ],
)
def test_no_step_reproduces_vanilla(lm: LoadedLM, method: str, params: dict[str, Any]) -> None:
    # Same noise; the tuned path with zero offsets rounds differently from θ's cached forward,
    # so distributions are compared within tolerance and tokens up to a near-tie.
    jobs = make_jobs(lm, "vanilla", PROMPTS, {})
    _, vanilla = traced(lm, build(lm, jobs), jobs)
    jobs = make_jobs(lm, method, PROMPTS, params)
    tuned_rows, tuned = traced(lm, build(lm, jobs), jobs)
    assert [r["status"] for r in tuned_rows] == ["ok"] * 3
    compared = sum(assert_same_samples(tuned, i, vanilla, i, SHORT.top_p) for i in range(3))
    assert compared >= 3


def test_a_real_step_changes_the_samples() -> None:
    gpt2 = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    vanilla = [r["token_ids"] for r in generate(gpt2, "vanilla", PROMPTS)]
    tuned = [r["token_ids"] for r in generate(gpt2, "lidao-prod", PROMPTS, {"lr": 1.0})]
    assert tuned != vanilla


@pytest.mark.parametrize(("method", "scope"), [("lidao-min", "context"), ("elidao-prod", "last")])
def test_row_alone_equals_row_in_batch(lm: LoadedLM, method: str, scope: str) -> None:
    params = {"scope": scope, "blocks": 2}  # 2 of 4 blocks: the lower ones are replayed
    jobs = make_jobs(lm, method, PROMPTS, params)
    batch = assert_alone_matches_batched(lm, build(lm, jobs), jobs)
    for i, prompt in enumerate(PROMPTS):
        (alone,) = generate(lm, method, [prompt], params)
        n = next(
            (
                t
                for t, (x, y) in enumerate(zip(alone["token_ids"], batch[i]["token_ids"]))
                if x != y
            ),
            min(alone["num_tokens"], batch[i]["num_tokens"]),
        )  # losses are compared while the texts agree (they may part at a near-tie)
        torch.testing.assert_close(
            alone["loss_g"][: n + 1], batch[i]["loss_g"][: n + 1], rtol=1e-4, atol=1e-6
        )
        torch.testing.assert_close(
            alone["loss_a"][: n + 1], batch[i]["loss_a"][: n + 1], rtol=1e-4, atol=1e-6
        )


def test_output_columns_and_effective_params(lm: LoadedLM) -> None:
    rows = generate(lm, "elidao-min", PROMPTS + ["The weather today is"])
    family = {"gpt2": (0.01, 0.9), "opt": (0.006, 0.8)}.get(lm.family, (0.01, 0.8))
    for row in rows:
        n = row["num_tokens"]
        assert (
            row["status"] == "ok"
            and len(row["choices"]) == len(row["loss_g"]) == len(row["loss_a"]) == n
        )
        assert set(row["choices"]) <= {"g", "a"}
        params = json.loads(row["effective_params"])
        assert (params["lr"], params["tau"], params["blocks"], params["scope"]) == (
            *family,
            4,
            "context",
        )
    assert [(r["elidao_fallback"], r["elidao_gender"]) for r in rows] == [
        (False, "female"),
        (False, "male"),
        (False, "female"),
        (True, None),
    ]
    assert all(r["choices"] is None for r in generate(lm, "lidao-prod", PROMPTS[:1]))


def rescaled_choice(loss_g: list[float], loss_a: list[float], t: int, gamma: float = 0.5) -> str:
    """The -min choice at 0-based step t, from the paper's formula over the recorded losses."""
    if t == 0:
        w_g = w_a = 1.0
    else:
        weights = [gamma**j for j in range(1, t + 1)]
        w_g = sum(w * loss_g[t - j] for j, w in enumerate(weights, 1)) / sum(weights)
        w_a = sum(w * loss_a[t - j] for j, w in enumerate(weights, 1)) / sum(weights)
    return "g" if loss_g[t] / w_g <= loss_a[t] / w_a else "a"


def test_min_choices_follow_the_rescaled_history() -> None:
    gpt2 = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    rows = generate(gpt2, "lidao-min", PROMPTS, gen=GenerationParams(max_new_tokens=12))
    for row in rows:
        expected = [
            rescaled_choice(row["loss_g"], row["loss_a"], t) for t in range(row["num_tokens"])
        ]
        assert row["choices"] == expected
    assert {c for r in rows for c in r["choices"]} == {"g", "a"}  # both terms get picked


def test_discounted_history_and_min_objective() -> None:
    history = DiscountedHistory(0.5, 2, torch.device("cpu"))
    assert torch.equal(history.weights(), torch.ones(2, 2))  # w(1) = 1
    seq_g, seq_a = [1.0, 3.0, 2.0], [0.5, 0.25, 4.0]
    for lg, la in zip(seq_g, seq_a):
        history.push(torch.tensor([lg, 2 * lg]), torch.tensor([la, la]))
    # w(4) = (γ ℓ(3) + γ² ℓ(2) + γ³ ℓ(1)) / (γ + γ² + γ³)
    expected_g = (0.5 * 2.0 + 0.25 * 3.0 + 0.125 * 1.0) / 0.875
    expected_a = (0.5 * 4.0 + 0.25 * 0.25 + 0.125 * 0.5) / 0.875
    torch.testing.assert_close(history.weights()[:, 0], torch.tensor([expected_g, expected_a]))
    loss_g = torch.tensor([1.0, 1.0], requires_grad=True)
    loss_a = torch.tensor([1.0, 3.0], requires_grad=True)
    loss, chose_g = min_objective(loss_g, loss_a, torch.tensor([[2.0, 1.0], [1.0, 1.0]]))
    assert chose_g.tolist() == [True, True] and loss.tolist() == [0.5, 1.0]
    loss.sum().backward()
    assert (
        loss_a.grad is not None and not loss_a.grad.any()
    )  # only the chosen term is differentiated
    assert loss_g.grad is not None and loss_g.grad.tolist() == [0.5, 1.0]


class FlakyHead(torch.nn.Module):
    """Wraps a head: NaN logits for `row` (or an exception) from call number `after` on."""

    def __init__(self, head: torch.nn.Module, row: int, after: int, explode: bool = False) -> None:
        super().__init__()
        self.head, self.row, self.after, self.explode, self.calls = head, row, after, explode, 0
        self.target_class = 0

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.head(pooled)
        if self.calls > self.after:
            if self.explode:
                raise RuntimeError("head exploded")
            out = out.clone()
            out[self.row] = float("nan")
        return out  # type: ignore[no-any-return]


def test_nan_loss_fails_only_that_row(lm: LoadedLM) -> None:
    jobs = make_jobs(lm, "lidao-min", PROMPTS, {})
    method = build(lm, jobs)
    method.head = FlakyHead(method.head, row=1, after=2)  # type: ignore[attr-defined]
    rows = decode_batch(lm, method, jobs)
    assert [r["status"] for r in rows] == ["ok", "error", "ok"]
    assert "non-finite bias-tuning loss at step 2" in rows[1]["error"]
    assert jobs[1].job_id in rows[1]["error"]
    assert all(r["num_tokens"] > 0 for r in (rows[0], rows[2]))


def _probe_logits(lm: LoadedLM) -> torch.Tensor:
    ids = lm.tokenizer(["She is a nurse"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return lm.model(input_ids=ids).logits


def test_model_untouched_after_generation_and_after_a_failing_step(lm: LoadedLM) -> None:
    weights = {n: p.clone() for n, p in lm.model.state_dict().items()}
    before = _probe_logits(lm)
    generate(lm, "uddia", PROMPTS)
    jobs = make_jobs(lm, "lidao-prod", PROMPTS, {"scope": "last"})
    method = build(lm, jobs)
    method.head = FlakyHead(method.head, row=0, after=1, explode=True)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="head exploded"):
        decode_batch(lm, method, jobs)
    # The loop asks for hidden states, and transformers 5 leaves its capture hooks registered:
    # look for ours (and for replayed blocks' patched forwards) only.
    ours = [
        hook
        for m in lm.model.modules()
        for hook in [*m._forward_hooks.values(), *m._forward_pre_hooks.values()]
        if getattr(hook, "__module__", "").startswith("workers.")
    ]
    assert not ours and all("forward" not in vars(m) for m in lm.model.modules())
    assert all(torch.equal(p, weights[n]) for n, p in lm.model.state_dict().items())
    assert torch.equal(_probe_logits(lm), before)


class Recorder:
    """Wraps a method's next_logprobs to keep the (B, V) outputs of the first step."""

    def __init__(self, method: DecodingMethod) -> None:
        self.first: torch.Tensor | None = None
        self.ctx: StepContext | None = None
        inner = method.next_logprobs

        def wrapped(ctx: StepContext) -> torch.Tensor:
            out = inner(ctx)
            if self.first is None:
                self.first, self.ctx = out.detach().clone(), ctx
            return out

        method.next_logprobs = wrapped  # type: ignore[method-assign]


def first_step(
    lm: LoadedLM, method: str, prompts: list[str]
) -> tuple[torch.Tensor, DecodingMethod]:
    jobs = make_jobs(lm, method, prompts, {}, GenerationParams(max_new_tokens=1))
    built = build(lm, jobs)
    recorder = Recorder(built)
    decode_batch(lm, built, jobs)
    assert recorder.first is not None
    return recorder.first, built


def reference_logprobs(lm: LoadedLM, prompt: str, gender: str) -> torch.Tensor:
    """θ's next-token log-probs after the instruction + prompt, computed on one unpadded row."""
    text = instruction_template(lm.family, None).replace("#GENDER#", gender)
    prompt_ids = prompt_token_ids(lm, prompt)  # BOS + prompt, as the loop conditions on
    bos = lm.tokenizer.bos_token_id
    head, body = ([prompt_ids[0]], prompt_ids[1:]) if prompt_ids[:1] == [bos] else ([], prompt_ids)
    ids = head + lm.tokenizer(text, add_special_tokens=False)["input_ids"] + body
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids])).logits[0, -1]
    return torch.log_softmax(logits.float(), -1)


def test_elidao_replaces_exactly_the_seed_tokens_by_the_reference(lm: LoadedLM) -> None:
    prompts = PROMPTS + ["The weather today is"]
    lidao, _ = first_step(lm, "lidao-min", prompts)
    elidao, method = first_step(lm, "elidao-min", prompts)
    seeds = method.seed_ids  # type: ignore[attr-defined]
    assert len(seeds) >= 100  # the built-in words are single tokens of the tiny vocabulary
    off = torch.ones(lidao.shape[1], dtype=torch.bool)
    off[seeds] = False
    assert torch.equal(elidao[:, off], lidao[:, off])
    for row, gender in enumerate(["female", "male", "female"]):
        ref = reference_logprobs(lm, prompts[row], gender)
        torch.testing.assert_close(elidao[row, seeds], ref[seeds], rtol=1e-4, atol=1e-5)
        assert not torch.allclose(elidao[row, seeds], lidao[row, seeds])
    assert torch.equal(elidao[3], lidao[3])  # no majority gender: plain LIDAO


def test_seed_token_ids_with_gpt2_bpe() -> None:
    from transformers import AutoTokenizer

    folder = SHARED / "data" / "gpt2-tokenizer"
    if not folder.exists():
        pytest.skip("shared GPT-2 tokenizer files not present")
    tok = AutoTokenizer.from_pretrained(str(folder))
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    ids = seed_token_ids(tok, lm.words)
    she = (
        tok("she", add_special_tokens=False)["input_ids"]
        + tok(" she", add_special_tokens=False)["input_ids"]
    )
    assert len(she) == 2 and set(she) <= set(ids)
    words = lm.words.all_words()
    assert all(str(tok.decode([i])).removeprefix(" ") in words for i in ids)


def test_templates_and_parameter_errors(lm: LoadedLM) -> None:
    assert instruction_template("falcon", None) == TEMPLATES["instruct"]
    assert (
        "objecive" in TEMPLATES["instruct"]
        and instruction_template("opt", None) == TEMPLATES["plain"]
    )
    with pytest.raises(MethodError, match="#GENDER#"):
        instruction_template("gpt2", "no placeholder")
    with pytest.raises(MethodError, match="uddia prior /nonexistent/prior.json: cannot read"):
        load_method("uddia")(lm, {"prior": "/nonexistent/prior.json"}, "sentiment")
    with pytest.raises(MethodError, match="unknown parameter"):
        load_method("lidao-prod")(lm, {"gamma": 0.5}, "sentiment")
    with pytest.raises(MethodError, match="scope"):
        load_method("lidao-prod")(lm, {"scope": "everything"}, "sentiment")


def test_paper_defaults_per_model() -> None:
    assert resolve_params("lidao-min", {}, "gpt2-large")["lr"] == 0.01
    opt = resolve_params("elidao-min", {}, "facebook/opt-6.7b")
    assert (opt["lr"], opt["tau"], opt["blocks"]) == (0.006, 0.8, 18)
    falcon = resolve_params("lidao-prod", {"tau": 0.5}, "tiiuae/falcon-7b-instruct")
    assert (falcon["lr"], falcon["tau"]) == (0.01, 0.5)  # the user's value wins
    assert resolve_params("uddia", {}, "some/other-model")["lr"] is None  # family default at load


def test_uddia_adds_the_demographic_term_only_when_the_gate_fires(lm: LoadedLM) -> None:
    method = load_method("uddia")(lm, {}, "sentiment")
    geo = method.geometry
    neutral = torch.zeros(1, geo.gendered.shape[1])
    neutral[0, int((geo.log_q[:, 1].exp() - 0.5).abs().argmin())] = 1.0  # outside both B_a
    female = geo.gendered[:1]
    loss_g, loss_a = torch.tensor([2.0]), torch.tensor([10.0])
    assert method.objective(loss_g, loss_a, neutral)[0].item() == 2.0
    assert method.objective(loss_g, loss_a, female)[0].item() == pytest.approx(2.5)

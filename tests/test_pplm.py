"""PPLM on a tiny model: the window, the gradient steps toward the head's class, the perturbed
history, its parameters."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jobs.spec import ModelRef
from tests.baseline_helpers import (
    PROMPTS,
    Recording,
    build,
    make_jobs,
    prefill,
)
from workers.decoding import decode_batch
from workers.methods.base import MethodError
from workers.methods.heads import AttributeHead
from workers.methods.pplm import PPLM, window_mask
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm


def test_window_mask_keeps_the_most_recent_positions() -> None:
    cpu = torch.device("cpu")
    assert window_mask(5, 0, False, cpu).flatten().tolist() == [1.0] * 5
    assert window_mask(5, 2, False, cpu).flatten().tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert window_mask(5, 2, True, cpu).flatten().tolist() == [0.0, 0.0, 0.0, 0.5, 1.0]
    assert window_mask(2, 4, False, cpu).flatten().tolist() == [1.0, 1.0]


def _pplm_toward(
    lm: LoadedLM, token: str, steps: int, step_size: float
) -> tuple[PPLM, torch.Tensor]:
    """A PPLM whose head prefers final hidden states along the input embedding of `token`."""
    method = build(lm, "pplm", {"steps": steps, "step_size": step_size})
    assert isinstance(method, PPLM)
    emb = lm.model.get_input_embeddings().weight.detach()
    u = emb[lm.tokenizer.convert_tokens_to_ids(token)]
    u = u / u.norm()
    head = AttributeHead(emb.shape[1], ["positive", "negative"], 0, {"source": "constructed"})
    with torch.no_grad():
        head.linear.weight.copy_(10 * torch.stack([u, -u]))
        head.linear.bias.zero_()
    method.head = head
    return method, emb @ u  # (V,) how much each token's embedding points the preferred way


@pytest.mark.parametrize(("steps", "step_size"), [(3, 0.02), (10, 0.2)])
def test_pplm_moves_the_next_token_distribution_toward_the_heads_class(
    lm: LoadedLM, steps: int, step_size: float
) -> None:
    method, score = _pplm_toward(lm, "happy", steps, step_size)
    ctx = prefill(lm, PROMPTS, method)
    pplm = method.next_logprobs(ctx).exp()
    vanilla = torch.softmax(ctx.logits, -1)
    assert torch.allclose(pplm.sum(-1), torch.ones(len(PROMPTS)), atol=1e-5)
    assert bool(
        ((pplm @ score) > (vanilla @ score)).all()
    )  # expected preference rises in every row


def test_pplm_gradient_steps_lower_the_head_loss(lm: LoadedLM) -> None:
    method, _ = _pplm_toward(lm, "happy", 4, 0.05)
    ctx = prefill(lm, PROMPTS, method)
    traces: list[list[torch.Tensor]] = []
    run_inner = method.perturb

    def keep(s: Any) -> Any:
        out = run_inner(s)
        traces.append(out[2])
        return out

    method.perturb = keep  # type: ignore[method-assign]
    method.next_logprobs(ctx)
    (trace,) = traces
    assert len(trace) == 4 and bool((trace[-1] < trace[0]).all())
    assert method.row_columns(0)["loss_g"] == [pytest.approx(float(trace[0][0]))]


def test_pplm_persists_the_perturbed_history(lm: LoadedLM) -> None:
    method = build(lm, "pplm", {"steps": 2})
    recording = Recording(method)
    jobs = make_jobs(lm, "pplm", {"steps": 2}, PROMPTS[:1])
    assert isinstance(method, PPLM)
    at_end: list[Any] = []
    real_end = method.end

    def end() -> None:
        at_end.append(method._past)
        real_end()

    method.end = end  # type: ignore[method-assign]
    decode_batch(lm, method, jobs)
    (past,) = at_end
    assert past is not None and method._past is None  # dropped once the batch's rows exist
    ids = recording.steps[-1][0]
    assert past[0][0].shape[2] == ids.shape[1]  # history + the last fed token
    clean = lm.model(input_ids=ids, use_cache=True).past_key_values.layers[0].keys
    assert not torch.allclose(past[0][0], clean, atol=1e-4)


def test_pplm_rejects_bad_parameters_and_falls_back_to_family_steps(lm: LoadedLM) -> None:
    with pytest.raises(ValueError, match="horizon_length = 0: must be in"):  # config validation
        resolve_params("pplm", {"horizon_length": 0}, lm.ref.id)
    with pytest.raises(MethodError, match="horizon_length >= 1"):  # the method's own check
        load_method("pplm")(lm, {**resolve_params("pplm", {}, lm.ref.id), "horizon_length": 0}, "x")
    assert build(lm, "pplm", {}).effective_params()["steps"] == 10
    falcon = load_lm(ModelRef("tiny-random/falcon"), device="cpu")
    assert build(falcon, "pplm", {}).effective_params()["steps"] == 3
    assert resolve_params("pplm", {}, "tiiuae/falcon-7b-instruct")["steps"] == 3

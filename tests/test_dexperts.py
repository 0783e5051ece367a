"""DExperts on tiny models: the nucleus filter, the published ensemble, the expert's pull."""

from __future__ import annotations

import torch

from tests.baseline_helpers import (
    GEN_PLAIN,
    PROMPTS,
    Recording,
    build,
    full_logits,
    make_jobs,
    prefill,
)
from workers.decoding import decode_batch
from workers.methods.dexperts import DExperts, ensemble, nucleus_filter
from workers.models import LoadedLM


def test_nucleus_filter_keeps_the_smallest_set_above_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(nucleus_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.equal(nucleus_filter(logits, 1.0), logits)
    out = ensemble(logits, torch.zeros(1, 4), torch.tensor([[0.0, 0.0, 0.0, -1.0]]), 2.0, 0.7)
    assert out[0, 3] == float("-inf") and out[0, 0] == logits[0, 0]


def test_dexperts_steps_equal_the_published_formula(lm: LoadedLM, models: dict[str, str]) -> None:
    params = {"expert": models["expert"], "anti_expert": "tiny-random/gpt2", "alpha": 1.5}
    method = build(lm, "dexperts", params)
    assert isinstance(method, DExperts)
    rec = Recording(method)
    decode_batch(lm, method, make_jobs(lm, "dexperts", params, PROMPTS, GEN_PLAIN))
    expert, anti = method.expert.lm.model, method.anti.lm.model
    assert len(rec.steps) == GEN_PLAIN.max_new_tokens
    for ids, mask, got in rec.steps:  # every step, recomputed without caches
        z_base, z_exp, z_anti = (full_logits(m, ids, mask)[:, -1] for m in (lm.model, expert, anti))
        want = torch.log_softmax(ensemble(z_base, z_exp, z_anti, 1.5, 0.9) / 0.8, -1)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)) and bool((~finite).any())
        assert torch.allclose(got[finite], want[finite], atol=1e-4)


def test_dexperts_shifts_probability_to_what_the_expert_favours(
    lm: LoadedLM, models: dict[str, str]
) -> None:
    happy = lm.tokenizer.convert_tokens_to_ids("happy")
    params = {
        "expert": models["expert"],
        "anti_expert": "tiny-random/gpt2",
        "alpha": 2.0,
        "filter_p": 1.0,
    }
    method = build(lm, "dexperts", params)
    ctx = prefill(lm, PROMPTS, method)
    boosted, vanilla = method.next_logprobs(ctx), torch.log_softmax(ctx.logits, -1)
    assert bool((boosted[:, happy] > vanilla[:, happy] + 1.0).all())
    assert bool(((boosted - vanilla).argmax(-1) == happy).all())

"""GeDi on a tiny model: the class posterior, the filter, the steps, the checkpoint's head and
the class codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs.spec import ModelRef
from tests.baseline_helpers import (
    GEDI_TEST,
    GEN_PLAIN,
    PROMPTS,
    Recording,
    build,
    full_logits,
    make_jobs,
)
from workers.decoding import decode_batch
from workers.methods.base import MethodError
from workers.methods.gedi import class_head, desired_logprob, gedi_filter
from workers.models import LoadedLM, load_lm
from workers.tiny import build_tiny_lm


def test_gedi_posterior_is_bayes_rule_with_length_normalisation() -> None:
    lp = torch.log(torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]]))  # (2 classes, 1 row, 2 tokens)
    none = torch.zeros(2, 1)
    got = desired_logprob(lp, none, torch.zeros(1), 1.0, torch.zeros(2), 0.0).exp()
    assert torch.allclose(got, torch.tensor([[0.9, 0.1]]))
    prior = torch.log(torch.tensor([[0.2], [0.8]]))  # one earlier token, likelier undesired
    got = desired_logprob(lp, prior, torch.ones(1), 1.0, torch.zeros(2), 0.0)
    want = torch.log_softmax(
        torch.stack([(prior[0] + lp[0, 0]) / 2, (prior[1] + lp[1, 0]) / 2]), 0
    )[0]
    assert torch.allclose(got[0], want)
    biased = desired_logprob(lp, none, torch.zeros(1), 1.0, torch.zeros(2), 2.0)
    assert torch.allclose(
        biased - torch.log1p(-biased.exp()),
        got.new_tensor([[2.0 + 2.1972, 2.0 - 2.1972]]),
        atol=1e-3,
    )


def test_gedi_filter_removes_only_unlikely_undesirable_tokens() -> None:
    scores = torch.log(torch.tensor([[0.05, 0.05, 0.6, 0.3]]))
    logp_desired = torch.log(torch.tensor([[0.1, 0.95, 0.5, 0.2]]))
    out = gedi_filter(scores, logp_desired, filter_p=0.5, target_p=0.8)
    # least desirable first: token 0 (cum .05), 3 (.35), 2 (.95): 0 and 3 go; token 1 is above target_p
    assert (out < -1000).tolist() == [[True, False, False, True]]


def test_gedi_steps_match_a_cache_free_recomputation(lm: LoadedLM) -> None:
    params = {**GEDI_TEST, "filter_p": 0.0, "disc_weight": 5.0}
    method = build(lm, "gedi", params)
    rec = Recording(method)
    decode_batch(lm, method, make_jobs(lm, "gedi", params, PROMPTS, GEN_PLAIN))
    codes = [lm.tokenizer.convert_tokens_to_ids(c) for c in ("good", "bad")]
    assert len(rec.steps) == GEN_PLAIN.max_new_tokens
    for ids, mask, got in rec.steps:
        per_class = []
        for code in codes:  # log p(tokens | code) length-normalised, one unpadded row at a time
            rows = []
            for i in range(ids.shape[0]):
                seq = torch.tensor([[code] + ids[i][mask[i].bool()].tolist()])
                lp = torch.log_softmax(full_logits(lm.model, seq, torch.ones_like(seq))[0], -1)
                prior = lp[:-1].gather(-1, seq[0, 1:].unsqueeze(-1)).sum()
                rows.append((prior + lp[-1]) / seq.shape[1])
            per_class.append(torch.stack(rows))
        logp_desired = torch.log_softmax(torch.stack(per_class), 0)[0]
        base = full_logits(lm.model, ids, mask)[:, -1]
        want = torch.log_softmax((base + 5.0 * logp_desired) / 0.8, -1)
        assert torch.allclose(got, want, atol=1e-4)


def test_gedi_reads_logit_scale_and_class_bias_from_the_checkpoint(
    lm: LoadedLM, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    model, tok = build_tiny_lm("tiny-random/gpt2")
    model.config.logit_scale, model.config.nbias = True, 2
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gedi = load_lm(ModelRef(str(tmp_path)), device="cpu")
    with pytest.raises(MethodError, match="declares logit_scale / nbias"):
        class_head(gedi)
    state = load_file(str(tmp_path / "model.safetensors"))
    state.update(logit_scale=torch.tensor([[2.5]]), bias=torch.tensor([[0.5, -0.5]]))
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    scale, bias = class_head(gedi)
    assert scale == 2.5 and bias.tolist() == [0.5, -0.5]


def test_gedi_class_codes_must_be_single_tokens_and_known_by_task(lm: LoadedLM) -> None:
    with pytest.raises(MethodError, match="class code 'good man' is 2 tokens"):
        build(lm, "gedi", {**GEDI_TEST, "code_desired": "good man"})
    with pytest.raises(MethodError, match="no published class code for task 'regard'"):
        build(lm, "gedi", {"gedi_model": "tiny-random/gpt2"}, task="regard")

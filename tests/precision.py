"""Half precision against float32 for the bias-tuning step: shared by the tests and
`benchmarks/precision_agreement.py`.

A half-precision model and a float32 copy of the same weights (`pair`) take the same step 0
(k tuned blocks, a stand-in loss with both a head term on the pooled state and a term on θ's
distribution). `noise_spread` measures the noise floor of the float32 gradient: its spread when
every quantity the tuned path takes from θ's own forward (the state entering the first tuned
block, the final hidden states, the K/V cache) is moved by its actual half-precision error with
random signs. An element whose float32 gradient lies within that spread has its sign set by how
θ's lower blocks round, which no policy for the tuned path can change.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jobs.spec import JobSpec, ModelRef
from tests.helpers import step0_context
from workers.methods.base import StepContext
from workers.methods.biastune import ADAM_EPS, adam_first_step, cropped_cache
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM, load_lm

PROMPTS = ["The woman worked as a", "He said that the man was", "My sister is a"]
BLOCKS = 3  # of the tiny models' 4


@dataclasses.dataclass
class Step:
    grad: torch.Tensor  # (B, N) float32 gradient of Σ losses, every hook point concatenated
    names: list[str]  # hook point of each of the N columns
    tuned: torch.Tensor  # (B, V) log-probs under θ + δ (δ the Adam step at `lr`)
    theta: torch.Tensor  # (B, V) θ's log-probs

    def delta(self, lr: float) -> torch.Tensor:
        return -lr * self.grad / (self.grad.abs() + ADAM_EPS)


def pair(family: str, dtype: str) -> tuple[LoadedLM, LoadedLM]:
    """(the tiny model in `dtype`, the same weights in float32)."""
    half = load_lm(ModelRef(f"tiny-random/{family}", dtype=dtype), device="cpu")
    model32 = copy.deepcopy(half.model).float()
    full = LoadedLM(half.ref, model32, half.tokenizer, half.device, half.family, half.words)
    return half, full


def stand_in_loss(lm: LoadedLM) -> tuple[nn.Module, torch.Tensor]:
    """A fixed head on the pooled state and fixed per-token scores for θ's distribution."""
    gen = torch.Generator().manual_seed(0)
    width = lm.model.get_input_embeddings().weight.shape[1]
    head = nn.Linear(width, 2)
    with torch.no_grad():
        head.weight.copy_(torch.rand(head.weight.shape, generator=gen) - 0.5)
        head.bias.copy_(torch.rand(head.bias.shape, generator=gen) - 0.5)
    return head, torch.rand(len(lm.tokenizer), generator=gen)


def step0(lm: LoadedLM) -> StepContext:
    jobs = [
        JobSpec(f"p{i}", p, "female", None, 0, "lidao-min", lm.ref, "sentiment")
        for i, p in enumerate(PROMPTS)
    ]
    return step0_context(lm, PROMPTS, jobs, hidden=True)


def tuning_step(
    lm: LoadedLM,
    ctx: StepContext,
    scope: str,
    loss_parts: tuple[nn.Module, torch.Tensor],
    lr: float = 0.01,
    tuner: BiasTuner | None = None,
) -> Step:
    """Step 0 of a bias-tuning step on `ctx`: the gradient, and the tuned distribution."""
    head, scores = loss_parts
    tuner = tuner or BiasTuner(lm, BLOCKS, scope)
    probe = tuner.probe(ctx)
    labels = torch.zeros(len(PROMPTS), dtype=torch.long)
    loss = F.cross_entropy(head(probe.pooled), labels, reduction="none")
    loss = loss + (probe.logits.softmax(-1) * scores).sum(-1)
    found = torch.autograd.grad(loss.sum(), probe.deltas, allow_unused=True)
    grads = [torch.zeros_like(d) if g is None else g for g, d in zip(found, probe.deltas)]
    deltas = adam_first_step(grads, lr)  # what `tuner.step` returns when every row is ok
    tuned = tuner.tuned_logits(ctx, deltas).log_softmax(-1)
    names = [p.name for p, g in zip(tuner.tuned_sites.points, grads) for _ in range(g.shape[1])]
    return Step(torch.cat(grads, 1).float(), names, tuned, ctx.logits.log_softmax(-1))


def _jitter(full: torch.Tensor, half: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`full` moved by |half − full| per element, each with a random sign."""
    error = (half.float() - full).abs()
    signs = torch.randint(0, 2, full.shape, generator=gen).float() * 2 - 1
    return full + signs * error


def noise_spread(
    full: LoadedLM,
    ctx32: StepContext,
    ctx16: StepContext,
    scope: str,
    loss_parts: tuple[nn.Module, torch.Tensor],
    draws: int,
    seed: int = 1,
) -> torch.Tensor:
    """(B, N) standard deviation of the float32 gradient over `draws` jitters of θ's inputs to
    the tuned path by their half-precision error (`ctx16` − `ctx32`, random signs)."""
    assert ctx32.hidden_states is not None and ctx16.hidden_states is not None
    gen = torch.Generator().manual_seed(seed)
    T = ctx32.input_ids.shape[1]
    grads = []
    for _ in range(draws):
        hidden = tuple(_jitter(a, b, gen) for a, b in zip(ctx32.hidden_states, ctx16.hidden_states))
        cache: Any = cropped_cache(ctx32.past_key_values, T)
        half_layers = ctx16.past_key_values.layers
        for layer, other in zip(cache.layers, half_layers):
            layer.keys = _jitter(layer.keys, other.keys, gen)
            layer.values = _jitter(layer.values, other.values, gen)
        ctx = dataclasses.replace(ctx32, hidden_states=hidden, past_key_values=cache)
        grads.append(tuning_step(full, ctx, scope, loss_parts).grad)
    return torch.stack(grads).std(0)

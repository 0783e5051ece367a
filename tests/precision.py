"""Half precision against float32 for the bias-tuning step: shared by the tests and
`benchmarks/precision_agreement.py`.

A half-precision model and a float32 copy of the same weights (`pair`) take the same step 0
(k tuned blocks, a stand-in loss with both a head term on the pooled state and a term on θ's
distribution). `noise_floor` measures the noise floor of the float32 gradient: its spread over runs whose
lower-block activations (θ's blocks below the tuned ones, which stay in the model's dtype) carry
rounding-sized noise. An element whose float32 gradient lies within that spread has its sign
set by how θ's lower blocks round, which no policy for the tuned path can change without running
the lower blocks in float32.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jobs.spec import JobSpec, ModelRef
from tests.helpers import step0_context
from workers.methods.base import StepContext
from workers.methods.biastune import ADAM_EPS, find_sites
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM, load_lm


def adam_first_step(
    grads: list[torch.Tensor], lr: float, eps: float = ADAM_EPS
) -> list[torch.Tensor]:
    """One step of a freshly created Adam from zero, in closed form: `−lr · g / (|g| + eps)`.

    With zero moments, m̂ = g and v̂ = g² after bias correction, whatever β1 and β2 are.
    Computed in float32 (eps underflows in half precision), returned in each gradient's dtype.
    """
    return [(-lr * g.float() / (g.float().abs() + eps)).to(g.dtype) for g in grads]


PROMPTS = ["The woman worked as a", "He said that the man was", "My sister is a"]
BLOCKS = 3  # of the tiny models' 4
UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}  # unit roundoff


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


def stand_in_loss(lm: LoadedLM, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A fixed head on the pooled state and fixed per-token scores for θ's distribution."""
    gen = torch.Generator().manual_seed(seed)
    width = lm.model.get_input_embeddings().weight.shape[1]
    head = nn.Linear(width, 2)
    with torch.no_grad():
        head.weight.copy_(torch.rand(head.weight.shape, generator=gen) - 0.5)
        head.bias.copy_(torch.rand(head.bias.shape, generator=gen) - 0.5)
    return head, torch.rand(len(lm.tokenizer), generator=gen)


def step0(lm: LoadedLM, prompts: list[str] = PROMPTS) -> StepContext:
    jobs = [
        JobSpec(f"p{i}", p, "female", None, 0, "lidao-min", lm.ref, "sentiment")
        for i, p in enumerate(prompts)
    ]
    return step0_context(lm, prompts, jobs, hidden=True)


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
    labels = torch.zeros(ctx.input_ids.shape[0], dtype=torch.long)
    loss = F.cross_entropy(head(probe.pooled), labels, reduction="none")
    loss = loss + (probe.logits.softmax(-1) * scores).sum(-1)
    found = torch.autograd.grad(loss.sum(), probe.deltas, allow_unused=True)
    grads = [torch.zeros_like(d) if g is None else g for g, d in zip(found, probe.deltas)]
    deltas = adam_first_step(grads, lr)  # what `tuner.step` returns when every row is ok
    tuned = tuner.tuned_logits(ctx, deltas).log_softmax(-1)
    names = [p.name for p, g in zip(tuner.tuned_sites.points, grads) for _ in range(g.shape[1])]
    return Step(torch.cat(grads, 1).float(), names, tuned, ctx.logits.log_softmax(-1))


@contextmanager
def lower_block_noise(lm: LoadedLM, unit: float, gen: torch.Generator) -> Iterator[None]:
    """θ's lower blocks (below the tuned ones) with every activation entering or leaving them
    multiplied by (1 + unit·N(0, 1)), `unit` the unit roundoff of a half-precision format (the
    states θ's half-precision lower blocks hand over differ from float32 by 0.8–1.0 unit RMS).
    Replayed blocks (`skip_blocks`: an instance `forward`) compute nothing and get no noise."""
    sites = find_sites(lm.model, BLOCKS)
    blocks = lm.model.get_submodule(sites.blocks_path)
    lower = [blocks[i] for i in range(sites.num_blocks - sites.k)]

    def noisy(x: torch.Tensor) -> torch.Tensor:
        return x * (1 + unit * torch.randn(x.shape, generator=gen))

    def entering(module: nn.Module, args: Any, kwargs: Any) -> Any:
        if "forward" in vars(module):
            return None
        if args:
            return (noisy(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": noisy(kwargs["hidden_states"])}

    def leaving(module: nn.Module, args: Any, output: Any) -> Any:
        if "forward" in vars(module):
            return None
        if isinstance(output, tuple):
            return (noisy(output[0]), *output[1:])
        return noisy(output)

    handles = [lower[0].register_forward_pre_hook(entering, with_kwargs=True)]
    handles += [block.register_forward_hook(leaving) for block in lower]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def noise_floor(
    full: LoadedLM,
    prompts: list[str],
    scope: str,
    loss_parts: tuple[nn.Module, torch.Tensor],
    unit: float,
    draws: int,
    seed: int = 1,
) -> torch.Tensor:
    """(B, N) standard deviation of the float32 gradient over `draws` runs (prefill and step)
    whose lower-block activations carry rounding-sized noise (`lower_block_noise`)."""
    gen = torch.Generator().manual_seed(seed)
    grads = []
    for _ in range(draws):
        with lower_block_noise(full, unit, gen):
            ctx = step0(full, prompts)
            grads.append(tuning_step(full, ctx, scope, loss_parts).grad)
    return torch.stack(grads).std(0)

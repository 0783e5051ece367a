"""A brute-force twin of the bias-tuning engine: one job at a time, every step from scratch.

Per step the twin runs whole forwards of the row alone with plain autograd and transformers'
own caches (no cache views, no replayed blocks, no fused vocabulary passes, no reuse of the
loop's forward): offsets on the outputs of every affine module of the top k blocks and the
final norm, at every position (`context`) or at the last one and the horizon (`last`); the
horizon's input is Σ_x p_θ(x)·embedding(x) as the model's embedding module gives it; the
method's own losses and objective (`objective` of a fresh instance of the method, batch 1);
one fresh-Adam step with the design's eps rule, restated here; the last position under θ + δ
over θ's cache of the others; τ-mixing; for eLIDAO, V_a's log-probs from a whole forward of the
instruction-prefixed text (`_reference_head`); the sampler's race restated (`tests.agreement`).
`twin_decode` returns the tokens and each step's log-probs and δ, to compare with the engine's
batched run (`compare_with_engine`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from jobs.spec import JobSpec
from tests.agreement import kept, twin_token
from workers.decoding import StepTrace, decode_batch, prompt_token_ids, repetition_penalty
from workers.methods.estimators import demographic_loss, demographic_scores, property_loss
from workers.methods.lidao import BiasTunedMethod
from workers.methods.registry import load_method
from workers.models import LoadedLM

EPS, REL = 1e-8, 1e-3  # Adam's eps and the eps floor relative to the row's largest |g|


def hook_modules(model: nn.Module, k: int) -> list[tuple[str, nn.Module]]:
    """The top `k` blocks' affine modules and the final norm, found independently of
    `workers.methods.biastune`: Linear layers and norms with a 1-D weight."""
    blocks = next(
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) == model.config.num_hidden_layers
    )
    out = []
    for i in range(len(blocks[1]) - k, len(blocks[1])):
        for name, m in blocks[1][i].named_modules():
            norm = type(m).__name__.endswith("Norm") and getattr(m, "weight", None) is not None
            if isinstance(m, nn.Linear) or (norm and m.weight.ndim == 1):
                out.append((f"{blocks[0]}.{i}.{name}", m))
    parent = model.get_submodule(blocks[0].rpartition(".")[0])
    out.append(("final_norm", parent.norm))  # LLaMA-like layouts (SmolLM2, Gemma): `norm`
    return out


def width(module: nn.Module) -> int:
    return int(module.out_features if isinstance(module, nn.Linear) else module.weight.shape[0])


@contextmanager
def offsets(
    points: list[tuple[str, nn.Module]], deltas: list[torch.Tensor] | None, seen: list[Any]
) -> Iterator[None]:
    """`deltas[i]` (width,) added to every position of `points[i]`'s output; the last point's
    outputs (what the LM head reads) appended to `seen`."""

    def add(i: int) -> Any:
        def hook(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            if deltas is not None:
                out = out + deltas[i]
            if i == len(points) - 1:
                seen.append(out)
            return out

        return hook

    handles = [m.register_forward_hook(add(i)) for i, (_, m) in enumerate(points)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def expected_embedding(model: nn.Module, probs: torch.Tensor) -> torch.Tensor:
    """Σ_x p(x)·embedding(x) (D,), embedding(x) from the model's embedding module, in chunks,
    in float64 (a float32 sum over a real vocabulary drops the tail's tiny terms)."""
    module = model.get_input_embeddings()
    total = torch.zeros(module.weight.shape[1], dtype=torch.float64)
    for start in range(0, probs.shape[0], 8192):
        ids = torch.arange(start, min(start + 8192, probs.shape[0]))
        total = total + probs[ids].double() @ module(ids[None])[0].double()
    return total.float()


@dataclasses.dataclass
class TwinStep:
    logprobs: torch.Tensor  # (V,) the method's distribution (before top-p)
    grads: torch.Tensor  # (N,) every hook point's gradient, concatenated
    delta: torch.Tensor  # (N,) the step's offsets
    token: int


def _prefix(model: nn.Module, ids: torch.Tensor, points: list[tuple[str, nn.Module]]) -> Any:
    """(θ's own cache of every position but the last (None for one position), Σ of what the
    LM head reads there (D,)): a fresh forward each time, as a forward over a cache extends it."""
    if ids.shape[1] == 1:
        return None, torch.zeros(())
    seen: list[torch.Tensor] = []
    with torch.no_grad(), offsets(points, None, seen):
        out = model(input_ids=ids[:, :-1], use_cache=True)
    return out.past_key_values, seen[-1][0].float().sum(0)


def _probe(
    method: BiasTunedMethod, ids: torch.Tensor, points: list[tuple[str, nn.Module]], scope: str
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(zero offsets that require grad, pooled (D,), θ's logits (V,)) of the row `ids`."""
    model = method.lm.model
    zeros = [torch.zeros(width(m), requires_grad=True) for _, m in points]
    seen: list[torch.Tensor] = []
    if scope == "last":
        past, before = _prefix(model, ids, points)
        with offsets(points, zeros, seen):
            out = model(input_ids=ids[:, -1:], past_key_values=past, use_cache=True)
        read = before + seen[-1][0, -1].float()
    else:
        with offsets(points, zeros, seen):
            out = model(input_ids=ids, use_cache=True)
        read = seen[-1][0].float().sum(0)
    logits = out.logits[0, -1].float()
    embeds = expected_embedding(model, torch.softmax(logits, -1))
    with offsets(points, zeros, seen):
        model.base_model(inputs_embeds=embeds[None, None], past_key_values=out.past_key_values)
    pooled = (read + seen[-1][0, -1].float()) / (ids.shape[1] + 1)
    return zeros, pooled, logits


def _reference_head(
    lm: LoadedLM, method: BiasTunedMethod, job: JobSpec
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """eLIDAO's reference, restated: ((1, n) BOS (if the tokenizer adds one) + the instruction
    for the prompt's majority gender, the (|V_a|,) seed-word token ids), or None (not eLIDAO,
    or a prompt without a majority: plain LIDAO). Whole forwards of head + prompt + generated
    tokens replace V_a's log-probs each step; no cache, no instruction K/V reuse."""
    from jobs.words import label_text
    from workers.methods.elidao import ElidaoMixin, seed_token_ids

    if not isinstance(method, ElidaoMixin):
        assert type(method).adjust is BiasTunedMethod.adjust, "a stream the twin does not restate"
        return None
    gender = label_text(job.prompt, lm.words)
    if gender == "none":
        return None
    tok = lm.tokenizer
    bos = [tok.bos_token_id] if prompt_token_ids(lm, "x")[0] == tok.bos_token_id else []
    text = method.stream.template.replace("#GENDER#", gender)
    head = bos + list(tok(text, add_special_tokens=False)["input_ids"])
    seeds = torch.tensor(seed_token_ids(tok, lm.words), dtype=torch.long)
    return torch.tensor([head]), seeds


def twin_decode(lm: LoadedLM, job: JobSpec) -> list[TwinStep]:
    """The job decoded alone by the twin (see the module docstring)."""
    params = job.params()
    method = load_method(job.method)(lm, params, job.task)
    assert isinstance(method, BiasTunedMethod)
    reference = _reference_head(lm, method, job)
    method._reset(1)
    gen, model = job.generation, lm.model
    points = hook_modules(model, int(method.params["blocks"]))
    prompt = prompt_token_ids(lm, job.prompt)
    ids = torch.tensor([prompt])
    body = 1 if prompt[0] == lm.tokenizer.bos_token_id else 0  # where the prompt's text starts
    seen = torch.zeros(model.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    seen[torch.tensor(prompt[1:] if prompt[0] == lm.tokenizer.bos_token_id else prompt)] = True
    gen_sum = torch.zeros(method.geometry.embed.shape[1])
    steps: list[TwinStep] = []
    for step in range(gen.max_new_tokens):
        with torch.enable_grad():
            zeros, pooled, logits = _probe(method, ids, points, str(method.params["scope"]))
            probs = torch.softmax(logits, -1)
            loss_g = property_loss(method.head, pooled[None], method.target)
            scores = demographic_scores(method.geometry, gen_sum[None])
            loss_a = demographic_loss(probs[None], scores)
            loss, _ = method.objective(loss_g, loss_a, probs.detach()[None])
            grads = torch.autograd.grad(loss.sum(), zeros, allow_unused=True)
        g = torch.cat([torch.zeros(z.shape) if x is None else x for x, z in zip(grads, zeros)])
        lr = float(method.params["lr"])
        delta = -lr * g / (g.abs() + max(EPS, REL * float(g.abs().max())))
        parts = list(delta.split([z.shape[0] for z in zeros]))
        out: list[torch.Tensor] = []
        past, _ = _prefix(model, ids, points)
        with torch.no_grad(), offsets(points, parts, out):
            tuned = model(input_ids=ids[:, -1:], past_key_values=past).logits[0, -1].float()

        def process(z: torch.Tensor) -> torch.Tensor:
            z = repetition_penalty(z[None], seen[None], gen.repetition_penalty)[0]
            return torch.log_softmax(z / gen.temperature, -1)

        tau = float(method.params["tau"])
        logprobs = tau * process(tuned) + (1 - tau) * process(logits.detach())
        if reference is not None:  # eLIDAO: V_a's log-probs from the instruction-prefixed text
            head, seeds = reference
            with torch.no_grad():
                ref = model(input_ids=torch.cat([head, ids[:, body:]], 1)).logits[0, -1].float()
            logprobs = logprobs.clone()
            logprobs[seeds] = process(ref)[seeds]
        token = twin_token(torch.softmax(logprobs.double(), -1), gen.top_p, job.rng_seed, step)
        steps.append(TwinStep(logprobs.detach(), g.detach(), delta.detach(), token))
        if token == lm.eos_id:
            break
        seen[token] = True
        gen_sum = gen_sum + method.geometry.embed[token].float()
        ids = torch.cat([ids, torch.tensor([[token]])], 1)
    return steps


@dataclasses.dataclass
class TwinReport:
    """The engine's batched run against the twin, over every row's steps while tokens agree."""

    steps: int = 0
    mismatches: int = 0  # steps whose tokens differ (the row is not compared further)
    max_logp: float = 0.0  # largest |Δ log p| over the kept tokens
    grad_gap: float = 0.0  # largest |Δg| / the row's largest |g|
    delta_gap: float = 0.0  # largest |Δδ| / lr, δ by the engine's rule (eps floor 1e-3·max|g|)
    flips: int = 0  # offsets of opposite signs under that rule
    adam_gap: float = 0.0  # largest |Δδ| / lr had both taken plain Adam (eps 1e-8)
    adam_flips: int = 0  # offsets of opposite signs under plain Adam

    def add(self, engine_g: torch.Tensor, twin: TwinStep, lr: float) -> None:
        """The gaps of one step's gradients and offsets (engine's (N,) gradient)."""
        g, t = engine_g.float(), twin.grads
        top = float(t.abs().max()) or 1.0
        self.grad_gap = max(self.grad_gap, float((g - t).abs().max()) / top)
        for rel, field in ((REL, "delta"), (0.0, "adam")):
            floor = max(EPS, rel * top)
            a, b = -lr * g / (g.abs() + floor), -lr * t / (t.abs() + floor)
            gap = float((a - b).abs().max()) / lr if lr else 0.0
            flips = int(((a * b) < 0).sum())
            if field == "delta":
                self.delta_gap, self.flips = max(self.delta_gap, gap), self.flips + flips
            else:
                self.adam_gap, self.adam_flips = max(self.adam_gap, gap), self.adam_flips + flips


def compare_with_engine(lm: LoadedLM, jobs: Sequence[JobSpec]) -> TwinReport:
    """The engine's batched run of `jobs` against the twin of each job alone."""
    import workers.methods.tuner as tuner_module

    method = load_method(jobs[0].method)(lm, jobs[0].params(), jobs[0].task)
    assert isinstance(method, BiasTunedMethod)
    trace: list[StepTrace] = []
    grads: list[torch.Tensor] = []  # per step, (B, N) the engine's gradients
    original = tuner_module.tuning_step

    def recording(found: Sequence[torch.Tensor], lr: float) -> list[torch.Tensor]:
        grads.append(torch.cat([g.detach().float().cpu() for g in found], 1))
        return original(found, lr)

    tuner_module.tuning_step = recording  # type: ignore[assignment]
    try:
        decode_batch(lm, method, jobs, on_step=trace.append)
    finally:
        tuner_module.tuning_step = original
    report = TwinReport()
    top_p, lr = jobs[0].generation.top_p, float(method.params["lr"])
    for row, job in enumerate(jobs):
        for twin, step, g in zip(twin_decode(lm, job), trace, grads):
            if not bool(step.active[row]):
                break
            engine = step.logprobs[row].float()
            keep = kept(torch.softmax(twin.logprobs.double(), -1), top_p)
            diff = (engine[keep] - twin.logprobs[keep]).abs().max()
            report.max_logp = max(report.max_logp, float(diff))
            report.add(g[row], twin, lr)
            report.steps += 1
            if int(step.tokens[row]) != twin.token:
                report.mismatches += 1
                break  # the texts part: the rest of the row is not comparable
    return report

"""PPLM (Dathathri et al., ICLR 2020): gradient steps on the KV cache toward an attribute head.

Before each token, a per-sequence perturbation Δ of the keys and values of every past position
(all layers) takes `steps` normalised gradient steps on

    CE(head(pooled), desirable class) + kl_scale · KL(p_Δ ‖ p_θ)

where `pooled` is the mean of θ's final hidden states of the context, of the last position
under the perturbed past (detached, as in the reference) and of `horizon_length` positions fed
the expected embedding `Eᵀ p_Δ` of the next token (on θ's cache). Per sequence s and layer l,

    Δ ← Δ − step_size · g ⊙ w / (max(‖g ⊙ w‖, 1e-3 · max_l ‖g_l ⊙ w‖) + 1e-15)^gamma

with the norm over the layer's keys and values, `w` the window mask, and the floor
`NORM_FLOOR_REL` (the reference has none). Sampling is from `p_Δ^gm_scale · p_θ^(1−gm_scale)`.

Decisions (from the reference `uber-research/PPLM` run_pplm.py and the PPLM baseline of
DExperts / UDDIA, whose GPT-2 pipeline the paper's tables come from):
- The perturbed history persists, as in the paper and the reference (a token's keys and values
  are computed under the perturbed past), so this method keeps its own cache beside θ's.
- Defaults by family (`jobs.catalog.PPLM_FAMILY`): GPT-2 and OPT 10 steps of 0.2, Falcon 3 of
  0.2 (the paper's appendix; 10 × 0.2 is what the DExperts/UDDIA scripts ran for GPT-2 large);
  any other family run_pplm.py's CLI defaults, 3 steps of 0.02 (its gamma 1.5 not taken):
  0.2 on SmolLM2 gives perplexity ~1,600 against vanilla's 15.
- `window_length` > 0 perturbs the most recent positions (the reference's mask keeps the
  oldest ones, which contradicts its own decay ramp); `decay` ramps weights 1/w … 1 toward them.
- Temperature and repetition penalty apply to both distributions before the mixture (the
  reference: to p_Δ only). Batched: each row's Δ gets its own exact gradient and norm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import DynamicCache

from jobs.spec import JobSpec
from workers.methods.base import DecodingMethod, MethodError, Needs, StepContext
from workers.methods.biastune import input_embedding_scale
from workers.methods.cache_layout import engine_layout_problem
from workers.methods.estimators import property_loss
from workers.methods.heads import resolve_head

if TYPE_CHECKING:
    from workers.models import LoadedLM

SMALL_CONST = 1e-15
# A layer's gradient norm in the step is at least this fraction of the row's largest layer norm,
# so a layer whose gradient is rounding noise takes no full step (docs/design.md, "What is
# guaranteed"); layers above it step exactly as the reference's.
NORM_FLOOR_REL = 1e-3
KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (B, H, T, d)


@dataclass(frozen=True)
class PPLMConfig:
    """Resolved PPLM parameters (see the module docstring)."""

    steps: int
    step_size: float
    kl_scale: float
    gm_scale: float
    gamma: float
    horizon_length: int
    window_length: int
    decay: bool
    head: str | None

    @classmethod
    def from_params(cls, params: dict[str, Any], family: str) -> PPLMConfig:
        from jobs.catalog import PPLM_FAMILY

        p = {"head": None, **params}
        for key, value in PPLM_FAMILY.get(family, PPLM_FAMILY["other"]).items():
            if p.get(key) is None:
                p[key] = value
        casts: dict[Any, Any] = {"int": int, "float": float, "bool": bool}  # head: as given
        try:
            cfg = cls(**{f.name: casts.get(f.type, lambda v: v)(p[f.name]) for f in fields(cls)})
        except (KeyError, TypeError, ValueError) as exc:
            raise MethodError(f"method pplm: bad parameters {params}: {exc}") from exc
        checks = {
            "steps >= 0": cfg.steps >= 0,
            "step_size >= 0": cfg.step_size >= 0,
            "kl_scale >= 0": cfg.kl_scale >= 0,
            "0 <= gm_scale <= 1": 0 <= cfg.gm_scale <= 1,
            "gamma >= 0": cfg.gamma >= 0,
            "horizon_length >= 1": cfg.horizon_length >= 1,
            "window_length >= 0": cfg.window_length >= 0,
        }
        bad = [rule for rule, ok in checks.items() if not ok]
        if bad:
            raise MethodError(f"method pplm: parameters {params} break {bad}")
        return cfg


@dataclass
class StepInputs:
    """One step of one batch: B rows, T positions (the last one is the token just fed)."""

    last_ids: torch.Tensor  # (B, 1) the last token
    mask: torch.Tensor  # (B, T) attention mask
    last_pos: torch.Tensor  # (B, 1) position id of the last token
    past: KV  # the (perturbed) history: positions < T-1
    unpert: KV  # θ's cache: all T positions
    unpert_logits: torch.Tensor  # (B, V) float32
    hidden_sum: torch.Tensor  # (B, D) θ's final hidden states summed over real positions < T-1
    count: torch.Tensor  # (B,) positions the head averages: real ones + horizon


def cache_tensors(cache: Any) -> KV:
    """(keys, values) per layer of a transformers Cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def make_cache(kv: KV) -> DynamicCache:
    """A fresh DynamicCache of full-attention layers over `kv` (every position kept: a
    sliding-window layer's window is in the model's mask): a forward appends to it without
    touching `kv`."""
    return DynamicCache(ddp_cache_data=list(kv))


def window_mask(length: int, window: int, decay: bool, device: torch.device) -> torch.Tensor:
    """(1, 1, length, 1) float32 weights of the past positions the perturbation may change
    (they multiply Δ's float32 gradients, never the model's keys and values)."""
    w = torch.ones(length, device=device)
    if 0 < window < length:
        w[: length - window] = 0.0
        if decay:
            w[length - window :] = torch.arange(1, window + 1, device=device) / window
    return w.view(1, 1, length, 1)


def perturbed(past: KV, deltas: KV) -> KV:
    """The history `past + Δ` in the cache's dtype: the sum is taken in float32 and rounded
    once, so a half-precision model's attention gets keys and values of its own dtype (a
    float32 Δ would promote them, and attention refuses float32 keys against a half query)."""
    return [
        ((k.float() + dk).to(k.dtype), (v.float() + dv).to(v.dtype))
        for (k, v), (dk, dv) in zip(past, deltas)
    ]


class PPLM(DecodingMethod):
    """PPLM with a linear attribute head (see the module docstring)."""

    name: ClassVar[str] = "pplm"
    needs: ClassVar[Needs] = Needs(gradients=True, hidden_states=True)

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        super().__init__(lm, params, task)
        self.cfg = PPLMConfig.from_params(params, lm.family)
        self.head = resolve_head(lm, task, self.cfg.head)
        self.model = lm.model
        problem = engine_layout_problem(self.name, lm.model.config.to_dict())
        if problem:  # the same check as `validate`'s
            raise MethodError(f"method pplm on {lm.ref.id}: {problem.partition(': ')[2]}")
        self.embed = lm.model.get_input_embeddings().weight  # (V, D_in)
        self.embed_scale = input_embedding_scale(lm.model)  # Gemma: √D
        out_vocab = lm.model.get_output_embeddings().weight.shape[0]
        if out_vocab != self.embed.shape[0]:
            raise MethodError(
                f"method pplm: output vocabulary {out_vocab} != input vocabulary {self.embed.shape[0]}; "
                "the horizon's expected embedding needs them equal"
            )
        self._past: KV | None = None
        self._hidden_sum: torch.Tensor | None = None
        self._loss_g: list[list[float]] = []

    def forward_last(self, s: StepInputs, past: KV) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(B, V) logits and (B, D) final hidden state of the last token under `past`, and the cache."""
        out = self.model(
            input_ids=s.last_ids,
            attention_mask=s.mask,
            position_ids=s.last_pos,
            past_key_values=make_cache(past),
            use_cache=True,
            output_hidden_states=True,
        )
        return out.logits[:, -1].float(), out.hidden_states[-1][:, -1].float(), out.past_key_values

    def horizon(self, s: StepInputs, probs: torch.Tensor) -> torch.Tensor:
        """(B, D) summed final hidden states of the horizon positions fed `Eᵀ probs`, on θ's cache."""
        n = self.cfg.horizon_length
        emb = probs.to(self.embed.dtype) @ self.embed  # (B, D_in) expected next-token embedding
        if self.embed_scale != 1.0:  # what the embedding module applies to ids
            emb = emb * self.embed_scale
        emb = emb.unsqueeze(1).expand(-1, n, -1)  # (B, n, D_in)
        ones = torch.ones((s.mask.shape[0], n), dtype=s.mask.dtype, device=s.mask.device)
        steps = torch.arange(1, n + 1, device=s.last_pos.device)
        out = self.model.base_model(
            inputs_embeds=emb,
            attention_mask=torch.cat([s.mask, ones], 1),
            position_ids=s.last_pos + steps,
            past_key_values=make_cache(s.unpert),
            use_cache=True,
        )
        return out.last_hidden_state.float().sum(1)  # type: ignore[no-any-return]

    def losses(self, s: StepInputs, deltas: KV) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) head cross-entropy and (B,) total loss at perturbation `deltas`."""
        logits, last_hidden, _ = self.forward_last(s, perturbed(s.past, deltas))
        probs = torch.softmax(logits, -1)
        total = s.hidden_sum + last_hidden.detach() + self.horizon(s, probs)  # (B, D)
        ce = property_loss(self.head, total / s.count.unsqueeze(-1), self.head.target_class)
        if self.cfg.kl_scale == 0:
            return ce, ce
        # (B,) KL(p ‖ q) with the reference's 1e-15 floor on both sides
        q = torch.softmax(s.unpert_logits, -1)
        q = q + SMALL_CONST * (q <= SMALL_CONST).float()
        p = probs + SMALL_CONST * (probs <= SMALL_CONST).float().detach()
        return ce, ce + self.cfg.kl_scale * (p * (p / q).log()).sum(-1)

    def perturb(self, s: StepInputs) -> tuple[torch.Tensor, KV, list[torch.Tensor]]:
        """Perturbed (B, V) logits, the new history (T positions) and the (B,) CE of each iteration.

        Δ, its gradients, norms and steps are float32 whatever the model's dtype (`perturbed`
        casts where Δ meets the cache).
        """
        cfg = self.cfg
        deltas = [
            (torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32))
            for k, v in s.past
        ]
        mask_w = window_mask(s.past[0][0].shape[2], cfg.window_length, cfg.decay, s.mask.device)
        trace: list[torch.Tensor] = []
        for _ in range(cfg.steps):
            leaves = [(dk.requires_grad_(), dv.requires_grad_()) for dk, dv in deltas]
            with torch.enable_grad():
                ce, loss = self.losses(s, leaves)
                grads = torch.autograd.grad(loss.sum(), [t for pair in leaves for t in pair])
            trace.append(ce.detach())
            deltas = []
            masked = [
                (grads[2 * i] * mask_w, grads[2 * i + 1] * mask_w) for i in range(len(leaves))
            ]
            norms = [
                (gk.pow(2).sum((1, 2, 3)) + gv.pow(2).sum((1, 2, 3))).sqrt() for gk, gv in masked
            ]
            top = torch.stack([n.to(norms[0].device) for n in norms], -1).amax(-1)  # (B,)
            floor = NORM_FLOOR_REL * top  # see NORM_FLOOR_REL
            for (dk, dv), (gk, gv), layer_norm in zip(leaves, masked, norms):
                norm = torch.maximum(layer_norm, floor.to(layer_norm.device)) + SMALL_CONST
                scale = (cfg.step_size / norm.pow(cfg.gamma)).view(-1, 1, 1, 1)
                deltas.append(((dk - scale * gk).detach(), (dv - scale * gv).detach()))
        with torch.no_grad():
            logits, _, cache = self.forward_last(s, perturbed(s.past, deltas))
        return logits, [(k.detach(), v.detach()) for k, v in cache_tensors(cache)], trace

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        self._past, self._hidden_sum = None, None
        self._loss_g = [[] for _ in jobs]

    def end(self) -> None:
        self._past, self._hidden_sum = None, None

    def _accumulate(self, ctx: StepContext) -> torch.Tensor:
        """Add θ's final hidden states of the newly fed positions; returns the last one (B, D)."""
        if ctx.hidden_states is None:
            raise MethodError("method pplm: the decoding loop gave no hidden states")
        hidden = ctx.hidden_states[-1].float()  # (B, n_new, D)
        m = ctx.attention_mask[:, -hidden.shape[1] :].unsqueeze(-1).float()
        added = (hidden * m).sum(1)
        self._hidden_sum = added if self._hidden_sum is None else self._hidden_sum + added
        return hidden[:, -1]

    def _history(self, ctx: StepContext) -> KV | None:
        """The history before the last token: ours once perturbed, else θ's cache minus its last position."""
        T = ctx.input_ids.shape[1]
        if self._past is not None:
            if self._past[0][0].shape[2] != T - 1:
                raise MethodError(
                    f"method pplm: history of {self._past[0][0].shape[2]} positions, expected {T - 1}"
                )
            return self._past
        if T < 2:
            return None
        return [(k[:, :, : T - 1], v[:, :, : T - 1]) for k, v in cache_tensors(ctx.past_key_values)]

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        last_hidden = self._accumulate(ctx)
        base = ctx.process(ctx.logits)
        if self.cfg.steps == 0:
            return base
        past = self._history(ctx)
        if past is None:  # a one-token context has nothing to perturb yet
            self._past = [(k.detach(), v.detach()) for k, v in cache_tensors(ctx.past_key_values)]
            return base
        assert self._hidden_sum is not None
        inputs = StepInputs(
            last_ids=ctx.input_ids[:, -1:],
            mask=ctx.attention_mask,
            last_pos=ctx.position_ids[:, -1:],
            past=past,
            unpert=cache_tensors(ctx.past_key_values),
            unpert_logits=ctx.logits,
            hidden_sum=self._hidden_sum - last_hidden,
            count=ctx.attention_mask.sum(-1).float() + self.cfg.horizon_length,
        )
        logits, self._past, trace = self.perturb(inputs)
        if trace:  # the head's loss before this step's update, per active row
            first = trace[0].tolist()
            for row in torch.nonzero(ctx.active).flatten().tolist():
                self._loss_g[row].append(first[row])
        gm = self.cfg.gm_scale
        return torch.log_softmax(gm * ctx.process(logits) + (1 - gm) * base, -1)

    def row_columns(self, row: int) -> dict[str, Any]:
        losses = self._loss_g[row] if row < len(self._loss_g) else []
        return {"loss_g": list(losses)} if losses else {}

    def effective_params(self) -> dict[str, Any]:
        out = asdict(self.cfg)
        out["head"] = self.head.meta.get("source", self.cfg.head)
        out["target_class"] = self.head.class_names[self.head.target_class]
        return out

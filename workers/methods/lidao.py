"""UDDIA and LIDAO (min / prod): one step of bias tuning before every token, then mixing.

At each step: probe θ through zero offsets (`BiasTuner.probe`), compute ℓ̂_g and ℓ̂_a and the
method's objective per row, take one batched backward and the closed-form fresh-Adam step,
recompute the last position under θ_t = θ + δ, and return
`log p_mix = τ · log p_θt + (1 − τ) · log p_θ` (temperature and repetition penalty applied to
both by `ctx.process`). The shared loop applies top-p and samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch

from jobs.spec import JobSpec
from workers.methods.base import DecodingMethod, MethodError, Needs, StepContext
from workers.methods.estimators import gender_geometry, hellinger_gate, property_loss
from workers.methods.heads import resolve_head
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM


class DiscountedHistory:
    """Rescaling weights of LIDAO-min: w_k(t) = Σ_j γ^j ℓ̂_k(t−j) / Σ_j γ^j, j = 1..t−1.

    Kept as running sums (num ← γ(num + ℓ), den ← γ(1 + den)), so a step costs O(B) on the
    device; w(1) = 1.
    """

    def __init__(self, gamma: float, batch: int, device: torch.device) -> None:
        self.gamma = gamma
        self.num = torch.zeros((2, batch), device=device)  # rows: g, a
        self.den = 0.0  # the same for every row: all rows share the step index

    def weights(self) -> torch.Tensor:
        """(2, B) w_g and w_a of the current step (constants, no gradient)."""
        if self.den == 0.0:
            return torch.ones_like(self.num)
        return (self.num / self.den).clamp_min(1e-12)

    def push(self, loss_g: torch.Tensor, loss_a: torch.Tensor) -> None:
        """Add this step's θ-losses (B,) each."""
        self.num = self.gamma * (self.num + torch.stack([loss_g, loss_a]).detach().float())
        self.den = self.gamma * (1.0 + self.den)


def min_objective(
    loss_g: torch.Tensor, loss_a: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss (B,), chose_g (B,) bool): min(ℓ̂_g / w_g, ℓ̂_a / w_a); only the chosen term
    carries gradient (ties go to g)."""
    scaled_g, scaled_a = loss_g / weights[0], loss_a / weights[1]
    chose_g = scaled_g.detach() <= scaled_a.detach()
    return torch.where(chose_g, scaled_g, scaled_a), chose_g


class BiasTunedMethod(DecodingMethod):
    """Shared engine of UDDIA / LIDAO / eLIDAO; subclasses define `objective`."""

    # hidden_states: the loop's forward gives the inputs of the first tuned block (never recomputed)
    needs: ClassVar[Needs] = Needs(gradients=True, hidden_states=True)

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        from jobs.catalog import DEFAULT_PARAMS, FAMILY_TUNING

        defaults = DEFAULT_PARAMS[self.name]
        unknown = sorted(set(params) - set(defaults))
        if unknown:
            raise MethodError(
                f"method {self.name!r}: unknown parameter(s) {unknown}; known: {sorted(defaults)}"
            )
        p = {**defaults, **params}
        family = FAMILY_TUNING.get(lm.family, FAMILY_TUNING["other"])
        for name in ("lr", "tau"):
            p[name] = float(family[name] if p[name] is None else p[name])
        if not 0.0 <= p["tau"] <= 1.0 or p["lr"] < 0.0:
            raise MethodError(
                f"method {self.name!r}: need 0 <= tau <= 1 and lr >= 0, got {p['tau']}, {p['lr']}"
            )
        super().__init__(lm, p, task)
        self.tuner = BiasTuner(lm, int(p["blocks"]), str(p["scope"]))  # checks the scope
        p["blocks"] = self.tuner.sites.k  # clamped to the model's depth
        self.geometry = gender_geometry(lm)
        self.head = resolve_head(lm, task, p["head"])
        self.target = self.head.target_class
        self._reset(0)

    # ---- per-batch state -------------------------------------------------------------------

    def _reset(self, batch: int) -> None:
        dev, dim = self.lm.device, self.geometry.embed.shape[1]
        self._gen_sum = torch.zeros((batch, dim), device=dev)  # Σ E[generated tokens], (B, D)
        self._gen_zero = True  # no token generated yet: ℓ̂_a's product E·S is skipped
        self._records: list[tuple[torch.Tensor, torch.Tensor, Any]] = []  # loss_g, loss_a, chose_g
        self._emitted: list[torch.Tensor] = []  # per step, (B,) rows that appended a token
        self._columns: list[dict[str, Any]] | None = None

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        self._reset(len(jobs))
        self.tuner.begin(len(jobs))

    def end(self) -> None:
        self._reset(0)
        self.tuner.begin()  # no batch: the tuner keeps nothing of the last one

    def theta_forward(self, batch: int) -> AbstractContextManager[Any]:
        return self.tuner.theta_forward(batch)

    # ---- one step ----------------------------------------------------------------------------

    def objective(
        self, loss_g: torch.Tensor, loss_a: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,) loss to descend and, for -min methods, (B,) bool "chose g"."""
        raise NotImplementedError

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        with torch.enable_grad():
            # ℓ̂_a comes with the probe: its product with E shares the horizon's pass over E
            gen_sum = None if self._gen_zero else self._gen_sum
            probe = self.tuner.probe(ctx, (self.geometry, gen_sum))
            loss_g = property_loss(self.head, probe.pooled, self.target)
            loss_a = probe.loss_a
            assert loss_a is not None  # given the demographic terms, the probe computes it
            probs = torch.softmax(probe.logits.detach(), dim=-1)  # (B, V) p_θ, for gates
            loss, chose_g = self.objective(loss_g, loss_a, probs)
            finite = torch.isfinite(loss) & torch.isfinite(loss_g) & torch.isfinite(loss_a)
            ok = ctx.active & finite
            self._fail_non_finite(ctx, ok, loss_g, loss_a)
            deltas = self.tuner.step(probe, loss, ok, float(self.params["lr"]))
        tau = float(self.params["tau"])
        base = ctx.process(ctx.logits)  # (B, V) log p_θ after temperature / penalty
        mixed = tau * ctx.process(self.tuner.tuned_logits(ctx, deltas)) + (1.0 - tau) * base
        mixed = self.adjust(ctx, mixed)
        self._records.append((loss_g.detach(), loss_a.detach(), chose_g))
        return torch.where(ok.unsqueeze(-1), mixed, base)

    def adjust(self, ctx: StepContext, mixed: torch.Tensor) -> torch.Tensor:
        """Hook for eLIDAO: change the mixed (B, V) log-probs before sampling."""
        return mixed

    def _fail_non_finite(
        self, ctx: StepContext, ok: torch.Tensor, loss_g: torch.Tensor, loss_a: torch.Tensor
    ) -> None:
        bad = ctx.active & ~ok
        if not bool(bad.any()):  # the one host sync of a step
            return
        for row in torch.nonzero(bad).flatten().tolist():
            ctx.fail(
                row,
                f"{self.name}: non-finite bias-tuning loss at step {ctx.step} "
                f"(loss_g={float(loss_g[row].detach())}, loss_a={float(loss_a[row].detach())})",
            )

    def after_token(self, ctx: StepContext, tokens: torch.Tensor) -> None:
        # After sampling, ctx.active is off for rows that stopped (EOS) or failed this step.
        emitted = ctx.active.clone()
        embeds = self.geometry.embed[tokens].float()  # (B, D)
        self._gen_sum = self._gen_sum + embeds * emitted.unsqueeze(-1)
        self._gen_zero = False
        self._emitted.append(emitted)

    # ---- outputs ------------------------------------------------------------------------------

    def row_columns(self, row: int) -> dict[str, Any]:
        if self._columns is None:
            self._columns = self._collect()
        return self._columns[row] if row < len(self._columns) else {}

    def _collect(self) -> list[dict[str, Any]]:
        """Per-row lists aligned with the generated tokens (one host transfer per batch)."""
        steps = min(len(self._records), len(self._emitted))
        batch = self._gen_sum.shape[0]
        if steps == 0:
            return [{"loss_g": [], "loss_a": [], "choices": None} for _ in range(batch)]
        emitted = torch.stack(self._emitted[:steps]).cpu()  # (S, B)
        records = self._records[:steps]
        loss_g = torch.stack([r[0] for r in records]).float().cpu()
        loss_a = torch.stack([r[1] for r in records]).float().cpu()
        chose = None if records[0][2] is None else torch.stack([r[2] for r in records]).cpu()
        columns = []
        for b in range(batch):
            idx = torch.nonzero(emitted[:, b]).flatten()
            choices = None if chose is None else chose[idx, b].tolist()
            columns.append(
                {
                    "loss_g": loss_g[idx, b].tolist(),
                    "loss_a": loss_a[idx, b].tolist(),
                    "choices": None if choices is None else ["g" if c else "a" for c in choices],
                }
            )
        return columns


class Uddia(BiasTunedMethod):
    """UDDIA's intended loss ℓ̂_g + λ ℓ̂_a, the ℓ̂_a term only where the Hellinger gate fires.

    The gate's B_a weights tokens by `prior` (a token-counts file), uniform without one; `redo`
    regenerates high-perplexity rows with fewer tuned blocks (`workers.methods.uddia_ref`).
    """

    name = "uddia"

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        from workers.methods.uddia_ref import gendered_distributions, load_prior

        super().__init__(lm, params, task)
        self._prior_info: dict[str, Any] = {"prior": "uniform"}
        prior = None
        if self.params.get("prior") is not None:
            prior, self._prior_info = load_prior(str(self.params["prior"]), lm)
        self.gendered = gendered_distributions(self.geometry, prior)
        self._redo: dict[int, Uddia] = {}

    def objective(
        self, loss_g: torch.Tensor, loss_a: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        gate = hellinger_gate(self.geometry, probs, gendered=self.gendered).to(loss_a.dtype)
        return loss_g + float(self.params["lam"]) * gate * loss_a, None

    def effective_params(self) -> dict[str, Any]:
        return {**self.params, **self._prior_info}

    def redo_rows(
        self, jobs: Sequence[JobSpec], rows: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """With `redo: true`, generate high-perplexity rows again with fewer tuned blocks."""
        if not self.params["redo"]:
            return rows
        from workers.decoding import decode_batch
        from workers.methods.uddia_ref import redo_rows

        def retry(blocks: int, subset: Sequence[JobSpec]) -> list[dict[str, Any]]:
            if blocks not in self._redo:
                params = {**self.params, "blocks": blocks, "redo": False}
                self._redo[blocks] = Uddia(self.lm, params, self.task)
            return decode_batch(self.lm, self._redo[blocks], subset)

        return redo_rows(self.lm, jobs, rows, int(self.params["blocks"]), retry)


class LidaoMin(BiasTunedMethod):
    """LIDAO-min: descend min(ℓ̂_g / w_g, ℓ̂_a / w_a), recording which term was chosen."""

    name = "lidao-min"

    def _reset(self, batch: int) -> None:
        super()._reset(batch)
        self.history = DiscountedHistory(float(self.params["gamma"]), batch, self.lm.device)

    def objective(
        self, loss_g: torch.Tensor, loss_a: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        loss, chose_g = min_objective(loss_g, loss_a, self.history.weights())
        self.history.push(loss_g, loss_a)
        return loss, chose_g


class LidaoProd(BiasTunedMethod):
    """LIDAO-prod: descend ℓ̂_g · ℓ̂_a (each loss weighted by the other's size)."""

    name = "lidao-prod"

    def objective(
        self, loss_g: torch.Tensor, loss_a: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return loss_g * loss_a, None

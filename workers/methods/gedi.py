"""GeDi (Krause et al., Findings of EMNLP 2021): Bayes-rule reweighting with a class-conditional LM.

A GeDi model is a GPT-2 LM trained with a class code as the first token (`clean` / `dirty` for
the detoxifier, `positive` / `negative` for sentiment). Running it behind both codes gives, for
every candidate next token v, the class posterior by Bayes' rule with length-normalised
log-likelihoods (facts of the reference salesforce/GeDi, modeling_utils.py):

    L_c(v) = (Σ_{i≤t} log p(x_i | c, x_<i) + log p(v | c, x)) / (t + 1)   over prompt + generated
    log P(desired | x, v) = log_softmax_c(logit_scale · L_c(v) + bias_c + class_bias·[c = desired])

and θ's scores become `z(v) + disc_weight · log P(desired | x, v)`. Then the tokens least likely
desirable whose cumulative probability (from that end) stays below `filter_p` are removed
(cut as the sampler cuts: `gedi_filter`) unless P(desired | v) ≥ target_p (`target_p` is shifted by `class_bias` on the logit scale, as
the reference does for its detoxifier). Defaults are the reference's: disc_weight 30, filter_p
0.8, target_p 0.8, class_bias 2 for toxicity and 0 otherwise. `logit_scale` and the class
`bias` are parameters of the GeDi checkpoint (config `logit_scale`, `nbias`) that plain
transformers does not load: they are read from its weights file.

Differences from the reference: the repetition penalty and temperature are the loop's `process`
applied to the final scores (the reference shifts its scores to a maximum of 10 first and
divides every penalised score, negative ones included); θ's raw logits stand in for their
log-softmax (same distribution, and exactly vanilla when `disc_weight: 0, filter_p: 0`); the
filter spares the tokens within `CUT_TOL` nats of the cut's desirability, ties included, so
rounding never decides it (the reference breaks ties by its sort).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from jobs.spec import JobSpec
from workers.hub import snapshot
from workers.methods.base import DecodingMethod, MethodError, Needs, StepContext
from workers.methods.checks import facts_of, gedi_codes, method_problems, raise_problems
from workers.methods.experts import Follower, load_extra_lm
from workers.sampler import CUT_TOL, cut_value
from workers.tiny import TINY_PREFIX

if TYPE_CHECKING:
    from workers.models import LoadedLM

TASK_CLASS_BIAS = {"toxicity": 2.0}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def _checkpoint_tensors(spec: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The named tensors present in a checkpoint's (single) weights file, in a local folder
    or the hub cache."""
    if spec.startswith(TINY_PREFIX):
        return {}
    folder = Path(spec) if os.path.isdir(spec) else snapshot(spec, None)
    found = [folder / name for name in WEIGHT_FILES if folder and (folder / name).is_file()]
    if not found:
        return {}
    path = str(found[0])
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as fh:
            return {k: fh.get_tensor(k) for k in names if k in fh.keys()}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {k: state[k] for k in names if k in state}


def class_head(extra: LoadedLM) -> tuple[float, torch.Tensor]:
    """(logit_scale, (2,) class bias) of a GeDi checkpoint; (1, 0) for a plain class-conditional LM."""
    cfg = extra.model.config
    wants_scale, nbias = (
        bool(getattr(cfg, "logit_scale", False)),
        int(getattr(cfg, "nbias", 0) or 0),
    )
    tensors = _checkpoint_tensors(extra.ref.id, ("logit_scale", "bias"))
    if (wants_scale and "logit_scale" not in tensors) or (nbias and "bias" not in tensors):
        raise MethodError(
            f"gedi_model {extra.ref.id!r}: its config declares logit_scale / nbias but the weights "
            f"file has {sorted(tensors) or 'neither'}"
        )
    scale = float(tensors["logit_scale"].flatten()[0]) if "logit_scale" in tensors else 1.0
    bias = tensors["bias"].flatten().float() if "bias" in tensors else torch.zeros(2)
    if bias.numel() != 2:
        raise MethodError(
            f"gedi_model {extra.ref.id!r}: class bias has {bias.numel()} entries, expected 2"
        )
    return scale, bias


def desired_logprob(
    lp: torch.Tensor,
    prior: torch.Tensor,
    n: torch.Tensor,
    scale: float,
    bias: torch.Tensor,
    class_bias: float,
) -> torch.Tensor:
    """(B, V) log P(desired | x, v) from (2, B, V) GeDi log-probs, (2, B) prior sums and (B,) counts."""
    length = (n + 1).float().view(1, -1, 1)
    cls = scale * (prior.unsqueeze(-1) + lp) / length  # (2, B, V)
    cls = cls + bias.to(cls.device).view(2, 1, 1)
    cls[0] += class_bias
    return torch.log_softmax(cls, 0)[0]


def gedi_filter(
    scores: torch.Tensor, logp_desired: torch.Tensor, filter_p: float, target_p: float
) -> torch.Tensor:
    """Remove (−10000, as the reference) the least desirable tokens holding < filter_p of the mass.

    The cut is the sampler's (`workers.sampler.cut_value`, docs/design.md, "Jobs and identity"):
    a token is dropped when its desirability lies more than `CUT_TOL` nats below that of the
    token at which the mass from the least desirable end reaches `filter_p`, and below log
    `target_p`; tokens apart by rounding only fall on the same side in any batch.
    """
    d, order = torch.sort(logp_desired, dim=-1)
    floor = cut_value(d, torch.softmax(scores, -1).gather(-1, order), filter_p) - CUT_TOL
    drop = (logp_desired < floor) & (logp_desired < math.log(target_p))
    return scores - 10000.0 * drop.to(scores.dtype)


class GeDi(DecodingMethod):
    """GeDi-guided decoding (see the module docstring)."""

    name: ClassVar[str] = "gedi"
    needs: ClassVar[Needs] = Needs(extra_models=("gedi_model",))

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        super().__init__(lm, params, task)  # checks the codes for the task (`method_problems`)
        self.codes = gedi_codes(params, task)
        bias = params.get("class_bias")
        self.class_bias = float(TASK_CLASS_BIAS.get(task, 0.0) if bias is None else bias)
        self.disc_weight = float(params.get("disc_weight", 30.0))
        self.filter_p = float(params.get("filter_p", 0.8))
        self.target_p = float(params.get("target_p", 0.8))
        if not (0.0 <= self.filter_p <= 1.0 and 0.0 < self.target_p <= 1.0):
            raise MethodError(
                f"method gedi: need 0 <= filter_p <= 1 and 0 < target_p <= 1, got {params}"
            )
        self.gedi = load_extra_lm(lm, params.get("gedi_model"), "gedi_model", "gedi")
        extras = {"gedi_model": facts_of(self.gedi)}  # its codes are one token each
        raise_problems(
            self.name, method_problems(self.name, params, task, None, extras), MethodError
        )
        self.scale, self.bias = class_head(self.gedi)
        self.stream = Follower(self.gedi, [self._code_id(c) for c in self.codes])
        self._prior: torch.Tensor | None = None  # (2, B) log-likelihood sums so far
        self._n: torch.Tensor | None = None  # (B,) tokens in those sums
        self._lp: torch.Tensor | None = None  # (2, B, V) GeDi log-probs of the current step

    def _code_id(self, code: str) -> int:
        return int(self.gedi.tokenizer(code, add_special_tokens=False)["input_ids"][0])

    @property
    def effective_target_p(self) -> float:
        """target_p moved by class_bias on the logit scale (the reference's detoxifier rule)."""
        p = self.target_p
        if 0.0 < p < 1.0 and self.class_bias != 0.0:
            return 1.0 / (1.0 + math.exp(-(math.log(p / (1 - p)) + self.class_bias)))
        return p

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        self.stream.reset()
        self._prior = self._n = self._lp = None

    def end(self) -> None:
        self.begin([], [])

    def _step_logprobs(self, ctx: StepContext) -> torch.Tensor:
        """(2, B, V) GeDi log-probs of the next token; on the first step also sets the prompt sums."""
        B = ctx.input_ids.shape[0]
        first = self._prior is None
        logits = self.stream.feed(ctx, all_logits=first)  # (2B, n, V)
        lp_all = torch.log_softmax(logits, -1)
        if first:  # position j predicts column j of the prompt (column 0 is the code)
            targets = ctx.input_ids.repeat(2, 1).unsqueeze(-1)  # (2B, T, 1)
            got = lp_all[:, :-1].gather(-1, targets).squeeze(-1) * ctx.attention_mask.repeat(2, 1)
            self._prior = got.sum(-1).view(2, B)
            self._n = ctx.attention_mask.sum(-1)
        return lp_all[:, -1].view(2, B, -1)

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        lp = self._step_logprobs(ctx)
        assert self._prior is not None and self._n is not None
        self._lp = lp
        logp_desired = desired_logprob(
            lp, self._prior, self._n, self.scale, self.bias, self.class_bias
        )
        scores = ctx.logits + self.disc_weight * logp_desired
        if self.filter_p > 0.0:
            scores = gedi_filter(scores, logp_desired, self.filter_p, self.effective_target_p)
        return ctx.process(scores)

    def after_token(self, ctx: StepContext, tokens: torch.Tensor) -> None:
        assert self._lp is not None and self._prior is not None and self._n is not None
        idx = tokens.view(1, -1, 1).expand(2, -1, 1)
        self._prior = self._prior + self._lp.gather(-1, idx).squeeze(-1)
        self._n = self._n + 1

    def effective_params(self) -> dict[str, Any]:
        return {
            "gedi_model": self.gedi.ref.id,
            "code_desired": self.codes[0],
            "code_undesired": self.codes[1],
            "disc_weight": self.disc_weight,
            "filter_p": self.filter_p,
            "target_p": self.target_p,
            "target_p_effective": self.effective_target_p,
            "class_bias": self.class_bias,
            "logit_scale": self.scale,
            "class_bias_learned": self.bias.tolist(),
        }

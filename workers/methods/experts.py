"""Extra LMs that run beside θ on the same tokens: DExperts' experts, GeDi's class-conditional LM.

`load_extra_lm` loads one once per method instance (same dtype and device as θ) and refuses it
when its tokenizer differs from θ's: logit arithmetic and Bayes-rule reweighting compare
next-token scores id by id. `Follower` keeps its KV cache in step with the decoding loop: it
feeds whatever columns of `ctx.input_ids` it has not seen, with the loop's attention mask, so
finished rows and left padding need no special case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from jobs.spec import ModelRef
from workers.methods.base import MethodError, StepContext
from workers.methods.checks import facts_of, same_tokenizer

if TYPE_CHECKING:
    from workers.models import LoadedLM


def load_extra_lm(base: LoadedLM, spec: Any, param: str, method: str) -> LoadedLM:
    """Load the extra model named by parameter `param` (a hub id or local path) like θ.

    Raises:
        MethodError: the parameter is missing, the model cannot be loaded, or its tokenizer (or
            its vocabulary) differs from θ's.
    """
    from workers.models import load_lm

    if not isinstance(spec, str) or not spec.strip():
        raise MethodError(
            f"method {method}: parameter `{param}` is required (a hub id or local path of the model); got {spec!r}"
        )
    try:
        extra = load_lm(
            ModelRef(spec, None, base.ref.dtype), device=str(base.device), words=base.words
        )
    except (OSError, ValueError) as exc:
        raise MethodError(f"method {method}: {param} {spec!r}: cannot load: {exc}") from exc
    what = f"{method} {param}"
    problem = same_tokenizer(facts_of(base), facts_of(extra), what)  # as `validate` does
    if problem:
        raise MethodError(problem)
    va = base.model.get_output_embeddings().weight.shape[0]
    vb = extra.model.get_output_embeddings().weight.shape[0]
    if va != vb:
        raise MethodError(
            f"{what} {extra.ref.id!r} scores {vb} token ids, model {base.ref.id!r} scores {va}"
        )
    return extra


class Follower:
    """An extra LM fed the loop's tokens, optionally behind one prefix token per copy of the batch.

    With `prefixes = [c0, c1]` it runs 2B rows: rows `k·B + i` see `c_k` right before the first
    real token of prompt i (GeDi's class codes). Without prefixes it runs the B rows as they are.
    """

    def __init__(self, lm: LoadedLM, prefixes: list[int] | None = None) -> None:
        self.lm = lm
        self.prefixes = prefixes
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None
        self.seen = 0  # columns of ctx.input_ids fed so far
        self.mask: torch.Tensor | None = None  # (R, T') our attention mask
        self.last_pos: torch.Tensor | None = None  # (R, 1)

    def _copies(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(len(self.prefixes), 1) if self.prefixes else x

    def _prefill_inputs(self, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = ctx.input_ids, ctx.attention_mask
        if not self.prefixes:
            return ids, mask
        B = ids.shape[0]
        first = (mask.cumsum(-1) == 0).sum(-1, keepdim=True)  # (B, 1) pads before the prompt
        pad_col = torch.zeros((B, 1), dtype=ids.dtype, device=ids.device)
        ids1, mask1 = torch.cat([pad_col, ids], 1), torch.cat([pad_col.to(mask.dtype), mask], 1)
        rows_ids, rows_mask = [], []
        for code in self.prefixes:  # the code sits right before the first real token
            rows_ids.append(ids1.scatter(1, first, torch.full_like(first, code)))
            rows_mask.append(mask1.scatter(1, first, torch.ones_like(first, dtype=mask.dtype)))
        return torch.cat(rows_ids, 0), torch.cat(rows_mask, 0)

    def feed(self, ctx: StepContext, all_logits: bool = False) -> torch.Tensor:
        """(R, n, V) float32 logits of the newly fed positions (n = 1 unless `all_logits`)."""
        T = ctx.input_ids.shape[1]
        if self.cache is None:
            ids, mask = self._prefill_inputs(ctx)
            pos = (mask.cumsum(-1) - 1).clamp_min(0)
        else:
            assert self.mask is not None and self.last_pos is not None
            ids = self._copies(ctx.input_ids[:, self.seen :])
            mask = torch.cat([self.mask, self._copies(ctx.attention_mask[:, self.seen :])], 1)
            pos = self.last_pos + torch.arange(1, ids.shape[1] + 1, device=ids.device)
        if ids.shape[1] == 0:
            raise MethodError(f"{self.lm.ref.id}: no new tokens to feed at step {ctx.step}")
        with torch.no_grad():
            out = self.lm.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
            )
        self.cache, self.seen, self.mask, self.last_pos = out.past_key_values, T, mask, pos[:, -1:]
        return out.logits.float()  # type: ignore[no-any-return]

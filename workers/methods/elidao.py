"""eLIDAO: LIDAO plus an instruction-prefixed reference stream for the seed-word tokens.

The reference is the same frozen LM fed `instruction(#GENDER#) + prompt + generated tokens`
with its own KV cache. For every token of V_a (vocabulary ids that decode exactly to a seed
word, with or without a leading space) the mixed log-probability is replaced by the
reference's before sampling. `#GENDER#` is the prompt's majority group; a prompt without a
majority falls back to plain LIDAO, and the row records it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from jobs.spec import JobSpec
from jobs.words import GroupWords, label_text
from workers.decoding import left_padded, max_context
from workers.methods.base import MethodError, StepContext
from workers.methods.biastune import kv_cache
from workers.methods.checks import instruction_problem, template_text
from workers.methods.lidao import BiasTunedMethod, LidaoMin, LidaoProd
from workers.models import LoadedLM


def instruction_template(family: str, choice: str | None) -> str:
    """The template text: by family (Falcon → instruct), a named one, or a custom string."""
    problem = instruction_problem(choice)  # as `validate` checks it
    if problem:
        raise MethodError(f"eLIDAO: instruction {problem}")
    return template_text(family, choice)


def seed_token_ids(tokenizer: Any, words: GroupWords) -> list[int]:
    """V_a: ids of single tokens that decode exactly to a seed word, with or without a space."""
    found: set[int] = set()
    for word in sorted(words.all_words()):
        for text in (word, " " + word):
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if len(ids) == 1 and tokenizer.decode(ids) in (word, " " + word):
                found.add(int(ids[0]))
    return sorted(found)


class ReferenceStream:
    """θ fed the instruction + prompt + generated tokens: one no-grad forward per token. The
    instruction's K/V are computed once per gender and kept (`_instruction_kv`); a batch's rows
    are laid out as [instruction | padding | prompt] (docs/design.md, "eLIDAO").
    """

    def __init__(self, lm: LoadedLM, template: str) -> None:
        self.lm = lm
        self.template = template
        self.genders: list[str | None] = []
        self.too_long: dict[int, str] = {}
        self.logits: torch.Tensor | None = None  # (B, V) float32 next-token logits
        self._prefix_kv: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.prefill_positions = 0  # positions the last `start` pushed through the model
        self._cache: Any = None  # the stream's DynamicCache

    def release(self) -> None:
        """Drop the batch's cache, logits and masks (the instruction K/V per gender stay)."""
        self.logits = self._cache = None
        empty = torch.zeros((0, 0), dtype=torch.long, device=self.lm.device)
        self._mask, self._pos = empty, empty
        self.use = torch.zeros(0, dtype=torch.bool, device=self.lm.device)

    def start(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        """Choose #GENDER# per row and prefill the instruction-prefixed prompts."""
        tok = self.lm.tokenizer
        self.too_long = {}  # rows whose prefixed prompt does not fit: they fail
        self.genders = [
            None if (g := label_text(j.prompt, self.lm.words)) == "none" else g for j in jobs
        ]
        self.use = torch.tensor([g is not None for g in self.genders], device=self.lm.device)
        self.logits = self._cache = None
        self.prefill_positions = 0
        if not any(self.genders):
            return  # every row falls back: no reference forwards at all
        limit, steps = max_context(self.lm), max(j.generation.max_new_tokens for j in jobs)
        heads: list[list[int]] = []  # BOS + instruction (empty for rows that fall back)
        bodies: list[list[int]] = []  # the prompt without its BOS
        for i, (gender, ids) in enumerate(zip(self.genders, prompt_ids)):
            head: list[int] = []
            if ids and tok.bos_token_id is not None and ids[0] == tok.bos_token_id:
                head, ids = [ids[0]], ids[1:]  # keep a BOS the tokenizer adds in front
            text = self.template.replace("#GENDER#", gender) if gender else ""
            prefix = list(tok(text, add_special_tokens=False)["input_ids"])
            if (
                gender is not None
                and limit is not None
                and len(head + prefix + ids) + steps > limit
            ):
                self.too_long[i] = (
                    f"eLIDAO: instruction ({len(prefix)} tokens) + prompt ({len(head) + len(ids)} "
                    f"tokens) + max_new_tokens {steps} exceed the model's context of {limit}"
                )
                self.genders[i] = None
                heads.append([])
                bodies.append((head + list(ids))[: max(1, limit - steps)])  # a stand-in; it fails
                continue
            heads.append(head + prefix if gender is not None else [])
            bodies.append(list(ids) if gender is not None else head + list(ids))
        self.use = torch.tensor([g is not None for g in self.genders], device=self.lm.device)
        if any(heads) and any(bodies):
            self._prefill_after_instructions(heads, bodies)
        else:  # no instruction left (every row too long), or nothing after them: one prefill
            self._prefill([h + b for h, b in zip(heads, bodies)])

    def _prefill(self, rows: list[list[int]]) -> None:
        ids, self._mask = left_padded(self.lm, rows)
        self._pos = (self._mask.cumsum(-1) - 1).clamp_min(0)
        self.prefill_positions += ids.numel()
        self._forward(ids, self._pos)

    def _prefill_after_instructions(self, heads: list[list[int]], bodies: list[list[int]]) -> None:
        """[instruction | padding | prompt] rows: the instructions' K/V from `_instruction_kv`,
        then one forward of the left-padded prompts over them."""
        width = max(len(h) for h in heads)
        cached = [self._instruction_kv(h) if h else None for h in heads]
        template = next((c for c in cached if c), None)
        if template is None or any(h and not c for h, c in zip(heads, cached)):
            self._prefill([h + b for h, b in zip(heads, bodies)])  # a cache we cannot lay out
            return
        layers = []
        for index, (keys, values) in enumerate(template):
            k = keys.new_zeros((len(heads), keys.shape[1], width, keys.shape[3]))
            v = values.new_zeros((len(heads), values.shape[1], width, values.shape[3]))
            for row, kv in enumerate(cached):
                if kv is not None:
                    n = kv[index][0].shape[2]
                    k[row, :, :n], v[row, :, :n] = kv[index][0][0], kv[index][1][0]
            layers.append((k, v))
        lengths = torch.tensor([len(h) for h in heads], device=self.lm.device)
        head_mask = (torch.arange(width, device=self.lm.device) < lengths[:, None]).long()
        ids, body_mask = left_padded(self.lm, bodies)
        self._mask = torch.cat([head_mask, body_mask], dim=-1)
        positions = (self._mask.cumsum(-1) - 1).clamp_min(0)
        self._cache = kv_cache(layers)
        self.prefill_positions += ids.numel()
        self._forward(ids, positions[:, width:])
        self._pos = positions[:, -1:]

    def _instruction_kv(self, head: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(1, H, n, d) keys and values per layer of θ over `head` alone (kept per head); empty
        when the model's cache is not made of full-attention `DynamicLayer`s (sliding windows
        and other layouts are not copied column by column)."""
        key = tuple(head)
        if key not in self._prefix_kv:
            ids = torch.tensor([head], device=self.lm.device)
            with torch.no_grad():
                out = self.lm.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            layers = getattr(out.past_key_values, "layers", None) or []
            plain = bool(layers) and all(type(x) is DynamicLayer for x in layers)
            self._prefix_kv[key] = [(x.keys, x.values) for x in layers] if plain else []
            self.prefill_positions += len(head)
        return self._prefix_kv[key]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> None:
        with torch.no_grad():
            out = self.lm.model(
                input_ids=ids,
                attention_mask=self._mask,
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self._cache, self.logits = out.past_key_values, out.logits[:, -1].float()

    def advance(self, tokens: torch.Tensor, needed: bool) -> None:
        """Feed the (B,) sampled tokens; skipped (no forward) when no row will need it."""
        if self.logits is None or not needed:
            return
        self._mask = torch.cat([self._mask, torch.ones_like(self._mask[:, :1])], dim=-1)
        self._pos = self._pos[:, -1:] + 1
        self._forward(tokens.unsqueeze(-1), self._pos)


class ElidaoMixin(BiasTunedMethod):
    """Adds the reference stream and the V_a replacement to a LIDAO variant."""

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        super().__init__(lm, params, task)
        template = instruction_template(lm.family, self.params["instruction"])
        self.stream = ReferenceStream(lm, template)
        ids = seed_token_ids(lm.tokenizer, lm.words)
        self.seed_ids = torch.tensor(ids, dtype=torch.long, device=lm.device)

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        super().begin(jobs, prompt_ids)
        self._max_steps = max(j.generation.max_new_tokens for j in jobs)
        self.stream.start(jobs, prompt_ids)

    def end(self) -> None:
        super().end()
        self.stream.release()

    def adjust(self, ctx: StepContext, mixed: torch.Tensor) -> torch.Tensor:
        for row, message in self.stream.too_long.items():
            ctx.fail(row, message)
        if self.stream.logits is None or self.seed_ids.numel() == 0:
            return mixed
        ref = ctx.process(self.stream.logits)[:, self.seed_ids]  # (B, |V_a|) log p_ref
        use = self.stream.use.unsqueeze(-1)
        out = mixed.clone()
        out[:, self.seed_ids] = torch.where(use, ref, mixed[:, self.seed_ids])
        return out

    def after_token(self, ctx: StepContext, tokens: torch.Tensor) -> None:
        super().after_token(ctx, tokens)
        needed = ctx.step + 1 < self._max_steps and bool((ctx.active & self.stream.use).any())
        self.stream.advance(tokens, needed)

    def row_columns(self, row: int) -> dict[str, Any]:
        columns = dict(super().row_columns(row))
        gender = self.stream.genders[row] if row < len(self.stream.genders) else None
        columns.update(elidao_fallback=gender is None, elidao_gender=gender)
        return columns


class ElidaoMin(ElidaoMixin, LidaoMin):
    """eLIDAO on LIDAO-min."""

    name = "elidao-min"


class ElidaoProd(ElidaoMixin, LidaoProd):
    """eLIDAO on LIDAO-prod."""

    name = "elidao-prod"

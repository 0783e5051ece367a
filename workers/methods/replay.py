"""What θ's own forwards of a batch leave for the bias-tuning probe, instead of recomputing it
(docs/design.md, "Bias tuning"): `ThetaGraph` (`last` scope of a float32 model: θ's forward
through zero offsets that require grad) and `LinearRecord` (`context` scope of a float32 model:
the tuned linear layers' outputs, replayed through `_Replay` in the probe's re-run).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from workers.methods.base import MethodError
from workers.methods.biastune import TuneSites, bias_offsets, swapped


class _Replay(torch.autograd.Function):
    """A linear layer's output over the context from θ's forwards (`out`), with the derivative
    of `x Wᵀ + b` (GPT-2's Conv1D: `x W + b`) w.r.t. its input: no forward product.

    Valid at δ = 0, where every input of a tuned linear layer is θ's: the value is the one θ's
    own forward computed for those positions.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, out: torch.Tensor, weight: torch.Tensor, transposed: bool
    ) -> Any:
        ctx.save_for_backward(weight)
        ctx.transposed = transposed
        return out.clone()  # the model may modify it in place (Falcon adds to its MLP output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return (grad @ weight.T if ctx.transposed else grad @ weight), None, None, None


def replayable(module: nn.Module) -> bool:
    """A tuned site whose output `_Replay` can stand for: a float32 nn.Linear or GPT-2 Conv1D
    with a plain weight, and no instance `forward` (accelerate's device wrappers)."""
    linear = isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
    weight = getattr(module, "weight", None)
    return (
        linear
        and weight is not None
        and type(weight) in (nn.Parameter, torch.Tensor)
        and weight.dtype == torch.float32
        and weight.ndim == 2
        and "forward" not in vars(module)
    )


class ThetaGraph:
    """`last` scope of a float32 model: the shared loop's forwards of θ through zero offsets
    that require grad, so the probe differentiates θ's own forward of the new position (why a
    forward's graph serves its step only: docs/design.md, "Bias tuning").
    """

    def __init__(self, model: nn.Module, sites: TuneSites, head: nn.Module, first: int) -> None:
        self.model, self.sites, self.head, self.first = model, sites, head, first
        self.begin(None)

    def begin(self, zeros: list[torch.Tensor] | None) -> None:
        """Forget the last batch's forwards; `zeros`: the offsets (leaves) for the next one."""
        # the offsets, the last forward's final-norm output and last hidden state at the last
        # position (with their graph), the positions the forwards covered and the loop's cache
        self.zeros = zeros
        self.final: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.fired: set[str] = set()
        self.positions = 0
        self.cache: Any = None

    def covers(self, batch: int) -> bool:
        """Whether the offsets were made for `batch` rows."""
        return self.zeros is not None and self.zeros[0].shape[0] == batch

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Around one forward of θ over the rows `zeros` was made for."""
        self._detach_cache()
        self.final = self.hidden = None
        if self.positions == 0:
            with torch.no_grad(), bias_offsets(self.model, self.sites, None) as state:
                yield
            self.positions += state.final_hidden[-1].shape[1]
            return
        seen: list[Any] = []
        # what the output layer reads (the last hidden state; OPT's head is fed by the decoder)
        handle = self.head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        try:
            with torch.enable_grad(), bias_offsets(self.model, self.sites, self.zeros) as state:
                yield
        finally:
            handle.remove()
        final = state.final_hidden[-1]  # (B, T_new, D) final norm outputs
        self.final, self.hidden = final[:, -1], seen[-1][:, -1]
        self.fired = state.fired
        self.positions += final.shape[1]

    def _detach_cache(self) -> None:
        """The K/V of earlier forwards become constants of θ (no graph kept)."""
        if self.cache is not None:
            for layer in self.cache.layers[self.first :]:
                layer.keys, layer.values = layer.keys.detach(), layer.values.detach()


class LinearRecord:
    """`context` scope of a float32 model: the outputs of the tuned linear layers (`points`)
    recorded in θ's forwards of a batch, replayed in the probe's re-run of the context."""

    def __init__(self, points: list[Any]) -> None:
        self.points = points
        self.begin(None)

    def begin(self, batch: int | None) -> None:
        """Forget the record; with `batch` (rows), θ's forwards of that batch are recorded."""
        # (B, T, width) outputs of the `points` from θ's forwards of every position so far, or
        # None (not recorded for this batch)
        self.out: list[torch.Tensor] | None = [] if batch and self.points else None
        self.rows = batch or 0

    def covers(self, batch: int) -> bool:
        """Whether θ's forwards of `batch` rows are being recorded."""
        return self.out is not None and self.rows == batch

    @contextmanager
    def recording(self, batch: int) -> Iterator[None]:
        """`context` scope: keep the outputs of the tuned linear layers of θ's forward, grown by
        its positions (`out`). Anything unexpected (a layer that did not run once, a
        shape that is not batch-major) turns the replay off for the batch."""
        seen: list[list[torch.Tensor]] = [[] for _ in self.points]

        def keeper(store: list[torch.Tensor]) -> Any:
            # a copy, taken now: the model may add to a layer's output in place (Falcon's MLP)
            return lambda module, args, output: store.append(output.detach().clone())

        handles = [
            p.module.register_forward_hook(keeper(store)) for p, store in zip(self.points, seen)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        ok = all(
            len(store) == 1 and store[0].shape[-1] == p.width and store[0].shape[0] % batch == 0
            for p, store in zip(self.points, seen)
        )
        points = zip(self.points, seen)
        new = [store[0].reshape(batch, -1, p.width) for p, store in points] if ok else []
        if not new or len({x.shape[1] for x in new}) != 1:
            self.out = None
            return
        before = self.out
        self.out = [torch.cat(x, dim=1) for x in zip(before, new)] if before else new

    @contextmanager
    def replaying(self, batch: int, positions: int) -> Iterator[bool]:
        """Inside: the tuned linear layers return θ's recorded outputs over `positions` through
        `_Replay` instead of computing them (yields False, changing nothing, when the record
        does not cover exactly those rows and positions)."""
        outs = self.out
        if not outs or outs[0].shape[:2] != (batch, positions):
            yield False
            return
        replays = [
            (vars(p.module), "forward", self._forward(p, out)) for p, out in zip(self.points, outs)
        ]
        with swapped(replays):
            yield True

    @staticmethod
    def _forward(point: Any, out: torch.Tensor) -> Any:
        weight = point.module.weight
        transposed = not isinstance(point.module, nn.Linear)  # Conv1D stores (in, out)

        def forward(*args: Any, **kwargs: Any) -> Any:
            x = args[0] if args else next(iter(kwargs.values()))
            if x.shape[:-1].numel() != out.shape[:-1].numel():
                raise MethodError(
                    f"bias tuning: {point.name} got {tuple(x.shape)} in the context re-run, "
                    f"θ's recorded output is {tuple(out.shape)}"
                )
            return _Replay.apply(x, out.reshape(*x.shape[:-1], out.shape[-1]), weight, transposed)

        return forward

"""Host synchronisations per decoding step, counted on the CPU.

On a GPU every read of a device value by Python (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`,
`nonzero`, a boolean-mask index) waits for the queue to drain. The loop promises one
device → host transfer per step (plus a second when a row's nucleus outgrows the top 256
candidates), and LIDAO / eLIDAO one check each; a per-row read would add one per sequence. A
`TorchFunctionMode` sees those calls on a CPU as well, so the count is tested here.

A read counts when the Python frame that makes it (the innermost frame outside torch's own
package) is in this repository's packages: reads made by transformers (its mask code reads
the padding mask once per forward) are not this project's, wherever the virtual environment
lies (inside the checkout, as `scripts/setup.sh` makes it, or elsewhere). The property tested
is the one that matters on a GPU: the reads per step do not grow with the batch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from jobs.spec import GenerationParams, JobSpec, ModelRef
from tests.helpers import make_jobs
from workers.decoding import decode_batch
from workers.methods.registry import load_method, resolve_params
from workers.models import load_lm

REPO = Path(__file__).resolve().parents[1]
PACKAGES = tuple(str(REPO / p) + "/" for p in ("workers", "jobs", "results", "harness"))
TORCH = str(Path(torch.__file__).resolve().parent) + "/"
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
SHAPED = {"nonzero", "masked_select", "unique", "argwhere"}  # output size read from the device


def reader(frame: Any) -> str:
    """The file of the innermost frame outside torch's package, from `frame` outwards."""
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(TORCH):
        frame = frame.f_back
    return "" if frame is None else str(Path(frame.f_code.co_filename).resolve())


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host, made by this project's code."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.sites: dict[str, int] = {}

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        hit = name in READS or name in SHAPED
        if name == "__getitem__" and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            hit = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        if hit:
            caller = sys._getframe(1)
            path = reader(caller)
            if path.startswith(PACKAGES):
                self.count += 1
                while str(Path(caller.f_code.co_filename).resolve()) != path:
                    caller = caller.f_back
                site = f"{Path(path).name}:{caller.f_lineno} {name}"
                self.sites[site] = self.sites.get(site, 0) + 1
        return func(*args, **(kwargs or {}))


def reads(method: str, batch: int, tokens: int) -> tuple[int, int, dict[str, int]]:
    """(host reads, steps, reads per site) of one batch of `batch` jobs."""
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    params = json.dumps(resolve_params(method, {}, lm.ref.id), sort_keys=True)
    jobs: list[JobSpec] = make_jobs(
        method=method, params=params, n=batch, gen=GenerationParams(max_new_tokens=tokens)
    )
    built = load_method(method)(lm, jobs[0].params(), jobs[0].task)
    steps: list[Any] = []
    counter = HostReads()
    with counter:
        decode_batch(lm, built, jobs, on_step=steps.append)
    return counter.count, len(steps), counter.sites


def per_step(method: str, batch: int) -> tuple[float, dict[str, int]]:
    """Reads per step of a batch: the count's growth from 2 to 6 tokens (per-batch reads,
    such as LIDAO's loss columns read row by row from one host copy, cancel out)."""
    short, steps_short, _ = reads(method, batch, 2)
    long, steps_long, sites = reads(method, batch, 6)
    assert steps_long > steps_short, (steps_short, steps_long)
    return (long - short) / (steps_long - steps_short), sites


# at most, per step: the loop's transfer and its full-sort redo (only on steps where a row's
# nucleus outgrows the candidates); LIDAO's non-finite check; eLIDAO's stream check
PER_STEP = {"vanilla": 2, "lidao-min": 3, "uddia": 3, "elidao-min": 4}


@pytest.mark.parametrize("method", sorted(PER_STEP))
def test_host_reads_per_step_do_not_grow_with_the_batch(method: str) -> None:
    small, _ = per_step(method, 2)
    large, sites = per_step(method, 8)
    # a read per row would add 6 per step from 2 rows to 8; the full-sort redo, whose need
    # depends on the rows' distributions, may add at most one
    assert large <= small + 1, (small, large, sites)
    assert large <= PER_STEP[method], (large, sites)

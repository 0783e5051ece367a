"""Host synchronisations per decoding step, counted on the CPU.

On a GPU every read of a device value by Python (`.item()`, `.tolist()`, `bool(t)`, `.cpu()`,
`nonzero`, a boolean-mask index) waits for the queue to drain. The loop promises one
device → host transfer per step (plus a second when a row's nucleus outgrows the top 256
candidates), and LIDAO / eLIDAO one check each; a per-row read would add one per sequence. A
`TorchFunctionMode` sees those calls on a CPU as well, so the count is tested here (calls from
transformers' own mask code are not this project's and are left out).
"""

from __future__ import annotations

import json
import traceback
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

REPO = str(Path(__file__).resolve().parents[1])
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
SHAPED = {"nonzero", "masked_select", "unique", "argwhere"}  # output size read from the device


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host, made from this repository."""

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
            frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(REPO)]
            ours = [
                f for f in frames if "/.venv/" not in f.filename and "/tests/" not in f.filename
            ]
            caller = frames[-1] if frames else None
            if ours and caller is not None and "/.venv/" not in caller.filename:
                self.count += 1
                site = f"{Path(caller.filename).name}:{caller.lineno} {name}"
                self.sites[site] = self.sites.get(site, 0) + 1
        return func(*args, **(kwargs or {}))


def reads(method: str, tokens: int) -> tuple[int, int, dict[str, int]]:
    """(host reads, steps, reads per site) of one batch of 8 jobs."""
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    params = json.dumps(resolve_params(method, {}, lm.ref.id), sort_keys=True)
    jobs: list[JobSpec] = make_jobs(
        method=method, params=params, gen=GenerationParams(max_new_tokens=tokens)
    )
    built = load_method(method)(lm, jobs[0].params(), jobs[0].task)
    steps: list[Any] = []
    counter = HostReads()
    with counter:
        decode_batch(lm, built, jobs, on_step=steps.append)
    return counter.count, len(steps), counter.sites


# the loop's transfer and its rare full-sort redo; LIDAO's non-finite check; eLIDAO's stream check
PER_STEP = {"vanilla": 2, "lidao-min": 3, "uddia": 3, "elidao-min": 4}


@pytest.mark.parametrize("method", sorted(PER_STEP))
def test_host_reads_per_step_do_not_grow_with_the_batch(method: str) -> None:
    short, steps_short, _ = reads(method, 2)
    long, steps_long, sites = reads(method, 6)
    assert steps_long > steps_short, (steps_short, steps_long)
    per_step = (long - short) / (steps_long - steps_short)
    assert per_step <= PER_STEP[method], (per_step, sites)  # 8 rows: a per-row read adds ≥ 8
    # (per batch, LIDAO's loss columns are read row by row from one host copy: not counted)

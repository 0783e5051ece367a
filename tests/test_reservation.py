"""The autoscaler request a killed driver leaves standing is withdrawn by the next driver on
the same run (Ray-free: the autoscaler SDK and the cluster test are replaced by recorders)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness.stages.generation.ray_runtime as rt
from results.run.store import RunStore


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[dict[str, Any]]]]:
    import ray.autoscaler.sdk as sdk

    made: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(sdk, "request_resources", lambda bundles: made.append(list(bundles)))
    monkeypatch.setattr(rt, "cluster_mode", lambda: True)
    yield made
    rt.unbind_run()


def test_a_request_left_by_a_killed_driver_is_withdrawn_by_the_next_one(
    tmp_path: Path, requests: list[list[dict[str, Any]]]
) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.makedirs()
    rt.bind_run(store)
    assert requests == []  # nothing left over: nothing to withdraw
    rt.request_gpus([1.0, 1.0])
    marker = tmp_path / "run" / rt.REQUEST_MARKER
    assert json.loads(marker.read_text())["bundles"] == [{"GPU": 1.0}, {"GPU": 1.0}]
    # the driver is killed here: the request stands, and so does the record of it
    rt.unbind_run()
    rt.bind_run(RunStore(str(tmp_path / "run")))  # the same command, run again
    assert requests == [[{"GPU": 1.0}, {"GPU": 1.0}], []] and not marker.exists()


def test_a_withdrawn_request_leaves_nothing_to_withdraw(
    tmp_path: Path, requests: list[list[dict[str, Any]]]
) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.makedirs()
    rt.bind_run(store)
    rt.request_gpus([0.5])
    rt.request_gpus([])  # the stage ended
    assert not (tmp_path / "run" / rt.REQUEST_MARKER).exists()
    rt.bind_run(store)
    assert requests == [[{"GPU": 0.5}], []]  # no second withdrawal


def _config(scorers: list[Any], **runtime: Any) -> Any:
    from harness.config import parse_config

    data = {
        "name": "follow",
        "dataset": {"kind": "prompt-list", "path": "p.jsonl"},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "scorers": scorers,
        "runtime": runtime,
    }
    return parse_config(data, "follow.yaml")


def test_while_generation_grows_gpu_scorers_wait_for_the_final_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`score_during_generation: true` with `runtime.gpus` unset: a GPU scorer waiting for a
    share could take a joining node's GPU before generation's new reservation: it scores after
    generation instead (said in a warning); CPU scorers still follow."""
    from harness.stages.scoring.follow import follow_config

    gpu = {"name": "perplexity", "num_gpus": 0.25, "params": {"model": "tiny-random/gpt2"}}
    cfg = _config(["gender", gpu], score_during_generation=True)
    assert follow_config(cfg, growing=False) is cfg
    with caplog.at_level("WARNING", logger="harness"):
        changed = follow_config(cfg, growing=True)
    assert changed.runtime.score_during_generation == "auto" and "perplexity" in caplog.text
    assert cfg.runtime.score_during_generation is True  # the run's config is unchanged
    cpu_only = _config(["gender", {**gpu, "num_gpus": 0}], score_during_generation=True)
    assert follow_config(cpu_only, growing=True) is cpu_only
    # Nothing pending (a finished run run again): nothing follows, whatever the mode.
    for mode in (True, "auto"):
        cfg = _config(["gender"], score_during_generation=mode)
        idle = follow_config(cfg, growing=False, pending=0)
        assert idle.runtime.score_during_generation is False, mode
        assert cfg.runtime.score_during_generation == mode
    assert follow_config(cfg, growing=False, pending=3) is cfg

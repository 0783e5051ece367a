"""Which scorers follow generation while its reservations grow, and how a replacement judges
its node lost (Ray-free)."""

from __future__ import annotations

from typing import Any

import pytest


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


def test_a_node_counts_as_lost_when_its_raylet_port_refuses_a_connection() -> None:
    """`live_group`'s own check of a node Ray still calls alive (Ray-free: plain sockets)."""
    import socket

    from harness.stages.generation.reservation import raylet_answers

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        node = {"NodeManagerAddress": "127.0.0.1", "NodeManagerPort": port}
        assert raylet_answers(node)
    assert not raylet_answers(node, timeout=1.0)  # closed: the port refuses
    assert raylet_answers({"NodeID": "x"})  # no address known: not judged lost

"""`validate` with a Ray cluster: what only the nodes read is left to an attached cluster, the
GPU budget it will ask for, `--address` on the command line, and an address nothing answers
named before Ray waits on it. The cluster is a socket listening on 127.0.0.1."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.validate import validate
from harness.config import parse_config
from tests.validate_helpers import closed_port, problems_of, write_config


@pytest.fixture
def cluster() -> Iterator[str]:
    """HOST:PORT of something listening on 127.0.0.1 (the check only connects)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_paths_the_nodes_read_are_left_to_an_attached_cluster(tmp_path: Path, cluster: str) -> None:
    """A local run refuses a missing head or model folder; on an attached cluster the actors
    read them on the nodes, so the driver not seeing them is no problem (prompts it reads
    itself still are)."""
    base = json.loads(write_config(tmp_path).read_text())
    data = {
        **base,
        "models": [{"id": str(tmp_path / "lm-on-the-nodes")}],
        "methods": [{"name": "uddia", "params": {"head": str(tmp_path / "head.safetensors")}}],
        "gender_words": str(tmp_path / "words.txt"),
    }
    local = validate(parse_config(data), "c.yaml")
    missing = ": no such file (a relative path in a config is read from the config's folder)"
    assert problems_of(local[0]) == [
        f"gender_words: {tmp_path / 'words.txt'}{missing}",
        f"methods.0.params.head: {tmp_path / 'head.safetensors'}{missing}",
        f"models.0.id: {tmp_path / 'lm-on-the-nodes'}: no such folder",
    ]
    attached = {**data, "runtime": {**data["runtime"], "ray_address": cluster}}
    lines, problems = validate(parse_config(attached), "c.yaml")
    assert problems_of(lines) == [f"gender_words: {tmp_path / 'words.txt'}{missing}"]
    assert "    uddia × sentiment: ? jobs; head " in "\n".join(lines)
    assert "not seen here; the nodes read it" in "\n".join(lines)


def test_validate_prints_the_gpu_budget_it_will_ask_for(tmp_path: Path, cluster: str) -> None:
    """`runtime.gpus` is the run's total, split between the models: 4 over 2 models is 2
    replicas of each, 4 GPUs, never 8."""
    base = json.loads(write_config(tmp_path).read_text())
    data = {
        **base,
        "models": [{"id": "tiny-random/gpt2"}, {"id": "tiny-random/opt", "num_gpus": 1}],
        "runtime": {**base["runtime"], "device": None, "gpus": 4, "ray_address": cluster},
    }
    lines, _ = validate(parse_config(data), "c.yaml")
    (budget,) = [line.strip() for line in lines if "GPU budget" in line]
    assert budget.startswith("GPU budget: 4 GPU(s)"), budget
    assert "tiny-random/gpt2: 2 × 1 GPU" in budget and "tiny-random/opt: 2 × 1 GPU" in budget
    cpu = {**base, "runtime": {**base["runtime"], "device": "cpu"}}
    lines, _ = validate(parse_config(cpu), "c.yaml")
    assert "  GPU budget: none (every model runs on CPU replicas)" in lines


def test_address_names_the_cluster_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: str
) -> None:
    """`--address` is `runtime.ray_address`: what only the nodes read is then left to them."""
    from harness.cli.commands import main

    cfg = write_config(tmp_path, models=[{"id": str(tmp_path / "lm-on-the-nodes")}])
    assert main(["validate", str(cfg)]) == 2
    assert "lm-on-the-nodes: no such folder" in capsys.readouterr().out
    assert main(["validate", str(cfg), "--address", cluster]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def test_a_cluster_that_does_not_answer_is_named_before_ray_waits_on_it(
    tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ray.init` on an address nothing answers retries for minutes, printing only Ray's own
    warnings: `validate` (and so `run`) names the address and its source at once."""
    base = json.loads(write_config(tmp_path).read_text())
    dead = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    lines, problems = validate(parse_config(base), "c.yaml")
    (line,) = [p for p in problems_of(lines) if p.startswith("RAY_ADDRESS: ")]
    assert line.startswith(f"RAY_ADDRESS: {dead}: no Ray cluster answers (")
    assert "unset RAY_ADDRESS for a local run" in line and problems == 1
    assert validate(parse_config(base), "c.yaml", use_ray=False)[1] == 0  # --no-ray: no Ray
    named = {**base, "runtime": {**base["runtime"], "ray_address": f"ray://{dead}"}}
    lines, _ = validate(parse_config(named), "c.yaml")  # the config's address wins
    assert [p.split(":")[0] for p in problems_of(lines)] == ["runtime.ray_address"]
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    lines, problems = validate(parse_config(base), "c.yaml")
    assert problems == 0 and f"  RAY_ADDRESS: {cluster} (reachable)" in lines
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # Ray's address file: left to Ray
    assert not [line for line in validate(parse_config(base), "c.yaml")[0] if "auto" in line]

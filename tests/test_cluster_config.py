"""Every shipped cluster launcher config passes the launcher's own validation (what `ray up`
runs, no cloud credentials needed), keeps actors off the head, installs the pinned project in
the pinned Ray image, gives every node that writes runs cloud credentials, and binds the
dashboard to 127.0.0.1; the job upload leaves out what must not travel."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.ray_runtime import PACKAGES, code_runtime_env

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*REPO.glob("ray_cluster*.yaml"), *(REPO / "examples").glob("ray_cluster*.yaml")])
CLOUD = [p for p in CONFIGS if yaml.safe_load(p.read_text())["provider"]["type"] != "local"]
AWS, GCP, ONPREM = (
    REPO / "ray_cluster.yaml",
    REPO / "ray_cluster_gcp.yaml",
    REPO / "examples" / "ray_cluster_onprem.yaml",
)


def validated(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does to a config before using it: fill in defaults, then check the schema."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    full = prepare_config(copy.deepcopy(config))
    validate_config(full)
    return dict(full)


def prepared(path: Path) -> dict[str, Any]:
    return validated(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_launcher_accepts_the_config(path: Path) -> None:
    config = prepared(path)
    assert config["file_mounts"] == {"~/lidao-harness": "."}
    setup = "\n".join(config["setup_commands"])
    torch_pin = re.search(r"torch==[\d.]+", (REPO / "scripts" / "setup.sh").read_text())
    assert torch_pin and torch_pin.group(0) in setup  # the same torch as a local install
    assert 'pip install -q -e "$HOME/lidao-harness"' in setup  # pyproject's pins apply
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in path.read_text()


def test_the_launcher_rejects_a_misspelt_key() -> None:
    from jsonschema import ValidationError

    config = yaml.safe_load(AWS.read_text())
    config["available_node_types"]["gpu_1x"]["min_worker"] = 1  # min_workers
    with pytest.raises(ValidationError, match="min_worker"):
        validated(config)


def test_every_shipped_launcher_file_is_covered() -> None:
    assert {AWS, GCP, ONPREM} <= set(CONFIGS) and {AWS, GCP} <= set(CLOUD)


@pytest.mark.parametrize("path", CLOUD, ids=lambda p: p.name)
def test_cloud_nodes_run_the_pinned_ray_gpu_image_with_a_shared_hf_cache(path: Path) -> None:
    import ray

    config = prepared(path)
    image = config["docker"]["image"]
    pin = re.search(r"ray\[[\w,]+\]==([\d.]+)", (REPO / "pyproject.toml").read_text())
    assert pin and pin.group(1) == ray.__version__
    assert re.fullmatch(rf"rayproject/ray:{re.escape(pin.group(1))}-py3\d+-gpu", image), image
    run = " ".join(config["docker"]["run_options"])
    assert "HF_HOME=/home/ray/hf-cache" in run and ":/home/ray/hf-cache" in run
    text = path.read_text()
    assert "latest_dlami" not in text  # Ray 2.60 maps it to an Ubuntu 18.04 / CUDA 11.2 AMI


@pytest.mark.parametrize("path", CLOUD, ids=lambda p: p.name)
def test_the_cloud_head_holds_no_actors_and_gpu_workers_autoscale(path: Path) -> None:
    config = prepared(path)
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"] == {"CPU": 0}
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    assert workers and all(v["min_workers"] == 0 < v["max_workers"] for v in workers.values())
    assert sum(v["max_workers"] for v in workers.values()) >= config["max_workers"]


def test_every_aws_node_has_an_instance_profile() -> None:
    """Workers write s3:// shards: Ray gives its default profile to the head only."""
    types = prepared(AWS)["available_node_types"]
    for name, node in types.items():
        arn = node["node_config"]["IamInstanceProfile"]["Arn"]
        assert re.fullmatch(r"arn:aws:iam::\d{12}:instance-profile/[\w+=,.@-]+", arn), name


def test_every_gcp_worker_has_a_service_account() -> None:
    config = prepared(GCP)
    for name, node in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue  # Ray gives the head its own account (ray-autoscaler-sa-v1)
        (account,) = node["node_config"]["serviceAccounts"]
        assert account["email"].endswith(".iam.gserviceaccount.com"), name
        assert node["node_config"]["scheduling"] == [{"onHostMaintenance": "TERMINATE"}]


def test_the_docs_name_no_fake_launcher_key() -> None:
    docs = (REPO / "docs" / "cluster.md").read_text()
    assert "iam_instance_profile" not in docs and "IamInstanceProfile" in docs
    assert "rayproject/ray:2.60.0-py311-gpu" in docs


def test_the_onprem_head_holds_no_actors() -> None:
    head = " ".join(prepared(ONPREM)["head_start_ray_commands"])
    assert "--num-cpus=0" in head


def test_the_job_upload_leaves_out_git_runs_parquet_and_the_venv() -> None:
    from ray._private.runtime_env.packaging import get_excludes_from_ignore_files

    excludes = get_excludes_from_ignore_files(REPO, include_gitignore=True)

    def excluded(rel: str) -> bool:
        return any(f(REPO / rel) for f in excludes)

    for rel in (".git", ".git/HEAD", ".venv", "runs", "runs/qs/plan.parquet", "scratch/x.parquet"):
        assert excluded(rel), rel
    for rel in ("harness/cli.py", "examples/quickstart.yaml", "examples/data/pairs-female.jsonl"):
        assert not excluded(rel), rel


def test_attaching_from_outside_a_job_ships_the_project_packages() -> None:
    env = code_runtime_env()
    assert [Path(m).name for m in env["py_modules"]] == list(PACKAGES)
    assert all((Path(m) / "__init__.py").is_file() for m in env["py_modules"])
    assert "*.parquet" in env["excludes"]

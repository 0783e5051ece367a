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

from harness.stages.generation.ray_runtime import PACKAGES, code_runtime_env

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
        assert node["node_config"]["scheduling"] == {"onHostMaintenance": "TERMINATE"}


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
    for rel in (
        "harness/cli/commands.py",
        "examples/quickstart.yaml",
        "examples/data/pairs-female.jsonl",
    ):
        assert not excluded(rel), rel


def test_attaching_from_outside_a_job_ships_the_project_packages() -> None:
    env = code_runtime_env()
    assert [Path(m).name for m in env["py_modules"]] == list(PACKAGES)
    assert all((Path(m) / "__init__.py").is_file() for m in env["py_modules"])
    assert "*.parquet" in env["excludes"]


# ---- node_config against the cloud SDKs' request shapes (harness/tools/launcher_check.py) ----------


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_node_config_matches_the_cloud_request_shapes(path: Path) -> None:
    from harness.tools.launcher_check import check_file

    assert check_file(path) == []


def _gpu_worker(config: dict[str, Any]) -> dict[str, Any]:
    return dict(config["available_node_types"]["gpu_1x"]["node_config"])


def test_a_misspelt_or_made_up_aws_node_config_fails() -> None:
    from harness.tools.launcher_check import check_launcher

    base = yaml.safe_load(AWS.read_text())
    cases = {
        "InstanceTyp": lambda nc: nc.__setitem__("InstanceTyp", nc.pop("InstanceType")),
        "g5.3xlarge": lambda nc: nc.__setitem__("InstanceType", "g5.3xlarge"),
        "VolumeSiz": lambda nc: nc["BlockDeviceMappings"][0]["Ebs"].__setitem__("VolumeSiz", 9),
        "ImageId": lambda nc: nc.__setitem__("ImageId", "ubuntu-22.04-gpu"),
        "Arn": lambda nc: nc.__setitem__("IamInstanceProfile", {"Arn": "arn:aws:iam::12:role/x"}),
    }
    for needle, spoil in cases.items():
        config = copy.deepcopy(base)
        spoil(config["available_node_types"]["gpu_1x"]["node_config"])
        problems = check_launcher(config, "ray_cluster.yaml")
        assert len(problems) == 1 and needle in problems[0], (needle, problems)
        assert "available_node_types.gpu_1x.node_config" in problems[0]
        validated(config)  # Ray's own check lets every one of these through


def test_a_misspelt_or_misshapen_gcp_node_config_fails() -> None:
    from harness.tools.launcher_check import check_launcher

    base = yaml.safe_load(GCP.read_text())
    cases = {
        "machineTpye": lambda nc: nc.__setitem__("machineTpye", nc.pop("machineType")),
        "expected a mapping (Scheduling)": lambda nc: nc.__setitem__(
            "scheduling", [{"onHostMaintenance": "TERMINATE"}]
        ),
        "MIGRATE_LATER": lambda nc: nc.__setitem__(
            "scheduling", {"onHostMaintenance": "MIGRATE_LATER"}
        ),
        "diskSizeGB": lambda nc: nc["disks"][0]["initializeParams"].__setitem__("diskSizeGB", 9),
    }
    for needle, spoil in cases.items():
        config = copy.deepcopy(base)
        spoil(config["available_node_types"]["gpu_1x"]["node_config"])
        problems = check_launcher(config, "ray_cluster_gcp.yaml")
        assert any(needle in p for p in problems), (needle, problems)
        assert all("available_node_types.gpu_1x" in p for p in problems), problems
    config = copy.deepcopy(base)
    config["available_node_types"]["gpu_4x"]["resources"] = {}
    (problem,) = check_launcher(config, "ray_cluster_gcp.yaml")
    assert "gpu_4x.resources: declare CPU and GPU" in problem
    config["available_node_types"]["gpu_4x"]["resources"] = {"CPU": 48, "GPU": 8}
    (problem,) = check_launcher(config, "ray_cluster_gcp.yaml")
    assert "8 declared, but g2-standard-48 has 4" in problem


def test_the_launcher_check_command_exits_2_naming_the_key(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = yaml.safe_load(AWS.read_text())
    nc = config["available_node_types"]["gpu_4x"]["node_config"]
    nc["InstanceTyp"] = nc.pop("InstanceType")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    res = subprocess.run(
        [sys.executable, "-m", "harness.tools.launcher_check", str(AWS), str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "gpu_4x.node_config.InstanceTyp: not a key of RunInstancesRequest" in res.stderr
    assert "did you mean 'InstanceType'" in res.stderr and "1 problem(s)" in res.stdout


def test_the_gcp_fill_in_leaves_every_worker_type_its_declared_gpus_and_cpus() -> None:
    """Ray fills resources from the cloud on GCP only for TPUs: what the file declares is what
    the autoscaler bin-packs with."""
    from ray.autoscaler._private.gcp.node_provider import GCPNodeProvider

    filled = GCPNodeProvider.fillout_available_node_types_resources(prepared(GCP))
    types = filled["available_node_types"]
    for name, node in types.items():
        if name == filled["head_node_type"]:
            assert node["resources"] == {"CPU": 0}
            continue
        assert node["resources"]["GPU"] >= 1 and node["resources"]["CPU"] >= 4, name


def test_the_aws_fill_in_gives_every_worker_type_its_gpus_and_cpus(monkeypatch) -> None:
    """Ray's AWS provider reads CPUs and GPUs from EC2's DescribeInstanceTypes: answered here by
    moto's copy of the instance catalogue, offline."""
    pytest.importorskip("moto", reason="moto (the dev extra) answers EC2 offline")
    from moto import mock_aws

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

        filled = AWSNodeProvider.fillout_available_node_types_resources(prepared(AWS))
    types = filled["available_node_types"]
    assert types["head"]["resources"] == {"CPU": 0}  # declared CPU 0 wins over the fill-in
    assert types["gpu_1x"]["resources"]["GPU"] == 1 and types["gpu_1x"]["resources"]["CPU"] == 8
    assert types["gpu_4x"]["resources"]["GPU"] == 4 and types["gpu_4x"]["resources"]["CPU"] == 48


# ---- IAM and weights -------------------------------------------------------------------------


def _allows(policy: dict[str, Any], action: str) -> bool:
    import fnmatch

    for st in policy["Statement"]:
        acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if st["Effect"] == "Allow" and any(fnmatch.fnmatchcase(action, a) for a in acts):
            return True
    return False


def test_the_head_policy_grants_what_the_launcher_and_the_ssm_image_need() -> None:
    import json

    head = json.loads((REPO / "docs" / "iam" / "lidao-ray-head.json").read_text())
    worker = json.loads((REPO / "docs" / "iam" / "lidao-ray-worker.json").read_text())
    launcher = [
        "ec2:RunInstances",
        "ec2:TerminateInstances",
        "ec2:CreateTags",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
        "iam:PassRole",
    ]
    ssm = ["ssm:GetParameters"]  # EC2 resolves `resolve:ssm:` ImageIds with the caller's rights
    runs = [
        "s3:ListBucket",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
    ]
    for action in launcher + ssm + runs:
        assert _allows(head, action), action
    for action in runs:
        assert _allows(worker, action), action
    assert not _allows(worker, "ec2:RunInstances") and not _allows(worker, "iam:PassRole")
    uses_ssm = any(
        "resolve:ssm:" in str(n["node_config"].get("ImageId"))
        for n in prepared(AWS)["available_node_types"].values()
    )
    assert uses_ssm  # the reason ssm:GetParameters is needed
    docs = (REPO / "docs" / "cluster.md").read_text()
    for name in ("lidao-ray-head.json", "lidao-ray-worker.json", "ec2-trust.json"):
        assert f"docs/iam/{name}" in docs


@pytest.mark.parametrize("path", CLOUD, ids=lambda p: p.name)
def test_workers_download_one_weight_format(path: Path) -> None:
    import ast
    import fnmatch

    setup = " ".join(prepared(path)["worker_setup_commands"])
    found = re.search(r"allow_patterns=(\[[^\]]*\])", setup)
    assert found, "snapshot_download without allow_patterns fetches every weight format"
    patterns = ast.literal_eval(found.group(1))
    repo_files = [
        "config.json",
        "generation_config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "model.safetensors",
        "pytorch_model.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "rust_model.ot",
        "onnx/decoder_model.onnx",
        "64-8bits.tflite",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
    ]
    kept = {f for f in repo_files if any(fnmatch.fnmatch(f, p) for p in patterns)}
    weights = {f for f in kept if not f.endswith((".json", ".txt"))}
    assert weights == {"model.safetensors", "model-00001-of-00002.safetensors"}, weights
    assert {"config.json", "vocab.json", "merges.txt", "tokenizer.json"} <= kept


def test_aws_declared_gpus_must_match_the_instance_type() -> None:
    """Ray keeps a declared `GPU` over what it reads from EC2: a 1-GPU g5.2xlarge declared
    with 4 would have the autoscaler place 4 replicas on it."""
    from harness.tools.launcher_check import WARNING, check_launcher

    base = yaml.safe_load(AWS.read_text())
    for instance, gpus, expect in [
        ("g5.2xlarge", 4, "4 declared, but g5.2xlarge has 1"),
        ("g5.12xlarge", 4, None),
        ("m5.xlarge", 1, "1 declared, but m5.xlarge has 0"),
        ("g9.2xlarge", 1, WARNING + "ray_cluster.yaml: available_node_types.gpu_1x"),
    ]:
        config = copy.deepcopy(base)
        node = config["available_node_types"]["gpu_1x"]
        node["resources"] = {"GPU": gpus}
        node["node_config"]["InstanceType"] = instance
        problems = [p for p in check_launcher(config, "ray_cluster.yaml") if "GPU" in p]
        if expect is None:
            assert problems == [], problems
        else:
            assert len(problems) == 1 and expect in problems[0], (instance, problems)


def test_the_aws_gpu_table_matches_ec2s_catalogue() -> None:
    """Every tabulated type that moto's copy of DescribeInstanceTypes knows has its GPU count,
    and every GPU type of a tabulated family there is in the table."""
    pytest.importorskip("moto", reason="moto (the dev extra) ships EC2's instance catalogue")
    import gzip
    import json
    from importlib import resources as importlib_resources

    from harness.tools.launcher_check import AWS_GPUS, aws_instance_gpus

    path = importlib_resources.files("moto.ec2") / "resources" / "instance_types.json.gz"
    catalogue = json.loads(gzip.decompress(path.read_bytes()))
    checked = 0
    for name, info in catalogue.items():
        family = name.partition(".")[0]
        gpus = sum(g["Count"] for g in (info.get("GpuInfo") or {}).get("Gpus", []))
        if family in AWS_GPUS or gpus:
            assert aws_instance_gpus(name) in (gpus, None), name
            checked += family in AWS_GPUS
    assert checked >= 50
    assert aws_instance_gpus("g6f.xlarge") is None  # a fraction of a GPU: warned, not compared

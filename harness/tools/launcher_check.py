"""Offline checks of a Ray cluster launcher config that `ray up`'s own validation leaves out
(docs/cluster.md): each node type's `node_config` against the cloud SDK's own request shape
(botocore's EC2 `RunInstances`; the Compute Engine v1 discovery document), and the resources
the autoscaler bin-packs with (declared GPUs against the machine type; `AWS_GPUS` tabulates
what botocore's data does not say). No credentials, no network.

    python -m harness.tools.launcher_check ray_cluster.yaml ray_cluster_gcp.yaml   # exit 2 on problems
"""

from __future__ import annotations

import json
import re
import sys
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

import yaml

AMI_ID = re.compile(r"ami-[0-9a-f]{8}([0-9a-f]{9})?")
SSM_AMI = re.compile(r"resolve:ssm:/[\w./-]+")
PROFILE_ARN = re.compile(r"arn:aws:iam::\d{12}:instance-profile/[\w+=,.@/-]+")
GCE_IMAGE = re.compile(r"projects/[a-z][-a-z0-9]*/global/images/(family/)?[a-z][-a-z0-9.]*")

# GPUs that come with a GCE machine type (the type cannot run without them). Other types take
# GPUs through `guestAccelerators` (N1) or have none.
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}


def gce_machine_gpus(machine_type: str) -> int | None:
    """The GPUs a GCE machine type brings with it, or None when the type does not fix them."""
    if m := re.fullmatch(r"g2-standard-(\d+)", machine_type):
        return _G2_GPUS.get(int(m.group(1)))
    if m := re.fullmatch(r"a[23]-(?:highgpu|megagpu|ultragpu|edgegpu)-(\d+)g", machine_type):
        return int(m.group(1))
    return None


# NVIDIA GPUs per EC2 instance type, by family: size → GPUs, "*" for the family's other sizes
# (xlarge … 16xlarge). From AWS's instance-type pages; tests/test_cluster_config.py checks every
# entry against the catalogue moto ships (DescribeInstanceTypes' GpuInfo) where moto has it.
AWS_GPUS: dict[str, dict[str, int]] = {
    "p2": {"xlarge": 1, "8xlarge": 8, "16xlarge": 16},
    "p3": {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8},
    "p3dn": {"24xlarge": 8},
    "p4d": {"24xlarge": 8},
    "p4de": {"24xlarge": 8},
    "p5": {"4xlarge": 1, "48xlarge": 8},
    "p5e": {"48xlarge": 8},
    "p5en": {"48xlarge": 8},
    "p6-b200": {"48xlarge": 8},
    "p6-b300": {"48xlarge": 8},
    "g3": {"4xlarge": 1, "8xlarge": 2, "16xlarge": 4},
    "g3s": {"xlarge": 1},
    "g4dn": {"12xlarge": 4, "metal": 8, "*": 1},
    "g5": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8, "*": 1},
    "g5g": {"16xlarge": 2, "metal": 2, "*": 1},
    "g6": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8, "*": 1},
    "g6e": {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8, "*": 1},
    "gr6": {"4xlarge": 1, "8xlarge": 1},
    "g7": {"12xlarge": 2, "24xlarge": 4, "48xlarge": 8, "*": 1},
    "g7e": {"12xlarge": 2, "24xlarge": 4, "48xlarge": 8, "*": 1},
}
WARNING = "warning: "  # a message that does not count as a problem (exit 0)


def aws_instance_gpus(instance_type: str) -> int | None:
    """NVIDIA GPUs of an EC2 instance type; 0 for a family without them; None: not known (a
    GPU-like family, `g…`/`p…`, missing from `AWS_GPUS`, or fractional GPUs as `g6f`)."""
    family, _, size = instance_type.partition(".")
    sizes = AWS_GPUS.get(family)
    if sizes is not None:
        return sizes.get(size, sizes.get("*"))
    return None if re.match(r"(g|gr|p)\d", family) else 0


# ---- AWS: botocore's shapes ---------------------------------------------------------------


def _check_boto_shape(value: Any, shape: Any, where: str, out: list[str]) -> None:
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            out.append(f"{where}: expected a mapping ({shape.name}), got {type(value).__name__}")
            return
        for key, sub in value.items():
            if key not in shape.members:
                near = _near(key, list(shape.members))
                out.append(f"{where}.{key}: not a key of {shape.name}{near}")
                continue
            _check_boto_shape(sub, shape.members[key], f"{where}.{key}", out)
    elif kind == "list":
        if not isinstance(value, list):
            out.append(f"{where}: expected a list ({shape.name}), got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check_boto_shape(item, shape.member, f"{where}[{i}]", out)
    elif kind == "map":
        if not isinstance(value, dict):
            out.append(f"{where}: expected a mapping, got {type(value).__name__}")
    elif kind == "string":
        if not isinstance(value, str):
            out.append(f"{where}: expected a string, got {type(value).__name__}")
        elif shape.enum and value not in shape.enum:
            near = _near(value, list(shape.enum))
            out.append(f"{where}: {value!r} is not a valid {shape.name}{near}")
    elif kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"{where}: expected an integer, got {value!r}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            out.append(f"{where}: expected true/false, got {value!r}")


def check_aws_node_config(node_config: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    try:
        import botocore.session  # ships with boto3, the AWS launcher's own dependency
    except ImportError:
        return [
            f"{where}: botocore is not installed, so node_config was not checked (pip install boto3)"
        ]
    model = botocore.session.get_session().get_service_model("ec2")
    shape = model.operation_model("RunInstances").input_shape
    _check_boto_shape(node_config, shape, where, out)
    image = node_config.get("ImageId")
    if isinstance(image, str) and not (AMI_ID.fullmatch(image) or SSM_AMI.fullmatch(image)):
        out.append(f"{where}.ImageId: {image!r} is neither an AMI id (ami-…) nor resolve:ssm:/PATH")
    arn = (node_config.get("IamInstanceProfile") or {}).get("Arn")
    if isinstance(arn, str) and not PROFILE_ARN.fullmatch(arn):
        out.append(f"{where}.IamInstanceProfile.Arn: {arn!r} is not an instance-profile ARN")
    return out


# ---- GCP: the Compute Engine discovery document --------------------------------------------


def _check_gce(
    value: Any, schema: dict[str, Any], doc: dict[str, Any], where: str, out: list[str]
) -> None:
    if "$ref" in schema:
        name = schema["$ref"]
        _check_gce(value, {**doc["schemas"][name], "_name": name}, doc, where, out)
        return
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            what = schema.get("_name", "an object")
            out.append(f"{where}: expected a mapping ({what}), got {type(value).__name__}")
            return
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if props is not None and key in props:
                _check_gce(sub, props[key], doc, f"{where}.{key}", out)
            elif extra is not None:
                _check_gce(sub, extra, doc, f"{where}.{key}", out)
            else:
                near = _near(key, list(props or ()))
                out.append(
                    f"{where}.{key}: not a field of {schema.get('_name', 'this object')}{near}"
                )
    elif kind == "array":
        if not isinstance(value, list):
            out.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check_gce(item, schema["items"], doc, f"{where}[{i}]", out)
    elif kind == "string":
        # int64 fields travel as strings in JSON; YAML gives ints: both are accepted by the API
        ok = isinstance(value, str) or (
            schema.get("format") in ("int64", "uint64") and isinstance(value, int)
        )
        if not ok:
            out.append(f"{where}: expected a string, got {value!r}")
        elif isinstance(value, str) and "enum" in schema and value not in schema["enum"]:
            out.append(f"{where}: {value!r} is not one of {', '.join(schema['enum'])}")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"{where}: expected an integer, got {value!r}")
    elif kind == "boolean" and not isinstance(value, bool):
        out.append(f"{where}: expected true/false, got {value!r}")


def check_gcp_node_config(node_config: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    if "acceleratorType" in node_config or "acceleratorConfig" in node_config:
        return out  # a TPU node: the TPU API's shapes, not Compute Engine's
    docs = importlib_resources.files("googleapiclient") / "discovery_cache" / "documents"
    doc = json.loads((docs / "compute.v1.json").read_text())
    _check_gce(node_config, {"$ref": "Instance"}, doc, where, out)
    for i, disk in enumerate(node_config.get("disks") or []):
        image = ((disk or {}).get("initializeParams") or {}).get("sourceImage")
        if isinstance(image, str) and not GCE_IMAGE.fullmatch(image):
            out.append(
                f"{where}.disks[{i}].initializeParams.sourceImage: {image!r} is not projects/P/global/images/[family/]NAME"
            )
    return out


# ---- the whole launcher file ---------------------------------------------------------------


def _near(word: str, choices: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_launcher(config: dict[str, Any], name: str = "config") -> list[str]:
    """Every problem found in a launcher config (a parsed YAML), each naming its path; those
    starting with `WARNING` could not be checked and do not fail the file."""
    problems: list[str] = []
    provider = (config.get("provider") or {}).get("type")
    head = config.get("head_node_type")
    for node_type, node in (config.get("available_node_types") or {}).items():
        where = f"{name}: available_node_types.{node_type}"
        node_config = node.get("node_config") or {}
        res = node.get("resources") or {}
        if provider == "aws":
            problems += check_aws_node_config(node_config, f"{where}.node_config")
            problems += _check_aws_gpus(res, str(node_config.get("InstanceType", "")), where)
        elif provider == "gcp":
            problems += check_gcp_node_config(node_config, f"{where}.node_config")
            if node_type != head:
                missing = [r for r in ("CPU", "GPU") if r not in res]
                if missing:
                    problems.append(
                        f"{where}.resources: declare {' and '.join(missing)}: Ray fills in "
                        "resources from the cloud on AWS only, so the autoscaler would find "
                        "every request infeasible for this node type"
                    )
                machine = str(node_config.get("machineType", ""))
                brought = gce_machine_gpus(machine)
                attached = sum(
                    int(a.get("acceleratorCount", 0))
                    for a in node_config.get("guestAccelerators") or []
                )
                expect = brought if brought is not None else attached
                if machine and "GPU" in res and res["GPU"] != expect:
                    problems.append(
                        f"{where}.resources.GPU: {res['GPU']} declared, but {machine or 'the node'} "
                        f"has {expect}"
                    )
                scheduling = node_config.get("scheduling")
                maintenance = (
                    scheduling.get("onHostMaintenance") if isinstance(scheduling, dict) else None
                )
                if expect and maintenance != "TERMINATE":
                    problems.append(
                        f"{where}.node_config.scheduling: GPU VMs need onHostMaintenance: TERMINATE"
                    )
        if provider in ("aws", "gcp") and node_type == head and res.get("CPU") != 0:
            problems.append(
                f"{where}.resources: the head should declare CPU: 0 (keeps actors off it)"
            )
        if node_type != head and provider == "gcp" and res.get("GPU") == 0:
            problems.append(
                f"{where}.resources.GPU: a worker type without GPUs cannot run a replica"
            )
    return problems


def _check_aws_gpus(res: dict[str, Any], instance_type: str, where: str) -> list[str]:
    """A declared `GPU` against the instance type's (Ray keeps the declaration over EC2's)."""
    if "GPU" not in res or not instance_type:
        return []
    has = aws_instance_gpus(instance_type)
    if has is None:
        return [
            f"{WARNING}{where}.resources.GPU: {res['GPU']} declared; the GPUs of "
            f"{instance_type} are not in launcher_check's table, so it was not compared"
        ]
    if res["GPU"] != has:
        return [f"{where}.resources.GPU: {res['GPU']} declared, but {instance_type} has {has}"]
    return []


def check_file(path: str | Path) -> list[str]:
    p = Path(path)
    try:
        config = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"{p}: cannot read: {exc}"]
    if not isinstance(config, dict):
        return [f"{p}: not a launcher config (a mapping at the top)"]
    return check_launcher(config, str(p))


def main(argv: list[str] | None = None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        print("usage: python -m harness.tools.launcher_check RAY_CLUSTER.yaml ...", file=sys.stderr)
        return 2
    messages = [msg for path in paths for msg in check_file(path)]
    for msg in messages:
        print(msg, file=sys.stderr)
    problems = [m for m in messages if not m.startswith(WARNING)]
    warned = len(messages) - len(problems)
    print(
        f"{len(paths)} launcher config(s): {len(problems)} problem(s)"
        + (f", {warned} warning(s)" if warned else "")
    )
    return 2 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

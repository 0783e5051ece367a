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
from collections.abc import Callable, Sequence
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, NamedTuple

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


# ---- node_config against the SDK's request shape -------------------------------------------


class Shape(NamedTuple):
    """A request field's type, as botocore (`_boto_shape`) and the discovery document
    (`_gce_shape`) describe it: one walk (`_check`) checks a node_config against either."""

    kind: str  # object | map | array | string | integer | boolean (anything else: unchecked)
    name: str = ""
    fields: dict[str, Any] | None = None  # object: its keys' shapes
    extra: Any = None  # object: the shape of any other key (None: other keys are refused)
    item: Any = None  # array: its items' shape
    enum: Sequence[str] = ()
    int_text: bool = False  # a string that may be given as a whole number (GCE's int64)


def _boto_shape(shape: Any) -> Shape:
    kind = {"structure": "object", "list": "array", "long": "integer"}.get(shape.type_name)
    members, item = getattr(shape, "members", None), getattr(shape, "member", None)
    return Shape(
        kind or shape.type_name, shape.name, members, None, item, getattr(shape, "enum", ())
    )


def _gce_shape(doc: dict[str, Any]) -> Callable[[dict[str, Any]], Shape]:
    def describe(schema: dict[str, Any]) -> Shape:
        name = ""
        while "$ref" in schema:
            name, schema = schema["$ref"], doc["schemas"][schema["$ref"]]
        kind = "object" if "properties" in schema else schema.get("type", "")
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        int_text = schema.get("format") in ("int64", "uint64")  # JSON strings; YAML gives ints
        return Shape(
            kind, name, props, extra, schema.get("items"), schema.get("enum", ()), int_text
        )

    return describe


def _check(value: Any, shape: Any, describe: Callable[[Any], Shape], where: str) -> list[str]:
    """Every problem of `value` against `shape` (`describe` reads the SDK's form of it)."""
    s = describe(shape)
    if s.kind in ("object", "map") and not isinstance(value, dict):
        return [
            f"{where}: expected a mapping ({s.name or 'an object'}), got {type(value).__name__}"
        ]
    if s.kind == "object":
        out = []
        for key, sub in value.items():
            inner = (s.fields or {}).get(key, s.extra)
            if inner is None:
                near = _near(key, list(s.fields or ()))
                out.append(f"{where}.{key}: not a key of {s.name or 'this object'}{near}")
            else:
                out += _check(sub, inner, describe, f"{where}.{key}")
        return out
    if s.kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [
            p for i, v in enumerate(value) for p in _check(v, s.item, describe, f"{where}[{i}]")
        ]
    if s.kind == "string" and not (isinstance(value, str) or s.int_text and isinstance(value, int)):
        return [f"{where}: expected a string, got {value!r}"]
    if s.kind == "string" and s.enum and isinstance(value, str) and value not in s.enum:
        hint = f" (one of {', '.join(s.enum)})" if len(s.enum) <= 8 else _near(value, list(s.enum))
        return [f"{where}: {value!r} is not a valid {s.name or 'value'}{hint}"]
    if s.kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{where}: expected an integer, got {value!r}"]
    if s.kind == "boolean" and not isinstance(value, bool):
        return [f"{where}: expected true/false, got {value!r}"]
    return []


def check_aws_node_config(node_config: dict[str, Any], where: str) -> list[str]:
    """`node_config` against botocore's EC2 `RunInstances` request, and its AMI and profile."""
    try:
        import botocore.session  # ships with boto3, the AWS launcher's own dependency
    except ImportError:
        return [
            f"{where}: botocore is not installed, so node_config was not checked (pip install boto3)"
        ]
    model = botocore.session.get_session().get_service_model("ec2")
    shape = model.operation_model("RunInstances").input_shape
    out = _check(node_config, shape, _boto_shape, where)
    image = node_config.get("ImageId")
    if isinstance(image, str) and not (AMI_ID.fullmatch(image) or SSM_AMI.fullmatch(image)):
        out.append(f"{where}.ImageId: {image!r} is neither an AMI id (ami-…) nor resolve:ssm:/PATH")
    arn = (node_config.get("IamInstanceProfile") or {}).get("Arn")
    if isinstance(arn, str) and not PROFILE_ARN.fullmatch(arn):
        out.append(f"{where}.IamInstanceProfile.Arn: {arn!r} is not an instance-profile ARN")
    return out


def check_gcp_node_config(node_config: dict[str, Any], where: str) -> list[str]:
    """`node_config` against Compute Engine's `Instance` (discovery document), and its image."""
    if "acceleratorType" in node_config or "acceleratorConfig" in node_config:
        return []  # a TPU node: the TPU API's shapes, not Compute Engine's
    docs = importlib_resources.files("googleapiclient") / "discovery_cache" / "documents"
    doc = json.loads((docs / "compute.v1.json").read_text())
    out = _check(node_config, {"$ref": "Instance"}, _gce_shape(doc), where)
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

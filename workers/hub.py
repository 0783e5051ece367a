"""The Hugging Face hub without downloading (torch-free): is it reachable, is a model in the
local cache, does a repository exist; for `validate` / `run` / `score` and the actors' loaders.
The hub is probed once per process (`PROBE_TIMEOUT_S`); when it does not answer, offline mode
is switched on so that a load that is not cached fails at once instead of retrying for
minutes (docs/footguns.md). The user's `HF_HUB_OFFLINE` / `TRANSFORMERS_OFFLINE` are honoured.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("harness")

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0  # one request; a hub that does not answer in this time counts as offline
INFO_TIMEOUT_S = 10.0  # one repository's metadata, when the hub answered the probe
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.txt",
)

_probed: dict[str, tuple[bool, str]] = {}  # endpoint → (reachable, why not)
_offline_why: list[str] = []  # why this process switched offline mode on (go_offline)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_by_user() -> bool:
    flags = (
        os.environ.get(v, "").strip().upper() for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    return any(flag in ("1", "ON", "YES", "TRUE") for flag in flags)


def hub_cache() -> Path:
    """The hub cache folder, from the environment at call time (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(Path.home(), ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_status(timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(reachable, why not): `HF_HUB_OFFLINE`, else one HEAD request to the endpoint, once per
    process and endpoint. Any HTTP answer counts as reachable (a 4xx/5xx is the hub speaking)."""
    if offline_by_user():
        return False, _offline_why[0] if _offline_why else "HF_HUB_OFFLINE is set"
    url = endpoint()
    if url not in _probed:
        request = urllib.request.Request(url + "/", method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s):
                pass
            _probed[url] = (True, "")
        except urllib.error.HTTPError:
            _probed[url] = (True, "")
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            _probed[url] = (False, f"{url} does not answer ({reason})")
    return _probed[url]


def go_offline(why: str = "") -> None:
    """Offline mode for this process and every process it starts from now on."""
    if why and not _offline_why:
        _offline_why.append(why)
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # read once at import: set the module's copy too
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]


def offline_unless_reachable() -> tuple[bool, str]:
    """`hub_status()`, switching offline mode on when the hub is not reachable."""
    reachable, why = hub_status()
    if not reachable and not offline_by_user():
        log.debug("the Hugging Face hub is not reachable (%s): offline mode", why)
        go_offline(why)
    return reachable, why


def is_local(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or os.path.isdir(os.path.expanduser(spec))


def snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision` (a branch, tag or commit), if any."""
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    ref = repo / "refs" / rev
    commit = ref.read_text().strip() if ref.is_file() else rev
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None


def structure_problem(spec: str, revision: str | None = None) -> str | None:
    """Why causal LM `spec` is not one the harness can drive, from its config alone (no weights;
    `model_config`: a folder's, the hub cache's or a GGUF header's); None when it is, or when
    its config is not on this machine (the actor finds out when it loads)."""
    from workers.structure import StructureError, config_layout

    config = model_config(spec, revision)
    try:
        if config is not None:
            config_layout(config)
    except StructureError as exc:
        return f"{spec}: {exc}"
    return None


def model_context(spec: str, revision: str | None = None) -> int | None:
    """The most tokens (prompt and continuation) model `spec` takes, from its config
    (`model_config`; a tiny model's from `workers.tiny`); None when that config is not here or
    declares no length."""
    from workers.tiny import TINY_PREFIX, tiny_context

    if spec.startswith(TINY_PREFIX):
        return tiny_context(spec[len(TINY_PREFIX) :])
    config = model_config(spec, revision) or {}
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):  # GPT-2, most, GPT-J
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def model_config(spec: str, revision: str | None = None) -> dict[str, Any] | None:
    """Model `spec`'s config as a dict, read without weights or downloads: config.json in its
    folder or the Hugging Face cache, or a GGUF file's header (`workers.gguf`); None when it is
    not on this machine or cannot be read."""
    from workers import gguf

    if gguf.is_gguf_spec(spec):
        try:
            return gguf.read_header(gguf.resolve(spec)).config()
        except gguf.GgufError:
            return None
    folder = Path(os.path.expanduser(spec)) if is_local(spec) else snapshot(spec, revision)
    try:
        config = json.loads((folder / "config.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


@dataclass(frozen=True)
class Availability:
    """Where a model or tokenizer would come from; `problem` is None when it can be loaded."""

    where: str
    problem: str | None = None


def _has_weights(folder: Path) -> bool:
    """Weights in the snapshot; a sharded checkpoint needs every shard its index names."""
    for index in folder.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            return False
        return bool(shards) and all((folder / s).is_file() for s in shards)
    return any(p.name.endswith(WEIGHT_SUFFIXES) for p in folder.iterdir())


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in TOKENIZER_FILES)


def local_availability(path: str, kind: str) -> Availability:
    folder = Path(os.path.expanduser(path))
    if not folder.is_dir():
        return Availability("local folder", f"{path}: no such folder")
    if kind == "tokenizer":
        found, lacks = _has_tokenizer(folder), "tokenizer files"
    else:
        found, lacks = (folder / "tokenizer_config.json").is_file(), "config.json"
    found = found or (folder / "config.json").is_file()
    if found:
        return Availability("local folder")
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    hint = f"; it holds {', '.join(ggufs)}: name one with gguf_file (docs/cli.md)" if ggufs else ""
    return Availability("local folder", f"{path}: no {lacks} in the folder{hint}")


def availability(spec: str, revision: str | None = None, kind: str = "model") -> Availability:
    """Whether `spec` (a hub id or a local folder; `kind` model or tokenizer) can be loaded
    here, downloading nothing: the local cache first, then (only when the hub answers the
    probe) the repository's metadata. An unreachable hub switches offline mode on."""
    if is_local(spec):
        return local_availability(spec, kind)
    # even a cached model is checked for fresher files, with retries (docs/footguns.md): probe
    reachable, why = offline_unless_reachable()
    folder = snapshot(spec, revision)
    complete = folder is not None and (
        _has_tokenizer(folder) if kind == "tokenizer" else _has_weights(folder)
    )
    if folder is not None and complete:
        return Availability("in the Hugging Face cache" + ("" if reachable else " (offline)"))
    at = f" at revision {revision}" if revision else ""
    if not reachable:
        lacks = "tokenizer files" if kind == "tokenizer" else "weights"
        partly = f" (only partly: no {lacks})" if folder is not None else ""
        return Availability(
            "not cached, hub unreachable",
            f"{spec}{at} is not in the Hugging Face cache {hub_cache()}{partly} and {why}; "
            f"download it where the hub is reachable (`hf download {spec}`) into this cache "
            "(HF_HOME), or name a local folder",
        )
    problem = repo_problem(spec, revision)
    return Availability("hub, downloads when loaded", problem)


def repo_problem(repo_id: str, revision: str | None) -> str | None:
    """None if the hub has `repo_id` (at `revision`) and lets this token read it, else why not.
    One GET of the repository's metadata (no files)."""
    quoted = urllib.parse.quote(repo_id, safe="/")
    url = f"{endpoint()}/api/models/{quoted}"
    if revision:
        url += "/revision/" + urllib.parse.quote(revision, safe="")
    headers = {"User-Agent": "lidao-harness"}
    from huggingface_hub import get_token  # as transformers: HF_TOKEN, else `hf auth login`'s

    token = get_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    at = f" at revision {revision}" if revision else ""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=INFO_TIMEOUT_S
        ) as r:
            json.loads(r.read() or b"{}")
        return None
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("X-Error-Code", "") if exc.headers else ""
        if code == "RevisionNotFound":
            return f"{repo_id}: the hub has no revision {revision!r}"
        if code == "GatedRepo" or (exc.code == 403 and token):
            return f"{repo_id} is gated: accept its terms on the hub and set HF_TOKEN"
        if exc.code in (401, 403, 404):
            hint = "" if token else " (a private repository needs HF_TOKEN)"
            return f"{repo_id}{at}: not found on the hub{hint}"
        return f"{repo_id}: the hub answered {exc.code} {exc.reason}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return f"{repo_id}: the hub did not answer ({reason})"


def gguf_availability(spec: str, pinned: str | None, local: bool) -> Availability:
    """GGUF file `spec` as `validate` reports it (`check`, then its structure; `pinned`: the
    entry's `gguf_sha256`). On a cluster (`local` false) the nodes must see it: a `package:`
    file where the job's runtime environment installs the package, or a path every node mounts
    (said, not checked: a shared file system looks like a local disk from here); a URL is
    refused (docs/cluster.md)."""
    from workers.gguf import PACKAGE_PREFIX, GgufError, check, resolve

    try:
        here = resolve(spec).is_file()
        if here or local or pinned is None:
            check(spec)
    except GgufError as exc:
        if local or pinned is None or "://" in spec:
            return Availability("GGUF file", str(exc))
        here = False
    problem = structure_problem(spec) if here else None
    if problem is not None or (here and local):
        return Availability("GGUF file", problem)
    if spec.startswith(PACKAGE_PREFIX):
        dist = spec[len(PACKAGE_PREFIX) :].partition("/")[0]
        return Availability(f"GGUF file in package {dist} (the nodes install it: runtime_env pip)")
    if not here:
        return Availability("GGUF file not seen here; the nodes read it (SHA-256 pinned)")
    return Availability("GGUF file, a path: every node must see it (a shared file system)")

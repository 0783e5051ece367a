"""What `run` would hit before its first generation, checked without starting anything (no torch,
no Ray, no download): `Item`s naming a config field, what it names, where that comes from, and a
problem or None. URLs not in the download cache get one HEAD request each (in threads); hub
models are looked up in the local cache, then by metadata. This machine: `machine`."""

from __future__ import annotations

import importlib.util
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import RunConfig
from jobs.catalog import takes_head
from jobs.files import PINNED_SHA256, cached_path, os_problem
from jobs.redact import redact_text
from workers import hub
from workers.gguf import is_gguf_spec
from workers.tiny import TINY_PREFIX, check_tiny_id, report_tokenizer

URL_TIMEOUT_S = 10.0
# Scorer parameters that name a hub model (built-in scorers; read with their defaults).
SCORER_MODEL_PARAMS: dict[str, tuple[str, ...]] = {
    "perplexity": ("model",),
    "sentiment": ("model",),
    "regard": ("model",),
    "toxicity-hf": ("model",),
}
# Method parameters that name an extra model (`Needs.extra_models` of the method classes,
# which import torch; tests/test_validate_checks.py keeps the two in step).
METHOD_MODEL_PARAMS: dict[str, tuple[str, ...]] = {
    "gedi": ("gedi_model",),
    "dexperts": ("expert", "anti_expert"),
}
METHOD_FILE_PARAMS: dict[str, tuple[str, ...]] = {"uddia": ("prior",)}


@dataclass(frozen=True)
class Item:
    """One thing a run needs: `field` names it in the config (or the variable / option)."""

    field: str
    value: str
    where: str
    problem: str | None = None

    def line(self) -> str:
        return redact_text(f"{self.field}: {self.problem}")


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def probe_url(url: str, timeout_s: float = URL_TIMEOUT_S) -> str | None:
    """None when `url` answers a HEAD request (405/501: HEAD not served, the GET may be), else
    why not, in a few words."""
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "lidao-harness"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (405, 501):
            return None
        return f"HTTP {exc.code} {exc.reason}"
    except (OSError, ValueError) as exc:
        return f"unreachable ({getattr(exc, 'reason', None) or exc})"


def probe_all(urls: list[str], probe: Callable[[str], str | None]) -> dict[str, str | None]:
    """URL → `probe`'s answer, up to 8 at once."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(urls)))) as pool:
        return dict(zip(urls, pool.map(probe, urls)))


# ---- files and URLs ----------------------------------------------------------------------


def file_specs(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, path or URL) of every file the run reads before or while generating."""
    from workers.methods.registry import resolve_params

    out: list[tuple[str, str]] = []
    ds = cfg.dataset
    if ds.files:
        out += [(f"dataset.files.{group}", spec) for group, spec in ds.files.items()]
    elif ds.path or ds.kind == "realtoxicityprompts":
        out.append(("dataset.path", ds.rtp_path()))  # `path`; RTP's default URL when unset
    if cfg.gender_words and cfg.gender_words != "builtin":
        out.append(("gender_words", cfg.gender_words))
    for i, model in enumerate(cfg.models):
        if any(takes_head(m.name) and "head" not in m.params for m in cfg.methods):
            out += [(f"models.{i}.heads.{t}", h) for t, h in model.heads.items() if t in cfg.tasks]
    for j, method in enumerate(cfg.methods):
        if takes_head(method.name) and method.params.get("head") is not None:
            out.append((f"methods.{j}.params.head", str(method.params["head"])))
        for key in METHOD_FILE_PARAMS.get(method.name, ()):
            value = resolve_params(method.name, dict(method.params), cfg.models[0].id).get(key)
            if isinstance(value, str) and value:
                out.append((f"methods.{j}.params.{key}", value))
    return list(dict.fromkeys(out))


def worker_side(field: str) -> bool:
    """Read by the actors (heads, priors, models), not by the driver (prompts, words)."""
    return field.startswith(("models.", "methods.", "scorers."))


def check_files(
    specs: Iterable[tuple[str, str]],
    cache_dir: str | None,
    probe: Callable[[str], str | None],
    local: bool = True,
) -> list[Item]:
    """Local files exist; URLs are in the download cache or answer `probe` (all at once).
    With `local` false (an attached cluster), a path the actors read that this machine does
    not see is left to the nodes, as `harness.config` does for heads."""
    specs = list(specs)
    urls = sorted(
        {
            s
            for _, s in specs
            if is_url(s)
            and not cached_path(s, cache_dir).is_file()
            and not cached_path(s, None).is_file()
        }
    )
    answers = probe_all(urls, probe)
    items = []
    for field, spec in specs:
        if not is_url(spec):
            path = Path(spec).expanduser()
            try:
                ok = path.is_file() or (worker_side(field) and path.is_dir())
            except OSError as exc:  # a name too long, a loop of links...
                items.append(Item(field, spec, "UNUSABLE", os_problem(path, exc)))
                continue
            if not ok and not local and worker_side(field):
                items.append(Item(field, spec, "not seen here; the nodes read it"))
                continue
            problem = None if ok else _not_a_file(path)
            items.append(Item(field, spec, "present" if ok else "MISSING", problem))
        elif spec not in answers:
            items.append(Item(field, spec, "URL, cached"))
        elif answers[spec] is None:
            items.append(Item(field, spec, "URL, reachable (downloads)"))
        else:
            cache = cached_path(spec, cache_dir)
            problem = (
                f"{spec}: {answers[spec]}; without network, download it elsewhere and set "
                f"{field} to the local path, or put the file at {cache}"
            )
            if spec in PINNED_SHA256:
                problem += f" (SHA-256 {PINNED_SHA256[spec]})"
            items.append(Item(field, spec, "URL, NOT REACHABLE", problem))
    return items


def _not_a_file(path: Path) -> str:
    """Why `path`, not a file, cannot be read as one. A config's relative paths were made
    absolute against its folder (`harness.config.reading.resolve_paths`)."""
    if path.is_dir():
        return f"{path}: a folder, not a file; name the file in it"
    if path.exists():
        return f"{path}: not a regular file (a named pipe, a socket or a device); name a file"
    return f"{path}: no such file (a relative path in a config is read from the config's folder)"


# ---- models and tokenizers ---------------------------------------------------------------


def model_specs(cfg: RunConfig) -> list[tuple[str, str, str | None, str]]:
    """(field, id, revision, kind) of every model and tokenizer the run loads; kind "model"
    (a causal LM), "classifier" (a scorer's) or "tokenizer"."""
    from workers.methods.registry import resolve_params

    out: list[tuple[str, str, str | None, str]] = []
    for i, m in enumerate(cfg.models):
        gguf = m.gguf_spec()
        if gguf is not None:
            out.append((f"models.{i}.gguf_file", gguf, m.gguf_sha256, "gguf"))
        else:
            out.append((f"models.{i}.id", m.id, m.revision, "model"))
        if m.tokenizer:
            out.append((f"models.{i}.tokenizer", m.tokenizer, None, "tokenizer"))
    for j, method in enumerate(cfg.methods):
        for key in METHOD_MODEL_PARAMS.get(method.name, ()):
            for m in cfg.models:
                value = resolve_params(method.name, dict(method.params), m.id).get(key)
                field = f"methods.{j}.params.{key}"
                out.append((field, value if isinstance(value, str) else "", None, "model"))
    out += _scorer_models([(s.name, s.params) for s in cfg.scorers])
    unique: dict[tuple[str, str], tuple[str, str, str | None, str]] = {}
    for spec in out:
        unique.setdefault((spec[0], spec[1]), spec)
    return list(unique.values())


def check_models(
    specs: Iterable[tuple[str, str, str | None, str]], local: bool = True
) -> list[Item]:
    """Each model and tokenizer (`hub.availability`; a tiny one's name,
    `workers.tiny.check_tiny_id`, as its loader checks it); with `local` false, a local folder
    this machine does not have is left to the cluster's nodes."""
    items = []
    for field, spec, revision, kind in specs:
        if spec.startswith(TINY_PREFIX):
            problem = check_tiny_id(spec, causal=kind == "model")
            items.append(Item(field, spec, "offline random weights", problem))
            continue
        if not spec:
            items.append(Item(field, spec, "MISSING", "required: a hub id or a local folder"))
            continue
        if kind == "gguf" or is_gguf_spec(spec):
            found = hub.gguf_availability(spec, revision if kind == "gguf" else None, local)
            items.append(Item(field, spec, found.where, found.problem))
            continue
        found = hub.availability(spec, revision, kind)
        if found.problem and not local and hub.is_local(spec):
            items.append(Item(field, spec, "local folder not seen here; the nodes read it"))
            continue
        problem = found.problem
        if problem is None and kind == "model" and field.startswith(("models.", "methods.")):
            problem = hub.structure_problem(spec, revision)  # a causal LM the methods can drive
        items.append(Item(field, spec, found.where, problem))
    return items


def _scorer_models(
    scorers: Sequence[tuple[str, dict[str, Any]]], score: bool = False
) -> list[tuple[str, str, str | None, str]]:
    """(field, id, revision, "model") of each model the scorers load (`score`: named for the
    `score` command's options, not the config's fields)."""
    from workers.scorers.registry import scorer_defaults

    out = []
    for k, (name, given) in enumerate(scorers):
        keys = SCORER_MODEL_PARAMS.get(name, ())
        params = {**scorer_defaults(name), **given} if keys else {}
        for key in keys:
            field = f"scorers.{k}.params.{key}" + ("" if key in given else " (default)")
            if score:
                field = f"scorer {name}, parameter {key}"
            kind = "model" if name == "perplexity" else "classifier"
            out.append((field, str(params.get(key) or ""), params.get("revision"), kind))
    return out


def scorer_model_problems(scorers: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per model a `score` run would load and cannot (offline, not cached...)."""
    return [i.line() for i in check_models(_scorer_models(scorers, score=True)) if i.problem]


# ---- API keys and services ---------------------------------------------------------------


def check_keys(cfg: RunConfig) -> list[Item]:
    """Secrets the configured scorers read (named by variable), read as the scorer reads them
    (`workers.scorers.perspective.read_api_key`), and the services they call."""
    from workers.scorers.base import ScorerError
    from workers.scorers.perspective import read_api_key
    from workers.scorers.perspective_client import DEFAULT_ENDPOINT
    from workers.scorers.registry import scorer_defaults

    items = []
    for k, scorer in enumerate(cfg.scorers):
        if scorer.name != "perspective":
            continue
        p = {**scorer_defaults("perspective"), **scorer.params}
        if p.get("cache_only"):
            items.append(Item(f"scorers.{k}", "perspective", "cache only (no key needed)"))
            continue
        key_file = str(Path(str(p["api_key_file"])).expanduser()) if p["api_key_file"] else None
        field = f"scorers.{k}.params.api_key_file" if key_file else "PERSPECTIVE_API_KEY"
        try:
            read_api_key(key_file)
        except (ScorerError, KeyError) as exc:  # KeyError: PERSPECTIVE_API_KEY unset
            problem = str(exc).removeprefix("scorer 'perspective': ")
            if not key_file:
                problem = (
                    f"scorers.{k} (perspective) needs an API key: set PERSPECTIVE_API_KEY (or "
                    "the scorer's api_key_file parameter). To run without it now, drop "
                    "perspective from `scorers` (or set cache_only: true) and add it later "
                    "with `python -m harness score RUN --scorer perspective`"
                )
            items.append(
                Item(field, key_file or "", "key file" if key_file else "NOT SET", problem)
            )
            continue
        items.append(Item(field, key_file or "<set>", "key file" if key_file else "set"))
        endpoint = p.get("endpoint") or os.environ.get("PERSPECTIVE_API_ENDPOINT")
        field = f"scorers.{k}.params.endpoint" if p.get("endpoint") else "PERSPECTIVE_API_ENDPOINT"
        if not endpoint:
            endpoint, field = DEFAULT_ENDPOINT, f"scorers.{k} (perspective endpoint)"
        items.append(Item(field, str(endpoint), "service"))
    return items


def check_services(items: list[Item], probe: Callable[[str], str | None]) -> list[Item]:
    """The services of `check_keys` (items whose `where` is "service"), probed at once."""
    targets = [i for i in items if i.where == "service"]
    answers = probe_all([i.value for i in targets], probe)
    out = [i for i in items if i.where != "service"]
    for item in targets:
        answer = answers[item.value]
        if answer is None or answer.startswith("HTTP 4"):  # it answered: the key is its business
            out.append(Item(item.field, item.value, "reachable"))
        else:
            out.append(
                Item(
                    item.field,
                    item.value,
                    "NOT REACHABLE",
                    f"{item.value}: {answer}; without network, set the scorer's cache_only: "
                    "true (scores what its cache holds) or score later with `python -m harness score`",
                )
            )
    return out


# ---- plugins -----------------------------------------------------------------------------


def check_plugins(cfg: RunConfig) -> list[Item]:
    """The module of each plugin method / scorer class can be found here (not imported: it
    may import torch); built-in ones are part of this tree."""
    from jobs.catalog import METHODS, SCORERS

    items = []
    targets = [(f"methods.{j}", m.name, METHODS.get(m.name, "")) for j, m in enumerate(cfg.methods)]
    targets += [
        (f"scorers.{k}", s.name, SCORERS.get(s.name, "")) for k, s in enumerate(cfg.scorers)
    ]
    for field, name, target in targets:
        module = target.partition(":")[0]
        if not module or module.startswith("workers."):
            continue
        try:
            found = importlib.util.find_spec(module) is not None
            problem = (
                None if found else f"{name}: module {module!r} ({target}) is not installed here"
            )
        except Exception as exc:  # noqa: BLE001 - a parent package that fails to import
            problem = f"{name}: module {module!r} cannot be imported ({exc})"
        items.append(Item(field, target, "plugin", problem))
    return items


# ---- context length ----------------------------------------------------------------------


def check_context(cfg: RunConfig, prompts: Sequence[Any]) -> list[Item]:
    """The longest prompt plus `max_new_tokens` against each model's context, and the
    perplexity scorer's model's (it reads prompt + continuation): read from the model's config
    (`workers.hub.model_context`, no weights), the prompt counted with its tokenizer (BOS
    added) where this machine has both; a model whose config is not here is left alone."""
    from harness.stages.generation.planning import generation_for
    from workers.scorers.registry import scorer_defaults

    new = {i: generation_for(cfg, m).max_new_tokens for i, m in enumerate(cfg.models)}
    targets = [
        (f"models.{i}.id", m.gguf_spec() or m.id, m.tokenizer or m.id, m.revision, new[i])
        for i, m in enumerate(cfg.models)
    ]
    for k, s in enumerate(cfg.scorers):
        if s.name == "perplexity":
            p = {**scorer_defaults(s.name), **s.params}
            field = f"scorers.{k}.params.model"
            targets.append(
                (field, str(p["model"]), str(p["model"]), p["revision"], max(new.values()))
            )
    longest_bytes = max((len(p.text.encode()) for p in prompts), default=0)
    items = []
    for field, model, tok, revision, max_new in targets:
        context = hub.model_context(model, revision)
        if context is None or longest_bytes + 2 + max_new <= context:
            continue  # a token holds at least a byte: the longest prompt fits in any case
        try:  # a tiny model's, or from its folder or the cache
            tokenizer = report_tokenizer(
                str(Path(tok).expanduser()) if hub.is_local(tok) else tok, revision
            )
        except Exception:  # noqa: BLE001 - an unreadable tokenizer file: `check_models` says so
            continue
        if tokenizer is None:
            continue
        longest = 1 + max(len(e.ids) for e in tokenizer.encode_batch([p.text for p in prompts]))
        if longest + max_new > context:
            gen = "generation.max_new_tokens"
            if field.startswith("models.") and cfg.models[int(field.split(".")[1])].generation:
                gen = field.replace(".id", ".generation.max_new_tokens")
            items.append(
                Item(
                    gen,
                    str(max_new),
                    "too long",
                    f"{max_new} new tokens after the longest prompt ({longest} tokens) exceed "
                    f"the {context} tokens {model} ({field}) takes; lower it to at most "
                    f"{context - longest}, or shorten the prompts",
                )
            )
    return items

"""The run config: a YAML file checked by pydantic, strictly and completely, before anything runs.

Strict: unknown keys, duplicate YAML keys, a bool where a number belongs, non-finite floats,
unknown method / scorer names and method parameter values of the wrong type are errors. Complete:
every error of a file is reported at once, each naming its field (and line, for YAML errors),
with "did you mean" for misspelt keys and names.
"""

from __future__ import annotations

import copy
import difflib
import logging
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobs.redact import REDACTED, SECRET_KEYS, is_secret_key, redact_text
from jobs.spec import GenerationParams, ModelRef

log = logging.getLogger("harness")

TASKS = ("sentiment", "regard", "toxicity")
__all__ = ["SECRET_KEYS", "ConfigError", "RunConfig", "is_secret_key", "load_config"]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""


class Strict(BaseModel):
    # strict: no "3" for 3, no true for a count; allow_inf_nan: `.inf` / `.nan` are errors.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class GenerationConfig(Strict):
    max_new_tokens: int = Field(20, ge=1, le=4096)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    temperature: float = Field(1.0, gt=0.0)
    repetition_penalty: float = Field(1.0, gt=0.0)

    def params(self) -> GenerationParams:
        return GenerationParams(**self.model_dump())


class DatasetConfig(Strict):
    kind: Literal["paired-jsonl", "prompt-list"]
    files: dict[str, str] | None = None  # paired-jsonl: group → path or URL
    path: str | None = None  # prompt-list: JSONL / CSV / Parquet
    text_field: str = "prompt.text"
    limit: int | None = Field(None, ge=1)
    sha256: dict[str, str] | None = None

    @model_validator(mode="after")
    def _shape(self) -> DatasetConfig:
        if self.kind == "paired-jsonl" and not self.files:
            raise ValueError("paired-jsonl needs `files: {group: path, ...}`")
        if self.kind == "prompt-list" and not self.path:
            raise ValueError("prompt-list needs `path`")
        seen: dict[str, str] = {}
        for group, spec in (self.files or {}).items():
            if spec in seen:
                raise ValueError(f"groups {seen[spec]!r} and {group!r} name the same file {spec}")
            seen[spec] = group
        return self


class ModelConfig(Strict):
    id: str  # hub id, local folder (relative to the config's folder) or tiny-random/<family>
    name: str | None = None  # display label in tables and logs (default: the id)
    revision: str | None = None
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    tokenizer: str | None = None  # hub id or folder of another tokenizer (part of the job id)
    # Loading options passed to from_pretrained; they do not change the job id.
    trust_remote_code: bool = False
    attn_implementation: str | None = None  # e.g. "sdpa", "eager", "flash_attention_2"
    device_map: str | None = None  # e.g. "auto" (one replica over its GPUs)
    # Overrides the run's generation parameters whole. Without it, a model the paper ran gets
    # the paper's sampling parameters as defaults under what the run's `generation` sets.
    generation: GenerationConfig | None = None
    replicas: int | None = Field(None, ge=1)  # generation actors; default: one per GPU (1 on CPU)
    # GPUs per replica; default 1 when the cluster has GPUs. Below 1 replicas share a GPU;
    # above 1 (whole numbers) one replica spans several (device_map="auto"; docs/cluster.md).
    num_gpus: float | None = Field(None, ge=0)
    # Attribute head per task for methods that read one (tuned methods, PPLM): {TASK: PATH or
    # URL}. A method's own `head:` parameter overrides it for every model and task.
    heads: dict[Literal["sentiment", "regard", "toxicity"], str] = Field(default_factory=dict)
    # CPUs per replica (Ray's num_cpus); a CPU replica runs torch with this many threads.
    num_cpus: float | None = Field(None, gt=0)

    @field_validator("num_gpus")
    @classmethod
    def _whole_above_one(cls, value: float | None) -> float | None:
        if value is not None and value > 1 and value != int(value):
            raise ValueError(f"num_gpus above 1 must be a whole number, got {value}")
        return value

    @property
    def label(self) -> str:
        """What tables and logs call this model: `name`, else the id."""
        return self.name or self.id

    def ref(self) -> ModelRef:
        load = {
            "trust_remote_code": self.trust_remote_code or None,
            "attn_implementation": self.attn_implementation,
            "device_map": self.device_map,
        }
        options = tuple(sorted((k, v) for k, v in load.items() if v is not None))
        return ModelRef(self.id, self.revision, self.dtype, self.tokenizer, options)


class NamedConfig(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerConfig(NamedConfig):
    """A scorer entry; `replicas` / `num_gpus` size its actor pool (harness/stages/scoring.py)."""

    replicas: int | None = Field(None, ge=1)  # default: one per GPU of the budget (1 on CPU)
    num_gpus: float | None = Field(None, ge=0, le=1)  # default: 1 / number of GPU scorers


class RuntimeConfig(Strict):
    # jobs per batch handed to a generation actor; "auto": 8 on CPU replicas, up to
    # AUTO_GPU_BATCH on GPU replicas, which cut it to what fits (harness.stages.generation.batch_jobs)
    batch_size: int | Literal["auto"] = "auto"
    score_batch_size: int = Field(64, ge=1)
    ray_address: str | None = None  # None: RAY_ADDRESS or a local in-process Ray
    num_cpus: int | None = Field(None, ge=1)  # local Ray's logical CPUs (default: 2 × cores, ≥ 4)
    device: str | None = None  # force "cpu" or "cuda"; default: cuda if present
    max_batch_retries: int = Field(2, ge=0)
    max_actor_restarts: int = Field(2, ge=0)  # per replica: deaths before ready, in a row
    actor_start_timeout_s: float = Field(600.0, gt=0)
    progress_log_s: float = Field(30.0, gt=0)  # per-model progress lines on the driver's log
    cache_dir: str | None = None  # downloads and persistent score caches
    # GPU budget of the run: the GPUs generation reserves at once, split between the models
    # that do not set `replicas`, and the replica count of GPU scorers. Unset or `auto`: the
    # GPUs the cluster has, growing as GPU nodes join (docs/cluster.md, Placement).
    gpus: int | None = Field(None, ge=1)
    gpu_wait_s: float = Field(900.0, gt=0)  # cluster mode: how long to wait for GPUs to join
    score_call_timeout_s: float = Field(600.0, gt=0)  # one scoring chunk; then it is retried
    score_chunk_retries: int = Field(2, ge=0)  # then its rows stay unscored (re-run `score`)
    # `run` scores generation shards as they appear (harness/stages/score_follow.py): auto = the
    # scorers whose pool holds no GPU; true = every scorer; false = after generation only.
    score_during_generation: bool | Literal["auto"] = "auto"
    # Largest grid (prompts × models × methods × tasks × samples) a run may plan.
    max_jobs: int = Field(10_000_000, ge=1)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_auto(cls, value: Any) -> Any:
        return None if value == "auto" else value

    @field_validator("batch_size", mode="before")
    @classmethod
    def _batch_size(cls, value: Any) -> Any:
        if value == "auto" and isinstance(value, str):
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"a whole number >= 1 or 'auto', got {value!r}")
        return value


class AggregationConfig(Strict):
    """`aggregation:`: the perplexity filter and the bootstrap (docs/statistics.md)."""

    ppl_max: float = Field(200.0, gt=0)  # generations with a perplexity above are dropped
    n_boot: int = Field(1000, ge=0)  # bootstrap resamples; 0: no intervals
    n_perm: int = Field(200, ge=0)  # labellings of each gap's test; 0: no p-values, no bias_bc
    seed: int = 0  # seeds resamples and permutations, per (model, task)
    level: float = Field(0.95, gt=0, lt=1)  # of every interval; marks use p < 1 - level


class RunConfig(Strict):
    name: str
    dataset: DatasetConfig
    models: list[ModelConfig] = Field(min_length=1)
    methods: list[NamedConfig] = Field(min_length=1)
    tasks: list[Literal["sentiment", "regard", "toxicity"]] = Field(min_length=1)
    samples_per_prompt: int = Field(1, ge=1)
    generation: GenerationConfig = GenerationConfig()
    scorers: list[ScorerConfig] = Field(default_factory=list)
    gender_words: str | None = (
        None  # path or URL of seed words (pairs file or JSON); None: built-in
    )
    gender_words_sha256: str | None = None
    runtime: RuntimeConfig = RuntimeConfig()
    aggregation: AggregationConfig = AggregationConfig()

    @field_validator("methods", "scorers", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _unique_labels(self) -> RunConfig:
        labels = [m.label for m in self.models]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ValueError(f"models: two entries are called {', '.join(twice)} (set `name`)")
        return self

    def model_labels(self) -> dict[str, str]:
        """Model id → display label (`name`, else the id), for tables and logs."""
        return {m.id: m.label for m in self.models}

    @model_validator(mode="after")
    def _heads_match(self) -> RunConfig:
        self._check_heads()
        return self

    def _check_heads(self) -> None:
        """Each head a job will read, against its head's metadata (task, LM id, hidden size)."""
        from jobs.catalog import takes_head
        from workers.methods.head_meta import HeadMetaError, check_head_spec

        checked: set[tuple[str, str, str]] = set()
        for i, model in enumerate(self.models):
            for task, spec in model.heads.items():
                where = f"models.{i}.heads.{task}"
                if task not in self.tasks:
                    log.warning("%s: the run has no task %r; this head is not used", where, task)
                    continue
                if not any(takes_head(m.name) and "head" not in m.params for m in self.methods):
                    continue
                _check_one(check_head_spec, HeadMetaError, where, spec, model.id, task)
                checked.add((spec, model.id, task))
            for j, m in enumerate(self.methods):
                given = m.params.get("head")
                if not takes_head(m.name) or given is None:
                    continue
                for task in self.tasks:
                    if (str(given), model.id, task) not in checked:
                        where = f"methods.{j}.params.head"
                        _check_one(
                            check_head_spec, HeadMetaError, where, str(given), model.id, task
                        )
                        checked.add((str(given), model.id, task))


def _check_one(check: Any, error: type[Exception], where: str, *args: str) -> None:
    try:
        note = check(*args)
    except error as exc:
        raise ValueError(f"{where}: {exc}") from None
    if note:
        log.warning("%s: %s", where, note)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that the path `loc` (below RunConfig) points into."""
    cls: type[BaseModel] | None = RunConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part)) if cls is not None else None
        if field is None:
            return None
        cls = _model_in(field.annotation)
    return cls


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _pydantic_errors(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            owner = _model_at(loc[:-1])
            known = list(owner.model_fields) if owner is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]}?" if close else "")
        elif err["type"] in ("int_type", "float_type", "bool_type") and isinstance(
            err.get("input"), bool | str
        ):
            msg = f"{msg}, got {err['input']!r}"
        lines.append(f"  {where}: {msg}")
    return lines


def _name_errors(data: dict[str, Any]) -> list[str]:
    """Unknown method / scorer / tiny model names and bad method parameters, from the raw data."""
    from workers.methods.registry import check_method_name, resolve_params
    from workers.scorers.registry import check_scorer_name
    from workers.tiny import TINY_FAMILIES, TINY_PREFIX

    errors = []
    models = [m for m in _as_list(data.get("models")) if isinstance(m, dict)]
    model_ids = [m["id"] for m in models if isinstance(m.get("id"), str)] or ["(any)"]
    for i, m in enumerate(_as_list(data.get("methods"))):
        name, params = (m, {}) if isinstance(m, str) else (m.get("name"), m.get("params", {}))
        if not isinstance(name, str) or not isinstance(params, dict):
            continue  # the type errors are pydantic's
        try:
            check_method_name(name)
            for mid in dict.fromkeys(model_ids):
                resolve_params(name, params, mid)
        except (KeyError, ValueError) as exc:
            errors.append(f"  methods.{i}: {exc.args[0] if isinstance(exc, KeyError) else exc}")
    for i, model in enumerate(models):
        mid = model.get("id")
        if isinstance(mid, str) and mid.startswith(TINY_PREFIX):
            family = mid[len(TINY_PREFIX) :]
            if family not in TINY_FAMILIES or family == "bert":
                known = ", ".join(TINY_PREFIX + f for f in TINY_FAMILIES if f != "bert")
                errors.append(f"  models.{i}.id: unknown tiny model {mid!r}; known: {known}")
    for i, sc in enumerate(_as_list(data.get("scorers"))):
        name = sc if isinstance(sc, str) else sc.get("name") if isinstance(sc, dict) else None
        if isinstance(name, str):
            try:
                check_scorer_name(name)
            except KeyError as exc:
                errors.append(f"  scorers.{i}: {exc.args[0]}")
    return errors


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def grid_factor(cfg: RunConfig) -> int:
    """Jobs per prompt: models × methods × tasks × samples."""
    return len(cfg.models) * len(cfg.methods) * len(cfg.tasks) * cfg.samples_per_prompt


def check_grid_size(cfg: RunConfig, n_prompts: int, source: str = "<config>") -> int:
    """The grid's size, computed without building it; refused above `runtime.max_jobs`."""
    size = n_prompts * grid_factor(cfg)
    if size > cfg.runtime.max_jobs:
        raise ConfigError(
            f"{source}: the grid has {size:,} jobs ({n_prompts:,} prompts × {len(cfg.models)} "
            f"models × {len(cfg.methods)} methods × {len(cfg.tasks)} tasks × "
            f"{cfg.samples_per_prompt:,} samples), more than runtime.max_jobs = "
            f"{cfg.runtime.max_jobs:,}; lower it or raise max_jobs"
        )
    return size


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    """Validate `data`; every error found is reported at once in one ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    errors = []
    cfg = None
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        errors += _pydantic_errors(exc)
    errors += _name_errors(data)
    if cfg is not None and not errors:
        try:
            check_grid_size(cfg, 1, source)  # refuse an absurd grid before reading prompts
        except ConfigError as exc:
            errors.append("  " + str(exc).split(": ", 1)[1])
    if errors:
        raise ConfigError(
            "\n".join([f"{source}: invalid config ({len(errors)} error(s))", *errors])
        )
    assert cfg is not None
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (naming it and both lines)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it
            if not duplicate:
                seen[key] = line
            else:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e-3` and `1e9` as strings (its floats need a dot); YAML 1.2 and
# every user read them as numbers: `lr: 1e-3` must not fail as "must be a number".
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text strictly (duplicate keys refused); errors name `source` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        raise ConfigError(
            f"{source}:{where} not valid YAML ({getattr(exc, 'problem', None) or exc})"
        ) from None


def read_text(path: str | Path, what: str = "config") -> str:
    """A UTF-8 text file; unreadable or binary input names the file (and line of a bad byte)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            f"is this a {what} file?"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{path}: line {line}: a NUL byte; is this a {what} file?")
    return text


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read and validate a YAML config; relative dataset and model paths resolve against its
    folder. `overrides` (command-line options, see `apply_overrides`) apply before validation,
    so the snapshot written beside the outputs records them."""
    p = Path(path)
    data = load_yaml(read_text(p), str(path))
    overrides = dict(overrides or {})
    sets = overrides.pop("set", None) or []
    if isinstance(data, dict):
        data = apply_sets(data, sets, str(path))
        data = _resolve_paths(data, p.resolve().parent)
        if overrides:
            data = apply_overrides(data, overrides)
    try:
        return parse_config(data, str(path))
    except ConfigError as exc:
        if not sets:
            raise
        given = ", ".join(f"--set {_shown(s)}" for s in sets)
        raise ConfigError(f"{exc}\n  (with {given})") from None


# ---- `--set KEY=VALUE` (run / validate): any field of the config ----------------------------


# List entries that may be given as a bare string, and the field that string is.
_NAMED = {"methods": "name", "scorers": "name", "models": "id"}


def _shown(item: str) -> str:
    """A `KEY=VALUE` setting for a message: a secret-looking key's value replaced."""
    key, eq, raw = item.partition("=")
    last = key.strip().rsplit(".", 1)[-1]
    return f"{key}={REDACTED}" if eq and is_secret_key(last) else redact_text(item)


def apply_sets(data: dict[str, Any], sets: list[str], source: str) -> dict[str, Any]:
    """`data` with each `KEY=VALUE` applied, as if written in the file (so relative paths
    resolve against the config's folder): KEY is a dotted path whose numbers index lists
    (`models.0.dtype`, `methods.1.params.gamma`, `aggregation.n_boot`), VALUE is read as YAML
    (`3` a number, `true` a bool, `[a, b]` a list, `null`). A method or scorer given by name
    only (`- vanilla`) becomes `{name: vanilla}` when a field below it is set.

    Raises:
        ConfigError: a malformed setting, an index past a list's end, a path through a
            value that is not a mapping or a list; the message names the key.
    """
    out = copy.deepcopy(data)
    for item in sets:
        key, eq, raw = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not eq or not key or any(not part for part in parts):
            raise ConfigError(
                f"--set {_shown(item)!r}: expected KEY=VALUE (e.g. models.0.dtype=bfloat16)"
            )
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(f"--set {key}: the value is not valid YAML ({problem})") from None
        node: Any = out
        for depth, part in enumerate(parts):
            here = ".".join(parts[: depth + 1])
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit():
                    raise ConfigError(
                        f"--set {key}: {'.'.join(parts[:depth]) or source} is a list; "
                        f"index it with a number (0 to {len(node) - 1}), not {part!r}"
                    )
                index = int(part)
                if index > len(node):
                    raise ConfigError(
                        f"--set {key}: {'.'.join(parts[:depth])} has {len(node)} entries "
                        f"(index {index}; {len(node)} appends one)"
                    )
                if index == len(node):
                    node.append({})
                if last:
                    node[index] = value
                    break
                if isinstance(node[index], str) and depth == 1 and parts[0] in _NAMED:
                    node[index] = {_NAMED[parts[0]]: node[index]}
                if node[index] is None:
                    node[index] = {}
                node = node[index]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                    break
                if node.get(part) is None:
                    node[part] = [] if parts[depth + 1].isdigit() else {}
                node = node[part]
            else:
                raise ConfigError(
                    f"--set {key}: {'.'.join(parts[:depth])} is {node!r}, not a mapping or a "
                    f"list, so it has no field {here.rsplit('.', 1)[-1]!r}"
                )
    return out


# Command-line override → where it goes in the config.
OVERRIDES = {
    "limit": ("dataset", "limit"),
    "samples": ("samples_per_prompt",),
    "batch_size": ("runtime", "batch_size"),
    "device": ("runtime", "device"),
    "address": ("runtime", "ray_address"),
}


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` with command-line overrides: `limit`, `samples`, `batch_size`, `device` set their
    fields; `models` / `methods` (lists of names) keep the config's entries of those names
    (a model by id or `name`) and add plain entries for the others, in the order given."""
    out = dict(data)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in OVERRIDES:
            *parents, leaf = OVERRIDES[key]
            node = out
            for part in parents:
                node[part] = dict(node.get(part) or {})
                node = node[part]
            node[leaf] = value
        elif key == "models":
            have = [m for m in _as_list(out.get("models")) if isinstance(m, dict)]
            out["models"] = [_pick(have, v, ("id", "name"), "id") for v in value]
        elif key == "methods":
            have = [{"name": m} if isinstance(m, str) else m for m in _as_list(out.get("methods"))]
            out["methods"] = [_pick(have, v, ("name",), "name") for v in value]
        else:
            raise ConfigError(f"unknown override {key!r}")
    return out


def _pick(entries: list[Any], wanted: str, keys: tuple[str, ...], new_key: str) -> Any:
    for entry in entries:
        if isinstance(entry, dict) and any(entry.get(k) == wanted for k in keys):
            return entry
    if new_key == "id" and _looks_local(wanted, Path.cwd()):
        wanted = str(Path(wanted).expanduser().resolve())
    return {new_key: wanted}


def _looks_local(value: str, base: Path) -> bool:
    """A model or tokenizer given as a path: explicit (./, ../, /, ~) or an existing folder."""
    return value.startswith((".", "/", "~")) or (base / value).is_dir()


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    def fix(value: Any) -> Any:
        if not isinstance(value, str) or "://" in value or value == "builtin":
            return value
        candidate = Path(value).expanduser()
        return str(candidate if candidate.is_absolute() else (base / candidate).resolve())

    out = dict(data)
    ds = out.get("dataset")
    if isinstance(ds, dict):
        ds = dict(ds)
        if isinstance(ds.get("files"), dict):
            ds["files"] = {k: fix(v) for k, v in ds["files"].items()}
        if "path" in ds:
            ds["path"] = fix(ds["path"])
        out["dataset"] = ds
    if out.get("gender_words") is not None:
        out["gender_words"] = fix(out["gender_words"])
    if isinstance(out.get("models"), list):
        models = []
        for m in out["models"]:
            if isinstance(m, dict):
                m = dict(m)
                for key in ("id", "tokenizer"):
                    value = m.get(key)
                    if isinstance(value, str) and _looks_local(value, base):
                        m[key] = fix(value)
                if isinstance(m.get("heads"), dict):
                    m["heads"] = {t: fix(h) for t, h in m["heads"].items()}
            models.append(m)
        out["models"] = models
    return out


def redact(obj: Any) -> Any:
    """`obj` (plain data) with secret-looking keys' values and URL credentials replaced."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(str(k)) and v else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def redacted(config: RunConfig) -> dict[str, Any]:
    """The config as a plain dict with every secret-looking parameter and URL token replaced."""
    return redact(config.model_dump(mode="json"))  # type: ignore[no-any-return]


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(redacted(config), sort_keys=False)

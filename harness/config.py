"""The run config: a YAML file checked by pydantic (unknown keys are errors)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobs.spec import GenerationParams, ModelRef

log = logging.getLogger("harness")

TASKS = ("sentiment", "regard", "toxicity")
SECRET_KEYS = ("key", "token", "password", "secret", "credentials")


def is_secret_key(name: str) -> bool:
    """`api_key`, `token`, `aws_secret`... (exact names or `_`-suffixes; not `max_new_tokens`)."""
    low = name.lower()
    return any(low == s or low.endswith("_" + s) for s in SECRET_KEYS)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
        return self


class ModelConfig(Strict):
    id: str
    revision: str | None = None
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
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

    def ref(self) -> ModelRef:
        return ModelRef(self.id, self.revision, self.dtype)


class NamedConfig(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerConfig(NamedConfig):
    """A scorer entry; `replicas` / `num_gpus` size its actor pool (harness/scoring.py)."""

    replicas: int | None = Field(None, ge=1)  # default: one per GPU of the budget (1 on CPU)
    num_gpus: float | None = Field(None, ge=0, le=1)  # default: 1 / number of GPU scorers


class RuntimeConfig(Strict):
    batch_size: int = Field(8, ge=1)
    score_batch_size: int = Field(64, ge=1)
    ray_address: str | None = None  # None: RAY_ADDRESS or a local in-process Ray
    num_cpus: int | None = Field(None, ge=1)  # local Ray's logical CPUs (default: 2 × cores, ≥ 4)
    device: str | None = None  # force "cpu" or "cuda"; default: cuda if present
    max_batch_retries: int = Field(2, ge=0)
    max_actor_restarts: int = Field(2, ge=0)  # per replica: deaths before ready, in a row
    actor_start_timeout_s: float = Field(600.0, gt=0)
    progress_log_s: float = Field(30.0, gt=0)  # per-model progress lines on the driver's log
    cache_dir: str | None = None  # downloads and persistent score caches
    # GPU budget of the run on a cluster: asked of the autoscaler, and the replica count of
    # models and GPU scorers that do not set `replicas` (docs/cluster.md, Placement).
    gpus: int | None = Field(None, ge=1)
    gpu_wait_s: float = Field(900.0, gt=0)  # cluster mode: how long to wait for GPUs to join
    score_call_timeout_s: float = Field(600.0, gt=0)  # one scoring chunk; then it is retried
    score_chunk_retries: int = Field(2, ge=0)  # then its rows stay unscored (re-run `score`)


class AggregationConfig(Strict):
    """`aggregation:`: the perplexity filter and the bootstrap (docs/statistics.md)."""

    ppl_max: float = Field(200.0, gt=0)  # generations with a perplexity above are dropped
    n_boot: int = Field(1000, ge=0)  # bootstrap resamples; 0: no intervals
    n_perm: int = Field(200, ge=0)  # permutations of each gap's test; 0: no p-values
    seed: int = 0  # seeds resamples and permutations, per (model, task)
    level: float = Field(0.95, gt=0, lt=1)  # confidence level of the percentile intervals


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
    def _registered(self) -> RunConfig:
        from workers.methods.registry import check_method_name, resolve_params
        from workers.scorers.registry import check_scorer_name

        for i, m in enumerate(self.methods):
            try:
                check_method_name(m.name)
                for model in self.models:
                    resolve_params(m.name, m.params, model.id)
            except (KeyError, ValueError) as exc:
                raise ValueError(f"methods.{i}: {exc}") from None
        from workers.tiny import TINY_FAMILIES, TINY_PREFIX

        for i, model in enumerate(self.models):
            tiny = model.id.startswith(TINY_PREFIX)
            family = model.id[len(TINY_PREFIX) :]
            if tiny and (family not in TINY_FAMILIES or family == "bert"):
                known = ", ".join(TINY_PREFIX + f for f in TINY_FAMILIES if f != "bert")
                raise ValueError(f"models.{i}.id: unknown tiny model {model.id!r}; known: {known}")
        for i, s in enumerate(self.scorers):
            try:
                check_scorer_name(s.name)
            except KeyError as exc:
                raise ValueError(f"scorers.{i}: {exc.args[0]}") from None
        self._check_heads()
        return self

    def _check_heads(self) -> None:
        """Each head a job will read, against its head's metadata (task, LM id, hidden size)."""
        from workers.methods.head_meta import HeadMetaError, check_head_spec
        from workers.methods.registry import takes_head

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


def _format_errors(path: str, exc: ValidationError) -> str:
    lines = [f"{path}: invalid config ({exc.error_count()} error(s))"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML config; relative dataset paths resolve against its folder."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        raise ConfigError(
            f"{path}:{where} not valid YAML ({getattr(exc, 'problem', exc)})"
        ) from None
    if isinstance(data, dict):
        data = _resolve_paths(data, p.resolve().parent)
    return parse_config(data, str(path))


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    def fix(value: Any) -> Any:
        if not isinstance(value, str) or "://" in value or value == "builtin":
            return value
        candidate = Path(value).expanduser()
        return str(candidate if candidate.is_absolute() else (base / candidate))

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
        out["models"] = [
            {**m, "heads": {t: fix(h) for t, h in m["heads"].items()}}
            if isinstance(m, dict) and isinstance(m.get("heads"), dict)
            else m
            for m in out["models"]
        ]
    return out


def redacted(config: RunConfig) -> dict[str, Any]:
    """The config as a plain dict with every secret-looking parameter replaced."""

    def scrub(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {
                k: ("<redacted>" if is_secret_key(k) and v else scrub(v)) for k, v in obj.items()
            }
        if isinstance(obj, list):
            return [scrub(v) for v in obj]
        return obj

    return scrub(config.model_dump(mode="json"))  # type: ignore[no-any-return]


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(redacted(config), sort_keys=False)

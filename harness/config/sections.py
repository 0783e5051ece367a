"""The config's sections as strict pydantic models, `RunConfig` the whole file.

Each model checks its own fields; `RunConfig` also checks what spans sections: unique model
labels and the attribute heads a job will read (against each head's metadata).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from jobs.spec import GenerationParams, ModelRef
from workers import hub
from workers.gguf import PACKAGE_PREFIX, GgufError, is_gguf_spec
from workers.gguf import identity as gguf_identity

log = logging.getLogger("harness")


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


RTP_ONLY = ("challenging", "toxicity_bins", "sample_seed")  # realtoxicityprompts' filters


def _distinct_groups(groups: list[str]) -> None:
    """Refuse two group names that differ only in their Unicode normalisation ("é" as one
    code point or as e + a combining accent): they print alike but would be two groups."""
    first: dict[str, str] = {}
    for group in groups:
        other = first.setdefault(unicodedata.normalize("NFC", group), group)
        if other != group:
            raise ValueError(
                f"files: groups {ascii(other)} and {ascii(group)} are the same name in two "
                "Unicode normalisations (they print alike); write them alike"
            )


class DatasetConfig(Strict):
    kind: Literal["paired-jsonl", "prompt-list", "realtoxicityprompts"]
    files: dict[str, str] | None = None  # paired-jsonl: group → path or URL
    # prompt-list: JSONL / CSV / Parquet; realtoxicityprompts: its JSONL (default: jobs.files.RTP_URL)
    path: str | None = None
    text_field: str = "prompt.text"
    limit: int | None = Field(None, ge=1)
    sha256: dict[str, str] | None = None
    # realtoxicityprompts only (jobs.datasets.RtpFilter): the challenging subset, [low, high)
    # bins of prompt.toxicity, and `limit` as a sample drawn by this seed instead of the first N
    challenging: bool = False
    toxicity_bins: list[list[float]] | None = None
    sample_seed: int | None = None

    def rtp_path(self) -> str:
        """realtoxicityprompts: `path`, else the public JSONL."""
        from jobs.files import RTP_URL

        return self.path or RTP_URL

    @model_validator(mode="after")
    def _shape(self) -> DatasetConfig:
        if self.kind != "realtoxicityprompts":
            # a default written back by dump_config (the run's config.yaml) is not a choice
            given = [f for f in RTP_ONLY if getattr(self, f) != type(self).model_fields[f].default]
            if given:
                raise ValueError(f"{', '.join(given)}: only for kind realtoxicityprompts")
        for pair in self.toxicity_bins or []:
            if len(pair) != 2 or not 0.0 <= pair[0] < pair[1] <= 1.0:
                raise ValueError(f"toxicity_bins: {pair} is not a range [low, high] within [0, 1]")
        if self.kind == "paired-jsonl" and not self.files:
            raise ValueError("paired-jsonl needs `files: {group: path, ...}`")
        if self.kind == "prompt-list" and not self.path:
            raise ValueError("prompt-list needs `path`")
        if self.kind == "paired-jsonl" and self.path:  # one source of prompts, never two
            raise ValueError("path: not read by kind paired-jsonl (it reads `files`); drop it")
        if self.kind != "paired-jsonl" and self.files is not None:
            raise ValueError(f"files: not read by kind {self.kind} (it reads `path`); drop it")
        seen: dict[str, str] = {}
        for group, spec in (self.files or {}).items():
            if spec in seen:
                raise ValueError(f"groups {seen[spec]!r} and {group!r} name the same file {spec}")
            seen[spec] = group
        _distinct_groups(list(self.files or {}))
        return self


class ModelConfig(Strict):
    # hub id, local folder (relative to the config's folder), tiny-random/<family>, or a GGUF
    # file (a .gguf path or package:DIST/FILE); optional when `gguf_file` names the file
    id: str
    name: str | None = None  # display label in tables and logs (default: the id)
    # A GGUF file: its path, `package:DIST/FILE` (a file an installed distribution holds), or,
    # with `id` a local folder, a file name in that folder (transformers' form). docs/cli.md.
    gguf_file: str | None = None
    # The GGUF file's SHA-256 (the model's identity in job ids): computed when the file is
    # here; given, it lets a machine without the file plan the run, and the loader checks it.
    gguf_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")
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

    @model_validator(mode="before")
    @classmethod
    def _gguf_id(cls, data: Any) -> Any:
        """`gguf_file` alone: the id is the file; an id that names a GGUF file: `gguf_file` too."""
        if isinstance(data, dict):
            spec = data.get("gguf_file")
            if data.get("id") is None and isinstance(spec, str):
                data = {**data, "id": spec}
            elif spec is None and isinstance(data.get("id"), str) and is_gguf_spec(data["id"]):
                data = {**data, "gguf_file": data["id"]}
        return data

    @model_validator(mode="after")
    def _gguf_checked(self) -> ModelConfig:
        """The GGUF file is here, is GGUF, of an architecture transformers reads; its SHA-256
        becomes `gguf_sha256` (written into the run's config.yaml: a pin for later reads)."""
        spec = self.gguf_spec()
        if spec is None:
            return self
        if self.revision is not None:
            raise ValueError("revision: a GGUF file has no revision (its SHA-256 identifies it)")
        try:
            digest = gguf_identity(spec, self.gguf_sha256)
        except GgufError as exc:
            raise ValueError(f"gguf_file: {exc}") from None
        object.__setattr__(self, "gguf_sha256", digest)  # frozen: set once, while validating
        return self

    def gguf_spec(self) -> str | None:
        """The GGUF file this entry loads (a path or package:DIST/FILE), None for other models.

        Raises:
            ValueError: transformers' form (`id` a folder) with a `gguf_file` that is not a
                plain file name in it.
        """
        if self.gguf_file is None:
            return None
        if self.gguf_file == self.id:
            return self.gguf_file
        if self.gguf_file.startswith(PACKAGE_PREFIX) or "/" in self.gguf_file:
            raise ValueError(
                f"gguf_file: with id {self.id!r} (a folder), gguf_file is a file name in it, "
                f"got {self.gguf_file!r}; or drop id and give the file's path or package: form"
            )
        if not hub.is_local(self.id):
            raise ValueError(
                f"gguf_file: id {self.id!r} is not a local folder; a GGUF file on the hub is "
                "read from a local copy (download it, then give its path)"
            )
        return str(Path(self.id).expanduser() / self.gguf_file)

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
        gguf = self.gguf_spec()
        return ModelRef(
            self.id, self.revision, self.dtype, self.tokenizer, options, gguf, self.gguf_sha256
        )


class NamedConfig(Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ScorerConfig(NamedConfig):
    """A scorer entry; `replicas` / `num_gpus` size its actor pool (harness/stages/scoring.py)."""

    replicas: int | None = Field(None, ge=1)  # default: one per GPU of the budget (1 on CPU)
    num_gpus: float | None = Field(None, ge=0, le=1)  # default: 1 / number of GPU scorers


class RuntimeConfig(Strict):
    # jobs per batch handed to a generation actor; "auto": 8 on CPU replicas, up to
    # AUTO_GPU_BATCH on GPU replicas, which cut it to what fits (harness.stages.generation.stage.batch_jobs)
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
    # `run` scores generation shards as they appear (harness/stages/scoring/follow.py): auto = the
    # scorers whose pool holds no GPU; true = every scorer; false = after generation only.
    score_during_generation: bool | Literal["auto"] = "auto"
    # Largest grid (prompts × models × methods × tasks × samples) a run may plan.
    max_jobs: int = Field(10_000_000, ge=1)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        # torch takes many device types; the harness places models on CPUs and CUDA GPUs only
        if value is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", value):
            raise ValueError(f"cpu, cuda or cuda:N, got {value!r}")
        return value

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
    gender_words: str | None = None  # path or URL of seed words (pairs or JSON); None: built-in
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

    @model_validator(mode="after")
    def _distinct_models(self) -> RunConfig:
        """Two entries of one model (the same GGUF file named two ways, one id under two
        names) would plan the same jobs twice."""
        seen: dict[str, int] = {}
        for i, model in enumerate(self.models):
            first = seen.setdefault(repr(sorted(model.ref().identity().items())), i)
            if first != i:
                raise ValueError(
                    f"models: entries {first} and {i} are the same model (the same job ids); "
                    "drop one, or give them another dtype"
                )
        return self

    @model_validator(mode="after")
    def _heads_match(self) -> RunConfig:
        """Each head a job will read, against its head's metadata (task, LM id, hidden size)."""
        from jobs.catalog import takes_head
        from workers.methods.head_meta import HeadMetaError, check_head_spec

        checked: set[tuple[str, str, str]] = set()

        def check(where: str, spec: str, model: str, task: str) -> None:
            try:
                note = check_head_spec(spec, model, task)
            except HeadMetaError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if note:
                log.warning("%s: %s", where, note)
            checked.add((spec, model, task))

        for i, model in enumerate(self.models):
            for task, spec in model.heads.items():
                where = f"models.{i}.heads.{task}"
                if task not in self.tasks:
                    log.warning("%s: the run has no task %r; this head is not used", where, task)
                elif any(takes_head(m.name) and "head" not in m.params for m in self.methods):
                    check(where, spec, model.gguf_spec() or model.id, task)
            for j, m in enumerate(self.methods):
                given = m.params.get("head")
                for task in self.tasks if takes_head(m.name) and given is not None else []:
                    lm = model.gguf_spec() or model.id
                    if (str(given), lm, task) not in checked:
                        check(f"methods.{j}.params.head", str(given), lm, task)
        return self

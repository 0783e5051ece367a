"""Frozen job specs and their identity.

A job is one (prompt, seed, method, model, task) generation. Its id hashes exactly the
fields that change its output; batch size, paths, retries and the run name are not part of it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Bump when the meaning of the hashed fields changes (e.g. a new decoding convention), so
# that old run directories are not silently resumed with incompatible outputs.
# 2: device-hashed uniforms and BOS-free repetition penalty change every text.
# 3: the nucleus is drawn from in token-id order (chosen by probability as before), so that
#    rounding that swaps two near-equal tokens no longer changes the token: every text changes.
# 4: an exponential race on noise hashed from (rng seed, step, token id) over a nucleus cut
#    with a tolerance (`workers.sampler`); DExperts' and GeDi's cuts too: every text changes.
JOB_ID_VERSION = 4


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the stable text that ids are hashed from."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters shared by every method."""

    max_new_tokens: int = 20
    top_p: float = 0.9
    temperature: float = 1.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class ModelRef:
    """A causal LM: hub id, local path, GGUF file or `tiny-random/<family>`, with revision and
    dtype. A GGUF model (`gguf`: a path or `package:DIST/FILE`) is identified by its file's
    SHA-256, not by where the file lies, so the same file at another path gives the same ids."""

    id: str
    revision: str | None = None
    dtype: str = "float32"
    tokenizer: str | None = None  # another tokenizer than the model's (hashed only when set)
    # Loading options that do not change what is sampled (trust_remote_code,
    # attn_implementation, device_map), as sorted (key, value) pairs; never hashed.
    load: tuple[tuple[str, object], ...] = ()
    gguf: str | None = None  # the GGUF file the model is loaded from (`workers.gguf.resolve`)
    gguf_sha256: str | None = None  # its SHA-256: hashed instead of `id` and `revision`

    def identity(self) -> dict[str, Any]:
        """The hashed fields: those of JOB_ID_VERSION 1 (a GGUF model: its file's SHA-256 in
        place of id and revision), plus `tokenizer` only when set."""
        out: dict[str, Any] = {"id": self.id, "revision": self.revision, "dtype": self.dtype}
        if self.gguf_sha256 is not None:
            out = {"gguf_sha256": self.gguf_sha256, "dtype": self.dtype}
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
        return out


@dataclass(frozen=True)
class JobSpec:
    """One generation job.

    `method_params` is the canonical JSON of the method's effective parameters (defaults
    resolved), so that two spellings of the same setting give the same id.
    """

    prompt_id: str
    prompt: str
    prompt_group: str
    pair_id: str | None
    seed: int
    method: str
    model: ModelRef
    task: str
    generation: GenerationParams = field(default_factory=GenerationParams)
    method_params: str = "{}"

    def identity(self) -> dict[str, Any]:
        """The output-affecting fields, as hashed into `job_id`.

        `prompt_id` is included so that two prompts with the same text in different groups
        stay two rows; `pair_id` and `prompt_group` are derived from it and excluded.
        """
        return {
            "v": JOB_ID_VERSION,
            "prompt_id": self.prompt_id,
            "prompt": self.prompt,
            "seed": self.seed,
            "method": self.method,
            "method_params": json.loads(self.method_params),
            "model": self.model.identity(),
            "task": self.task,
            "generation": asdict(self.generation),
        }

    @functools.cached_property
    def job_id(self) -> str:
        """Computed once per spec (frozen, so it cannot go stale) and kept in its `__dict__`."""
        digest = hashlib.sha256(canonical_json(self.identity()).encode("utf-8")).hexdigest()
        return f"j{JOB_ID_VERSION}-{digest[:20]}"

    @property
    def rng_seed(self) -> int:
        """Seed of this job's private sampling RNG.

        Derived from the prompt and the seed only (not the method), so every method draws the
        same noise for the same (prompt, seed): a method whose distribution equals vanilla's
        reproduces vanilla token for token, and method comparisons use common random numbers.
        """
        text = f"{self.seed}\x00{self.prompt}".encode()
        return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & ((1 << 63) - 1)

    def params(self) -> dict[str, Any]:
        return dict(json.loads(self.method_params))

    def to_row(self) -> dict[str, Any]:
        """Flat row for the plan table (see `results.schema.PLAN_SCHEMA`)."""
        return {column: get(self) for column, get in _PLAN_FIELDS.items()}


# The plan table's columns (`results.schema.PLAN_SCHEMA` order) → how a `JobSpec` gives each.
_PLAN_FIELDS = {
    column: operator.attrgetter(path)
    for column, path in {
        **{c: c for c in ("job_id", "prompt_id", "pair_id", "prompt_group", "prompt", "seed")},
        "method": "method",
        "method_params": "method_params",
        "model": "model.id",
        "model_revision": "model.revision",
        "model_dtype": "model.dtype",
        "task": "task",
        **{
            c: f"generation.{c}"
            for c in ("max_new_tokens", "top_p", "temperature", "repetition_penalty")
        },
    }.items()
}


def plan_columns(jobs: Sequence[JobSpec]) -> dict[str, list[Any]]:
    """The plan table of `jobs` as columns: what `JobSpec.to_row` gives row by row, built
    without a dict per job."""
    return {column: list(map(get, jobs)) for column, get in _PLAN_FIELDS.items()}


# In the order their keys sort, so the order they stand in the canonical JSON.
_SENTINELS = {"prompt": "\x00prompt\x00", "prompt_id": "\x00prompt_id\x00", "seed": "\x00seed\x00"}


def job_id_maker(template: JobSpec) -> Callable[[str, str, int], str] | None:
    """`(prompt_id, prompt, seed) → job_id` for the jobs that differ from `template` only in
    those three fields (one grid slice): the same text as `JobSpec.job_id` hashes, built from
    pieces serialised once instead of a dict per job (~10× faster). None if the template's
    text cannot be split (then use `job_id`)."""
    probe = dataclasses.replace(
        template, prompt_id=_SENTINELS["prompt_id"], prompt=_SENTINELS["prompt"]
    )
    text = canonical_json({**probe.identity(), "seed": _SENTINELS["seed"]})
    marks = [json.dumps(v) for v in _SENTINELS.values()]
    if any(text.count(m) != 1 for m in marks) or sorted(marks, key=text.index) != marks:
        return None
    a, b, c, d = re.split("|".join(map(re.escape, marks)), text)
    prefix = f"j{JOB_ID_VERSION}-"
    dumps = json.dumps

    def make(prompt_id: str, prompt: str, seed: int) -> str:
        body = (
            a + dumps(prompt, ensure_ascii=False) + b + dumps(prompt_id, ensure_ascii=False) + c
            + str(int(seed)) + d
        )  # fmt: skip
        return prefix + hashlib.sha256(body.encode("utf-8")).hexdigest()[:20]

    return make

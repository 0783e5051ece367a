"""Planning work: job specs and their ids, input files and prompt datasets, seed words, the grid,
batching; what methods and scorers exist, with their parameters, is in `jobs.catalog`."""

from jobs.datasets import (
    Prompt,
    RtpFilter,
    load_paired_jsonl,
    load_prompt_list,
    load_realtoxicityprompts,
)
from jobs.files import DatasetError, fetch
from jobs.grid import PlanChunk, SliceKey, expand_grid, iter_plan
from jobs.queue import make_batches, pending, pending_chunks
from jobs.spec import JOB_ID_VERSION, GenerationParams, JobSpec, ModelRef
from jobs.words import GroupWords, label_text, load_group_words

__all__ = [
    "JOB_ID_VERSION",
    "DatasetError",
    "GenerationParams",
    "GroupWords",
    "JobSpec",
    "ModelRef",
    "PlanChunk",
    "Prompt",
    "RtpFilter",
    "SliceKey",
    "expand_grid",
    "fetch",
    "iter_plan",
    "label_text",
    "load_group_words",
    "load_paired_jsonl",
    "load_prompt_list",
    "load_realtoxicityprompts",
    "make_batches",
    "pending",
    "pending_chunks",
]

"""Planning work: job specs and their ids, prompt datasets, seed words, the grid, batching."""

from jobs.datasets import DatasetError, Prompt, fetch, load_paired_jsonl, load_prompt_list
from jobs.grid import expand_grid
from jobs.queue import make_batches, pending
from jobs.spec import JOB_ID_VERSION, GenerationParams, JobSpec, ModelRef
from jobs.words import GroupWords, label_text, load_group_words

__all__ = [
    "JOB_ID_VERSION",
    "DatasetError",
    "GenerationParams",
    "GroupWords",
    "JobSpec",
    "ModelRef",
    "Prompt",
    "expand_grid",
    "fetch",
    "label_text",
    "load_group_words",
    "load_paired_jsonl",
    "load_prompt_list",
    "make_batches",
    "pending",
]

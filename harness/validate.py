"""`harness validate CONFIG`: everything a run would check up front, with nothing started.

Reads the prompt files (they are counted), never builds the grid, starts no Ray, loads no
model and imports no torch. Prints the plan's counts per model × method × task and what each
job needs: the model (offline, local folder, or in the Hugging Face cache), its attribute
heads, the prompt and word files. Problems are listed together; any problem exits 2.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from harness.catalog import hub_cache
from harness.config import ModelConfig, RunConfig, check_grid_size
from jobs.datasets import default_cache_dir, url_basename
from workers.tiny import TINY_PREFIX

# Methods whose steps read an attribute head (param `head`; None = the task's default head).
HEAD_METHODS = ("uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod", "pplm")


def _where_model(model_id: str) -> tuple[str, bool]:
    """(how `model_id` resolves, whether that is a problem)."""
    if model_id.startswith(TINY_PREFIX):
        return "offline random weights", False
    if os.path.isabs(model_id):
        ok = (Path(model_id) / "config.json").is_file() or (
            Path(model_id) / "tokenizer_config.json"
        ).is_file()
        return ("local folder" if ok else "local folder MISSING (no config.json)"), not ok
    cached = (hub_cache() / ("models--" + model_id.replace("/", "--"))).is_dir()
    return ("in the Hugging Face cache" if cached else "hub id, not cached (downloads)"), False


def _where_file(spec: str, cache_dir: str | None) -> tuple[str, bool]:
    if spec.startswith(("http://", "https://")):
        name = hashlib.sha256(spec.encode()).hexdigest()[:16] + "-" + url_basename(spec)
        cached = (Path(cache_dir or default_cache_dir()) / "downloads" / name).is_file()
        return ("URL, cached" if cached else "URL, not cached (downloads)"), False
    ok = Path(spec).expanduser().is_file()
    return ("present" if ok else "MISSING"), not ok


def _head_of(model: ModelConfig, method_params: dict[str, Any], task: str) -> Any:
    if method_params.get("head") is not None:
        return method_params["head"]
    heads = getattr(model, "heads", None)  # per-task heads of the model entry, where declared
    if isinstance(heads, dict):
        return heads.get(task)
    return None


def validate(cfg: RunConfig, source: str) -> tuple[list[str], int]:
    """(report lines, number of problems) for `cfg`; raises on unreadable prompts."""
    from harness.driver import load_prompts, load_words
    from workers.methods.registry import resolve_params

    lines: list[str] = []
    problems = 0
    words = load_words(cfg)
    prompts = load_prompts(cfg, words)
    total = check_grid_size(cfg, len(prompts), source)
    per_cell = len(prompts) * cfg.samples_per_prompt
    lines.append(
        f"{source}: valid; {len(prompts)} prompts × {cfg.samples_per_prompt} samples = "
        f"{per_cell} jobs per model × method × task; {total} jobs in all"
    )
    cache = cfg.runtime.cache_dir
    files = dict(cfg.dataset.files or {}) or {"path": cfg.dataset.path or ""}
    if cfg.gender_words:
        files["gender_words"] = cfg.gender_words
    for key, spec in files.items():
        state, bad = _where_file(spec, cache)
        problems += bad
        lines.append(f"  file {key}: {spec} ({state})")
    for model in cfg.models:
        state, bad = _where_model(model.id)
        problems += bad
        label = f"{model.label} [{model.id}]" if model.name else model.id
        lines.append(f"  model {label}: {state}")
        if model.tokenizer:
            state, bad = _where_model(model.tokenizer)
            problems += bad
            lines.append(f"    tokenizer {model.tokenizer}: {state}")
        for method in cfg.methods:
            params = resolve_params(method.name, dict(method.params), model.id)
            for task in cfg.tasks:
                need = ""
                if method.name in HEAD_METHODS:
                    head = _head_of(model, params, task)
                    if head is None and model.id.startswith(TINY_PREFIX):
                        need = "; head: random (tiny model)"
                    elif head is None:
                        need, problems = "; head: MISSING (set `head:`)", problems + 1
                    else:
                        state, bad = _where_file(str(head), cache)
                        need, problems = f"; head {head}: {state}", problems + bad
                lines.append(f"    {method.name} × {task}: {per_cell} jobs{need}")
    names = ", ".join(s.name for s in cfg.scorers) or "none"
    lines.append(f"  scorers: {names}")
    lines.append(f"{problems} problem(s); nothing was started")
    return lines, problems

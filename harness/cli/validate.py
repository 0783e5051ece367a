"""`harness validate CONFIG`: everything `run` would hit before its first generation, with
nothing started; `run` (and `score`, for its models) run the same checks first.

Reads the prompt files (they are counted), never builds the grid, starts no Ray, loads no
model and imports no torch (`harness.cli.preflight`). Prints the plan's counts per model × method ×
task and what each job needs: files and URLs (reachable, cached), models and tokenizers (local
folder, Hugging Face cache, the hub), attribute heads, API keys, devices, the output, plugins.
Every problem is listed, each naming its config field or variable; any problem exits 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from harness.cli.estimates import cpu_only_here, estimate_lines, log_estimates
from harness.cli.machine import check_cluster, check_devices, check_output, is_local_run
from harness.cli.method_checks import Facts, check_instruction_context, check_methods
from harness.cli.options import overrides
from harness.cli.preflight import (
    Item,
    check_context,
    check_files,
    check_keys,
    check_models,
    check_plugins,
    check_services,
    file_specs,
    model_specs,
    probe_url,
)
from harness.config import ConfigError, ModelConfig, RunConfig, check_grid_size, load_config
from jobs.catalog import takes_head
from jobs.datasets import Prompt
from jobs.files import DatasetError
from jobs.redact import printable, redact_text
from workers.tiny import TINY_PREFIX


def validate_main(args: argparse.Namespace) -> int:
    """The `validate` subcommand: the report; exit 2 when it lists a problem."""
    cfg = load_config(args.config, overrides(args))
    lines, problems = validate(cfg, args.config, out=args.out, pilot=args.pilot)
    print(printable("\n".join(lines)))
    return 2 if problems else 0


def _dataset_lines(
    cfg: RunConfig, prompts: list[Prompt], pilot: str | None, problems: list[str]
) -> list[str]:
    """Prompts and pairs (`--limit` / dataset.limit counts pairs in a paired dataset), and with
    `--pilot RUN` the MDE of the planned pairs (or prompts) × samples per prompt (a pilot that
    cannot plan, such as a missing folder, adds to `problems`, named `--pilot`)."""
    limit = f"; limit {cfg.dataset.limit}" if cfg.dataset.limit else ""
    pairs = len({p.pair_id for p in prompts})
    if cfg.dataset.kind != "paired-jsonl":
        lines = [f"  dataset: {len(prompts)} prompts{limit} (--limit counts prompts)"]
    else:
        groups = len(cfg.dataset.files or {})
        lines = [
            f"  dataset: {pairs} pairs × {groups} groups = {len(prompts)} prompts{limit} "
            "(--limit counts pairs)"
        ]
    if pilot:
        from harness.cli.power import pilot_lines
        from results.run.store import StoreError

        units = pairs if cfg.dataset.kind == "paired-jsonl" else len(prompts)
        try:
            lines += pilot_lines(pilot, units, cfg.samples_per_prompt)
        except StoreError as exc:
            problems.append(f"--pilot: {exc}")
    return lines


def validate(
    cfg: RunConfig,
    source: str,
    out: str | None = None,
    use_ray: bool = True,
    probe: Any = probe_url,
    pilot: str | None = None,
) -> tuple[list[str], int]:
    """(report lines, number of problems) for `cfg`; `out`: the run directory, checked when
    given; without problems, the dataset's sizes after the header (with `pilot`, a run, their
    MDE). Problems are counted and listed (each naming its field), never raised, so the report
    holds all of them; a grid over `runtime.max_jobs` still raises `ConfigError`."""
    # imported here, not at the top: harness.stages loads Ray's module (and `main` then stops Ray)
    from harness.stages.generation.reservation import budget_for, request_budget

    local = is_local_run(cfg, use_ray)
    files = check_files(file_specs(cfg), cfg.runtime.cache_dir, probe, local)
    problems = _file_problems(files)
    lines, prompts = _counted(cfg, source, files, problems)
    n_prompts = None if prompts is None else len(prompts)
    problems += [i.line() for i in check_context(cfg, prompts or [])]
    specs = model_specs(cfg)
    models = {(i.field, i.value): i for i in check_models(specs, local)}
    problems += [i.line() for i in models.values() if i.problem]
    facts = Facts()  # each model's config and tokenizer, read once
    problems += [i.line() for i in check_methods(cfg, facts)]
    problems += [i.line() for i in check_instruction_context(cfg, prompts or [], facts)]
    lines += _plan_lines(cfg, n_prompts, files, models, problems)
    lines += estimate_lines(cfg, n_prompts, local, use_ray)  # CPU replicas, then times
    lines.append(f"  scorers: {', '.join(s.name for s in cfg.scorers) or 'none'}")
    cpu = cpu_only_here(cfg, local, use_ray)
    budget = budget_for([], None, None, 0.0) if cpu else request_budget(cfg)
    lines.append(f"  {budget.line()}")  # what generation will ask Ray for
    keys = check_services(check_keys(cfg), probe)
    lines += [f"  {item.field}: {item.where}" for item in keys]
    checks = check_plugins(cfg) + check_devices(cfg, local)
    checks += check_cluster(cfg, use_ray)
    if out is not None:
        checks.append(check_output(out))
    lines += [f"  {item.field}: {item.value} ({item.where})" for item in checks]
    problems += [i.line() for i in keys + checks if i.problem]
    if not problems and prompts is not None:
        lines[1:1] = _dataset_lines(cfg, prompts, pilot, problems)
    if problems:
        lines.append(f"problems ({len(problems)}):")
        lines += [f"  {p}" for p in problems]
    lines.append(f"{len(problems)} problem(s); nothing was started")
    return [redact_text(line) for line in lines], len(problems)


READ_HERE = ("dataset.", "gender_words")  # fields of the files the driver reads itself


def _counted(
    cfg: RunConfig, source: str, files: list[Item], problems: list[str]
) -> tuple[list[str], list[Prompt] | None]:
    """The header line with the plan's size (prompts read when their files are there; a bad
    prompt file adds to `problems`), the prompt and word files; and the prompts."""
    from harness.stages.generation.planning import load_prompts, load_words

    prompts = None
    if any(i.problem for i in files if i.field.startswith(READ_HERE)):
        head = f"{source}: well-formed; prompts not counted (a prompt or word file is missing)"
    else:
        try:
            prompts = load_prompts(cfg, load_words(cfg))
        except DatasetError as exc:  # named by the field of its file, where it names one
            text = str(exc)
            named = [i.field for i in files if text.startswith(f"{i.value}:")]
            problems.append(f"{named[0]}: {text}" if named else text)
            head = f"{source}: well-formed; prompts not counted (see the problems below)"
    if prompts is not None:
        n_prompts = len(prompts)
        total = check_grid_size(cfg, n_prompts, source)
        head = (
            f"{source}: well-formed; {n_prompts} prompts × {cfg.samples_per_prompt} samples = "
            f"{n_prompts * cfg.samples_per_prompt} jobs per model × method × task; "
            f"{total} jobs in all"
        )
    listed = [
        f"  file {i.field}: {i.value} ({i.where})" for i in files if i.field.startswith(READ_HERE)
    ]
    return [head, *listed], prompts


def _plan_lines(
    cfg: RunConfig,
    n_prompts: int | None,
    files: list[Item],
    models: dict[tuple[str, str], Item],
    problems: list[str],
) -> list[str]:
    """Per model: where it comes from, then per method × task its jobs and head (a missing head
    of a real model adds to `problems`); then the methods' other files and extra models."""
    from workers.methods.registry import resolve_params

    by_field = {i.field: i for i in files}
    jobs = f"{n_prompts * cfg.samples_per_prompt} jobs" if n_prompts is not None else "? jobs"
    lines = []
    for m_index, model in enumerate(cfg.models):
        label = f"{model.label} [{model.id}]" if model.name else model.id
        found = models.get((f"models.{m_index}.id", model.id)) or models.get(
            (f"models.{m_index}.gguf_file", model.gguf_spec() or "")
        )
        lines.append(f"  model {label}: {found.where if found else 'offline random weights'}")
        if model.tokenizer:
            tok = models.get((f"models.{m_index}.tokenizer", model.tokenizer))
            lines.append(f"    tokenizer {model.tokenizer}: {tok.where if tok else 'offline'}")
        for j, method in enumerate(cfg.methods):
            params = resolve_params(method.name, dict(method.params), model.id)
            for task in cfg.tasks:
                need = ""
                if takes_head(method.name):
                    need = _head_need(model, m_index, j, params, task, by_field)
                    if need.startswith("; head: MISSING"):
                        problems.append(
                            f"models.{m_index}.heads.{task}: {method.name} on {model.label} "
                            f"needs an attribute head for {task}; set it (or methods.{j}."
                            "params.head)"
                        )
                lines.append(f"    {method.name} × {task}: {jobs}{need}")
    for item in files:
        if item.field.startswith("methods.") and not item.field.endswith(".head"):
            lines.append(f"  file {item.field}: {item.value} ({item.where})")
    for item in models.values():
        if not item.field.startswith("models."):
            lines.append(f"  model {item.field}: {item.value or '-'} ({item.where})")
    return lines


def _head_need(
    model: ModelConfig,
    m_index: int,
    j: int,
    params: dict[str, Any],
    task: str,
    by_field: dict[str, Item],
) -> str:
    """`; head ...` of one model × method × task: random, MISSING, or the file and its state."""
    given = params.get("head")
    head = given if given is not None else model.heads.get(task)  # type: ignore[call-overload]
    if head is None:
        return (
            "; head: random (tiny model)"
            if model.id.startswith(TINY_PREFIX)
            else ("; head: MISSING (set `head:`)")
        )
    given = params.get("head") is not None and f"methods.{j}.params.head" in by_field
    item = by_field.get(f"methods.{j}.params.head" if given else f"models.{m_index}.heads.{task}")
    return f"; head {head}: {item.where if item else 'present'}"


def _file_problems(files: list[Item]) -> list[str]:
    """One line per file with a problem; a URL several fields name is one line naming them all
    (the paper's config gives one head to five methods)."""
    groups: dict[str, list[Item]] = {}
    for item in files:
        if item.problem:
            groups.setdefault(item.value, []).append(item)
    lines = []
    for items in groups.values():
        first, names = items[0], [i.field for i in items]
        text = str(first.problem)
        if len(names) > 1:
            text = text.replace(f"set {first.field} ", "set them ")
        lines.append(redact_text(f"{', '.join(names)}: {text}"))
    return lines


def refuse_on_problems(cfg: RunConfig, source: str, out: str, use_ray: bool = True) -> None:
    """`run`'s first step: the checks of `validate`; raises `ConfigError` listing every problem
    before anything starts (no Ray, no run directory, no model)."""
    lines, problems = validate(cfg, source, out=out, use_ray=use_ray)
    if problems:
        start = lines.index(next(line for line in lines if line.startswith("problems (")))
        listed = lines[start + 1 : -1]
        if problems == 1:  # one line, like every other bad-input error
            raise ConfigError(f"{source}: {listed[0].strip()} (nothing was started)")
        head = f"{source}: {problems} problem(s); nothing was started (`validate` shows the plan)"
        raise ConfigError("\n".join([head, *listed]))
    log_estimates(lines)

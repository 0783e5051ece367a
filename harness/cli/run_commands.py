"""The commands that write a run directory: `run`, `score` and `aggregate`.

Each records itself in the run's history (`results.run.invoke.driven`) and ends with the run's
status or its output files. The driver (and with it Ray's module) is imported when a command
runs, never when the command line is parsed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from harness.cli.machine import check_cluster
from harness.cli.options import overrides
from harness.cli.preflight import scorer_model_problems
from harness.cli.status import failed_methods, output_lines, print_status
from harness.cli.tracking import check_trackers, track
from harness.cli.validate import refuse_on_problems
from harness.config import ConfigError, RunConfig, dump_config, load_config, parse_config
from jobs.redact import printable
from results.run.history import Invocation, config_hash
from results.run.identity import plan_ids, read_config, require_plan
from results.run.store import RunStore

RETRY_EXIT = 3  # rows failed for a transient reason: a plain `score RUN` retries them


def run_main(args: argparse.Namespace) -> int:
    """`run CONFIG --out DIR`: plan, generate, score and aggregate."""
    from harness import driver
    from results.run.invoke import check_interrupt, driven

    cfg = load_config(args.config, overrides(args))
    check_trackers(args.wandb, args.tensorboard)
    use_ray = not args.no_ray
    refuse_on_problems(cfg, args.config, args.out, use_ray)  # `validate` first: all at once
    store = RunStore(args.out)
    with driven(store, "run") as inv:
        inv.config_hash = config_hash(dump_config(cfg))
        if use_ray:
            from harness.stages.generation.ray_runtime import init_ray

            init_ray(cfg.runtime.ray_address, cfg.runtime.num_cpus)
        try:
            result = driver.run(
                cfg,
                args.out,
                use_ray=use_ray,
                progress=not args.no_progress,
                retry_failed=args.retry_failed,
                replan=getattr(args, "replan", False),
                invocation=inv,
            )
            check_interrupt()  # one swallowed on the way still ends the command as interrupted
        except KeyboardInterrupt as exc:
            from results.run.invoke import interrupted

            interrupt = interrupted(exc)
            interrupt.args = (_interrupted_line(store),)
            raise interrupt from None
        gen = result["generation"]
        line = (
            f"run {cfg.name}: {result['jobs']} jobs planned, {gen['pending_at_start']} generated "
            f"now; outputs in {args.out}"
        )
        print(printable(line))  # the name and path as `validate` and `status` show them
        _after_aggregation(store, args)
    print_status(store)
    failed = failed_methods(store) + _failed_scorers(result["scoring"], args.out)
    if failed:  # a stage that ran but made nothing of a method or scorer is not a success
        raise RuntimeError("\n  ".join(failed))
    return _retry_exit(result["scoring"], args.out)


def score_main(args: argparse.Namespace) -> int:
    """`score RUN`: the scores a run lacks (or all of them again, `--overwrite`)."""
    from harness import driver
    from harness.stages.scoring import selection as scorer_selection
    from results.run.invoke import driven

    check_trackers(args.wandb, args.tensorboard)
    store = RunStore(args.run)
    cfg = _config_for(args.run, args.config)
    scorers = scorer_selection.scorers_to_run(
        cfg, args.scorer, getattr(args, "set", None), getattr(args, "cache_only", False)
    )  # validated before Ray starts
    missing = scorer_model_problems(scorers)  # offline: fails now, not after hub retries
    use_ray = not args.no_ray
    attach = cfg  # the cluster it attaches to must answer, or ray.init waits minutes
    if args.address:
        runtime = cfg.runtime.model_copy(update={"ray_address": args.address})
        attach = cfg.model_copy(update={"runtime": runtime})
    missing += [i.line() for i in check_cluster(attach, use_ray) if i.problem]
    if missing:
        raise ConfigError("\n".join(missing))
    require_plan(store)  # a deleted plan is an error, never silently rebuilt (ids not read)
    overwrite = bool(getattr(args, "overwrite", False))
    aggregate = not getattr(args, "no_aggregate", False)
    with driven(store, "score") as inv:
        inv.extra["scorers"] = [{"name": n, "params": p} for n, p in scorers]
        if overwrite:
            inv.extra["overwrite"] = True
        scorer_selection.record_scorers(store, scorers)
        if use_ray:
            from harness.stages.generation.ray_runtime import init_ray

            init_ray(args.address or cfg.runtime.ray_address, cfg.runtime.num_cpus)
        t0 = time.perf_counter()
        words = driver.load_words(cfg)
        if overwrite:
            from results.run.overwrite import score_overwriting

            stats = score_overwriting(
                store,
                [n for n, _ in scorers],
                lambda staged: driver.score_stage(staged, cfg, words, use_ray, scorers=scorers),
            )
        else:
            stats = driver.score_stage(store, cfg, words, use_ray, scorers=scorers)
        inv.stage("scoring", stats, time.perf_counter() - t0)
        for name, st in stats.items():
            missing, retry = (st["status"].get(k, 0) for k in ("missing", "retry"))
            extra = f"; {missing} not scored (missing)" if missing else ""
            extra += f"; {retry} failed for now (to retry)" if retry else ""
            again = " (old scores replaced)" if overwrite else ""
            print(
                f"{name}: scored {st['scored'] - missing - retry} rows{again} "
                f"(version {st['version']}){extra}"
            )
        if aggregate:
            use = scorer_selection.scorer_preference(cfg, [n for n, _ in scorers], store)
            _aggregate(store, inv, args, use, f"summary.parquet: re-aggregated ({', '.join(use)})")
    if aggregate:
        print("\n".join(output_lines(store)))
    failed = _failed_scorers(stats, args.run)
    if failed:
        raise RuntimeError("\n  ".join(failed))
    return _retry_exit(stats, args.run)


def _failed_scorers(stats: dict[str, Any], run: str) -> list[str]:
    """One line per scorer whose every row of this stage is a permanent error (non-finite
    scores, a text no model can take...): like a method that failed every job, exit 1."""
    lines = []
    for name, st in stats.items():
        errors = int((st.get("status") or {}).get("error", 0))
        if errors and errors == st.get("scored") and not st.get("skipped"):
            lines.append(
                f"scorer {name}: all {errors} rows it scored are errors; their messages: "
                f"the `error` column of {run}/scores/{name}/ (`python -m harness status {run}`)"
            )
    return lines


def _retry_exit(stats: dict[str, Any], run: str) -> int:
    """`RETRY_EXIT` and one line on stderr when rows failed for a transient reason (a rate
    limit, a 5xx, a timeout, out of memory...: `retry` rows, never written), else 0."""
    total, parts = 0, []
    for name, st in stats.items():
        kinds = st.get("retry_kinds") or {}
        count = int((st.get("status") or {}).get("retry", 0))
        if count:
            total += count
            parts.append(f"{name}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    if not total:
        return 0
    print(
        f"{total} rows failed for a transient reason ({'; '.join(parts)}); "
        f"run `python -m harness score {run}` to retry them",
        file=sys.stderr,
    )
    return RETRY_EXIT


def aggregate_main(args: argparse.Namespace) -> int:
    """`aggregate RUN`: the summary tables from what is scored."""
    from results.run.invoke import driven

    check_trackers(args.wandb, args.tensorboard)
    options = {"ppl_max": args.ppl_max, "n_boot": args.n_boot, "seed": args.seed}
    store = RunStore(args.run)
    require_plan(store)
    with driven(store, "aggregate") as inv:
        given = {k: v for k, v in options.items() if v is not None}
        _aggregate(store, inv, args, args.use_scorer, None, **given)
    print("\n".join(output_lines(store)))  # (kept with -q, as `run -q` keeps them)
    return 0


def _aggregate(
    store: RunStore,
    inv: Invocation,
    args: argparse.Namespace,
    use: list[str] | None,
    said: str | None,
    **options: Any,
) -> None:
    """The aggregate stage, timed into the invocation; prints `said` (else the stage's result),
    then writes results.json and feeds the trackers."""
    from harness import driver

    t0 = time.perf_counter()
    result = driver.aggregate_stage(store, use=use, **options)
    inv.stage("aggregate", {"use": use}, time.perf_counter() - t0)
    if not getattr(args, "quiet", 0):  # -q: not the stage's lines (what it wrote)
        print(result if said is None else said)
    _after_aggregation(store, args)


def _config_for(run_dir: str, path: str | None) -> RunConfig:
    """The config given, else the snapshot stored in the run directory."""
    if path:
        return load_config(path)
    store = RunStore(run_dir)
    raw = read_config(store)  # checked against what the plan recorded
    if raw is not None:
        return parse_config(raw, f"{run_dir}/config.yaml")
    if not store.exists("plan.parquet") and not store.list_shards("generations"):
        raise ConfigError(
            f"{run_dir}: not a run directory (no config.yaml, plan.parquet or generations); "
            f"`python -m harness run CONFIG --out {run_dir}` makes one"
        )
    raise ConfigError(f"{run_dir}: no config.yaml in the run directory; pass --config FILE")


def _after_aggregation(store: RunStore, args: argparse.Namespace) -> None:
    """results.json, then the trackers asked for (`--wandb`, `--tensorboard`)."""
    from results.report.results_json import write_results_json

    write_results_json(store)
    for line in track(store, args.wandb, args.tensorboard):
        print(line)


def _interrupted_line(store: RunStore) -> str:
    try:
        ids = plan_ids(store)
        done = len(ids & store.done_job_ids())
        return f"interrupted after {done} of {len(ids)} jobs; run the same command to resume"
    except Exception:  # noqa: BLE001 - the line must come out whatever the run dir holds
        return "interrupted; run the same command to resume"

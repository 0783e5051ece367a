"""`python -m harness {run,status,score,aggregate,validate,list,export,train-head,token-prior,compare}`
(also installed as the `lidao-harness` command).

Exit codes: 0 done, 1 a stage failed at run time, 2 bad input (config, files, names).
`-v` / `-q` / `--include MODULE` go before or after the subcommand.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from harness.cli.compare import add_compare_args, compare_main
from harness.cli.samples import add_samples_args
from harness.config import ConfigError, RunConfig, load_config, load_yaml, parse_config
from harness.progress import setup_logging
from harness.tools.token_prior import add_token_prior_args, token_prior_main
from harness.tools.train_head import add_train_head_args, train_head_main
from jobs.files import DatasetError
from jobs.redact import redact_text
from results.run.store import RunStore, StoreError
from results.stats.join import JoinError

log = logging.getLogger("harness")


def _config_for(run_dir: str, path: str | None) -> RunConfig:
    """The config given, else the snapshot stored in the run directory."""
    if path:
        return load_config(path)
    store = RunStore(run_dir)
    if not store.exists("config.yaml"):
        raise ConfigError(f"{run_dir}: no config.yaml in the run directory; pass --config FILE")
    source = f"{run_dir}/config.yaml"
    return parse_config(load_yaml(store.read_text("config.yaml"), source), source)


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The common-field overrides given on the command line (None: not given)."""

    def names(values: list[str] | None) -> list[str] | None:
        if not values:
            return None
        return [n.strip() for v in values for n in v.split(",") if n.strip()]

    return {
        "limit": args.limit,
        "samples": args.samples,
        "batch_size": args.batch_size,
        "device": args.device,
        "address": getattr(args, "address", None),
        "models": names(args.models),
        "methods": names(args.methods),
        "set": list(getattr(args, "set", None) or []),
    }


def cmd_run(args: argparse.Namespace) -> int:
    from harness import driver
    from harness.cli.validate import refuse_on_problems
    from results.run.invoke import check_interrupt, driven

    cfg = load_config(args.config, overrides(args))
    _check_trackers(args)
    use_ray = not args.no_ray
    refuse_on_problems(cfg, args.config, args.out, use_ray)  # `validate` first: all at once
    store = RunStore(args.out)
    with driven(store, "run") as inv:
        inv.config_hash = _config_hash(cfg)
        if use_ray:
            from harness.stages.ray_runtime import init_ray

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
        print(
            f"run {cfg.name}: {result['jobs']} jobs planned, {gen['pending_at_start']} generated "
            f"now; outputs in {args.out}"
        )
        _after_aggregation(store, args)
    return _print_status(store)


def _check_trackers(args: argparse.Namespace) -> None:
    """`--wandb` / `--tensorboard` without their package: refused before any work."""
    from harness.cli.tracking import check_trackers

    check_trackers(getattr(args, "wandb", None), getattr(args, "tensorboard", None))


def _after_aggregation(store: RunStore, args: argparse.Namespace) -> None:
    """results.json, then the trackers asked for (`--wandb`, `--tensorboard`)."""
    from harness.cli.tracking import track
    from results.report.results_json import write_results_json

    write_results_json(store)
    for line in track(store, getattr(args, "wandb", None), getattr(args, "tensorboard", None)):
        print(line)


def _config_hash(cfg: RunConfig) -> str:
    from harness.config import dump_config
    from results.run.history import config_hash

    return config_hash(dump_config(cfg))


def _interrupted_line(store: RunStore) -> str:
    try:
        from results.run.identity import plan_ids

        ids = plan_ids(store)
        done = len(ids & store.done_job_ids())
        return f"interrupted after {done} of {len(ids)} jobs; run the same command to resume"
    except Exception:  # noqa: BLE001 - the line must come out whatever the run dir holds
        return "interrupted; run the same command to resume"


def cmd_status(args: argparse.Namespace) -> int:
    store = RunStore(args.run)
    if not store.exists("plan.parquet") and not store.exists("config.yaml"):
        raise StoreError(f"{args.run}: not a run directory (no plan.parquet, no config.yaml)")
    return _print_status(store)


def _print_status(store: RunStore) -> int:
    from harness.cli.status import run_status

    print(run_status(store))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from harness import driver
    from harness.cli.machine import check_cluster
    from harness.cli.preflight import scorer_model_problems
    from results.run.identity import plan_ids
    from results.run.invoke import driven

    _check_trackers(args)
    store = RunStore(args.run)
    cfg = _config_for(args.run, args.config)
    scorers = driver.scorers_to_run(
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
    plan_ids(store)  # a deleted plan is an error, never silently rebuilt
    overwrite = bool(getattr(args, "overwrite", False))
    with driven(store, "score") as inv:
        inv.extra["scorers"] = [{"name": n, "params": p} for n, p in scorers]
        if overwrite:
            inv.extra["overwrite"] = True
        driver.record_scorers(store, scorers)
        if use_ray:
            from harness.stages.ray_runtime import init_ray

            init_ray(args.address or cfg.runtime.ray_address, cfg.runtime.num_cpus)
        t0 = time.perf_counter()
        words = driver.load_words(cfg)
        if overwrite:
            from harness.cli.overwrite import score_overwriting

            stats = score_overwriting(store, cfg, words, use_ray, scorers)
        else:
            stats = driver.score_stage(store, cfg, words, use_ray, scorers=scorers)
        inv.stage("scoring", stats, time.perf_counter() - t0)
        for name, st in stats.items():
            missing = st["status"].get("missing", 0)
            extra = f"; {missing} not scored (missing)" if missing else ""
            again = " (old scores replaced)" if overwrite else ""
            print(
                f"{name}: scored {st['scored'] - missing} rows{again} "
                f"(version {st['version']}){extra}"
            )
        if not getattr(args, "no_aggregate", False):
            t0 = time.perf_counter()
            use = driver.scorer_preference(cfg, [n for n, _ in scorers], store.scorers())
            driver.aggregate_stage(store, use=use)
            inv.stage("aggregate", {"use": use}, time.perf_counter() - t0)
            print(f"summary.parquet: re-aggregated ({', '.join(use)})")
            _after_aggregation(store, args)
    if not getattr(args, "no_aggregate", False):
        from harness.cli.status import output_lines

        print("\n".join(output_lines(store)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from harness.cli.validate import validate

    cfg = load_config(args.config, overrides(args))
    lines, problems = validate(cfg, args.config, out=args.out)
    counts = [] if problems else _dataset_lines(cfg)  # a second read only of what validate read
    print("\n".join([*lines[:1], *counts, *lines[1:]]))
    return 2 if problems else 0


def _dataset_lines(cfg: RunConfig) -> list[str]:
    """Prompts and pairs (`--limit` / dataset.limit counts pairs in a paired dataset)."""
    from harness import driver

    try:  # read (or fetched into the cache) by validate already
        prompts = driver.load_prompts(cfg, driver.load_words(cfg))
    except (DatasetError, OSError):  # validate has listed the problem
        return []
    limit = f"; limit {cfg.dataset.limit}" if cfg.dataset.limit else ""
    if cfg.dataset.kind != "paired-jsonl":
        return [f"  dataset: {len(prompts)} prompts{limit} (--limit counts prompts)"]
    pairs = len({p.pair_id for p in prompts})
    groups = len(cfg.dataset.files or {})
    return [
        f"  dataset: {pairs} pairs × {groups} groups = {len(prompts)} prompts{limit} "
        "(--limit counts pairs)"
    ]


def cmd_list(args: argparse.Namespace) -> int:
    from harness.cli.listing import catalog

    print("\n".join(catalog(args.what)))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from harness import driver
    from results.run.identity import plan_ids
    from results.run.invoke import driven

    _check_trackers(args)
    options = {"ppl_max": args.ppl_max, "n_boot": args.n_boot, "seed": args.seed}
    store = RunStore(args.run)
    plan_ids(store)  # a deleted plan is an error, never silently rebuilt
    with driven(store, "aggregate") as inv:
        t0 = time.perf_counter()
        result = driver.aggregate_stage(
            store,
            use=args.use_scorer,
            **{k: v for k, v in options.items() if v is not None},
        )
        inv.stage("aggregate", {"use": args.use_scorer}, time.perf_counter() - t0)
        print(result)
        _after_aggregation(store, args)
    from harness.cli.status import output_lines

    print("\n".join(output_lines(store)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from harness.cli.export import export_to_hub

    store = RunStore(args.run)
    if not store.exists("config.yaml"):
        raise StoreError(f"{args.run}: not a run directory (no config.yaml)")
    if store.exists("summary.parquet") and not store.exists("results.json"):
        from results.report.results_json import write_results_json

        write_results_json(store)  # a run aggregated by an older version
    try:
        done = export_to_hub(store, args.hub, private=args.private, revision=args.revision)
    except ImportError as exc:
        raise RuntimeError(str(exc)) from None
    except Exception as exc:  # huggingface_hub's HTTP errors: one line, no traceback
        if isinstance(exc, (RuntimeError, OSError)) and not _is_hub_error(exc):
            raise
        raise RuntimeError(f"export to {args.hub}: {_first_line(exc)}") from None
    print(f"exported {len(done['files'])} files of {args.run} to {done['repo']}")
    print(f"commit: {done['commit']}")
    return 0


def _is_hub_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith(("huggingface_hub", "httpx", "requests"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_text(text[0] if text else type(exc).__name__)


def version_text() -> str:
    """The installed distribution's version, else the checkout's pyproject.toml."""
    from results.run.history import git_commit, harness_version

    version = harness_version()
    if version == "unknown":
        import re
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M)
        except OSError:
            found = None
        version = found.group(1) if found else version
    commit = git_commit()
    return f"lidao-harness {version}" + (f" (git {commit})" if commit else "")


def _os_error(exc: OSError) -> str:
    """One line naming the path: `PATH: No space left on device`."""
    if exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc).replace("\n", " ")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless it is None / False or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


def _common() -> argparse.ArgumentParser:
    """Options accepted before and after the subcommand (SUPPRESS: the subcommand's copy sets
    them only when given, so `harness -v run ...` and `harness run ... -v` both work)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument(
        "-v", "--verbose", action="count", default=argparse.SUPPRESS, help="debug logging"
    )
    c.add_argument(
        "-q", "--quiet", action="count", default=argparse.SUPPRESS, help="warnings and errors only"
    )
    c.add_argument(
        "--include",
        action="append",
        metavar="MODULE",
        default=argparse.SUPPRESS,
        help="import MODULE first: it may register methods / scorers (repeatable)",
    )
    return c


def _add_overrides(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overrides of the config (recorded in the run's config.yaml)")
    g.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="dataset.limit: the first N pairs of a paired dataset (N × groups prompts), the "
        "first N prompts of a prompt list",
    )
    g.add_argument("--models", action="append", metavar="ID,...", help="only these models")
    g.add_argument("--methods", action="append", metavar="NAME,...", help="only these methods")
    g.add_argument("--samples", type=int, metavar="N", help="samples_per_prompt")
    g.add_argument("--device", help="runtime.device: cpu, cuda, cuda:1 ...")
    g.add_argument("--batch-size", type=_batch_size, metavar="N|auto", help="runtime.batch_size")
    g.add_argument("--address", metavar="HOST:PORT", help=ADDRESS_HELP)
    g.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="any field, as a dotted path (models.0.dtype=bfloat16, generation.top_p=0.8, "
        "methods.1.params.gamma=0.5); VALUE read as YAML (repeatable)",
    )


ADDRESS_HELP = (
    "runtime.ray_address: attach to this Ray cluster (or `auto`); without it and without "
    "RAY_ADDRESS the run starts a Ray instance of its own, whatever else runs on the machine"
)


def _add_tracking(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracking (optional extras: wandb, tensorboard)")
    g.add_argument(
        "--wandb", metavar="PROJECT", help="log the summary and figures to this W&B project"
    )
    g.add_argument(
        "--tensorboard", metavar="DIR", help="write the summary and figures as TensorBoard events"
    )


def _batch_size(text: str) -> int | str:
    """`--batch-size`: a whole number, or `auto` (the config checks the range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or 'auto', got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    p = argparse.ArgumentParser(
        prog="lidao-harness",
        description="Batch evaluation of decoding-time debiasing methods (also: python -m harness)",
        parents=[common],
    )
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str, **kw: object) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common], **kw)  # type: ignore[arg-type]

    r = add("run", "plan, generate, score and aggregate a config")
    r.add_argument("config", help="YAML config file")
    r.add_argument("--out", required=True, help="run directory (local path or s3:// / gs:// URI)")
    r.add_argument("--no-ray", action="store_true", help="run in this process, without Ray")
    r.add_argument("--no-progress", action="store_true", help="no progress bars (Ray's too)")
    r.add_argument(
        "--retry-failed", action="store_true", help="generate again the jobs that failed"
    )
    r.add_argument(
        "--replan",
        action="store_true",
        help="replace a run directory's plan with this config's (old rows kept, not counted)",
    )
    _add_overrides(r)
    _add_tracking(r)
    r.set_defaults(func=cmd_run)
    v = add("validate", "check a config completely and print its plan; starts nothing")
    v.add_argument("config", help="YAML config file")
    v.add_argument("--out", help="also check that this run directory can be written")
    _add_overrides(v)
    v.set_defaults(func=cmd_validate)
    ls = add("list", "methods, scorers or models with their parameters and defaults")
    ls.add_argument("what", choices=("methods", "scorers", "models"))
    ls.set_defaults(func=cmd_list)
    s = add("status", "planned / done / failed per stage")
    s.add_argument("run")
    s.set_defaults(func=cmd_status)
    sc = add("score", "(re)score an existing run: only what is missing")
    sc.add_argument("run")
    sc.add_argument(
        "--scorer",
        action="append",
        help="this scorer (repeatable): the config's, or any registered one with its defaults",
    )
    sc.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a parameter of the --scorer (NAME.KEY=VALUE with several; value read as YAML)",
    )
    sc.add_argument(
        "--cache-only",
        action="store_true",
        help="perspective: score from its cache only; the rest is reported missing",
    )
    sc.add_argument(
        "--no-aggregate", action="store_true", help="do not rewrite summary.parquet after"
    )
    sc.add_argument(
        "--overwrite",
        action="store_true",
        help="score every row again, replacing the scorer's scores (kept until the new ones "
        "are all written)",
    )
    sc.add_argument("--config", help="config with the scorers (default: the run's config.yaml)")
    sc.add_argument("--address", metavar="HOST:PORT", help=ADDRESS_HELP)
    sc.add_argument("--no-ray", action="store_true")
    _add_tracking(sc)
    sc.set_defaults(func=cmd_score)
    a = add("aggregate", "summary tables from what is scored")
    a.add_argument("run")
    a.add_argument(
        "--use-scorer",
        action="append",
        metavar="NAME",
        help="read this scorer where several scored one metric (repeatable)",
    )
    a.add_argument("--ppl-max", type=float, help="drop generations above this perplexity")
    a.add_argument(
        "--n-boot", type=int, help="bootstrap resamples (permutations: at most this many)"
    )
    a.add_argument("--seed", type=int, help="bootstrap / permutation seed")
    _add_tracking(a)
    a.set_defaults(func=cmd_aggregate)
    ex = add("export", "upload a run's Parquet tables and report (extra: hub)")
    ex.add_argument("run")
    ex.add_argument(
        "--hub", required=True, metavar="REPO", help="Hugging Face Hub dataset repo (user/name)"
    )
    ex.add_argument("--private", action="store_true", help="create the repository private")
    ex.add_argument("--revision", help="branch to commit to (default: main)")
    ex.set_defaults(func=cmd_export)
    th = add(
        "train-head",
        "train a linear attribute head on a frozen LM",
        formatter_class=_DefaultsFormatter,
    )
    add_train_head_args(th)
    for action in th._actions:  # options without help text would show no default
        if action.help is None and action.option_strings and action.default is not None:
            action.help = "default: %(default)s"
    th.set_defaults(func=train_head_main)
    tp = add("token-prior", "unigram token counts of a corpus (UDDIA's prior)")
    add_token_prior_args(tp)
    tp.set_defaults(func=token_prior_main)
    add_samples_args(add("samples", "browse generations with their scores (filters, jsonl/csv)"))
    c = add("compare", "per-cell differences of two runs' summaries")
    add_compare_args(c)
    c.set_defaults(func=compare_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = not getattr(args, "no_progress", False)
    for name, default in (("verbose", 0), ("quiet", 0), ("include", [])):
        if not hasattr(args, name):
            setattr(args, name, default)
    env_set = setup_logging(int(args.verbose) - int(args.quiet), progress)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.include:
            from workers.plugins import include

            include(args.include)
        return int(args.func(args))
    except (ConfigError, DatasetError, StoreError, JoinError, KeyError, ValueError) as exc:
        print(f"error: {redact_text(_message(exc))}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {redact_text(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {_os_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from results.run.invoke import interrupted

        interrupt = interrupted(exc)
        line = interrupt.args[0] if interrupt.args and " " in str(interrupt.args[0]) else ""
        print(
            line or "interrupted; what was written is kept; run the same command to resume",
            file=sys.stderr,
        )
        return interrupt.code
    finally:
        if "harness.stages.ray_runtime" in sys.modules:
            from harness.stages.ray_runtime import shutdown_ray

            shutdown_ray()
        for key in env_set:
            os.environ.pop(key, None)


def _message(exc: Exception) -> str:
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)

"""`python -m harness {run,status,score,aggregate,train-head,token-prior,compare}`.

Exit codes: 0 done, 1 a stage failed at run time, 2 bad input (config, files, names).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from harness.compare import add_compare_args, compare_main
from harness.config import ConfigError, RunConfig, load_config, parse_config
from harness.token_prior import add_token_prior_args, token_prior_main
from harness.train_head import add_train_head_args, train_head_main
from jobs.datasets import DatasetError
from results.join import JoinError
from results.store import RunStore, StoreError

log = logging.getLogger("harness")


def _config_for(run_dir: str, path: str | None) -> RunConfig:
    """The config given, else the snapshot stored in the run directory."""
    if path:
        return load_config(path)
    store = RunStore(run_dir)
    if not store.exists("config.yaml"):
        raise ConfigError(f"{run_dir}: no config.yaml in the run directory; pass --config FILE")
    import yaml

    return parse_config(yaml.safe_load(store.read_text("config.yaml")), f"{run_dir}/config.yaml")


def cmd_run(args: argparse.Namespace) -> int:
    from harness import driver

    cfg = load_config(args.config)
    use_ray = not args.no_ray
    if use_ray:
        from harness.ray_runtime import init_ray

        init_ray(cfg.runtime.ray_address, cfg.runtime.num_cpus)
    result = driver.run(
        cfg,
        args.out,
        use_ray=use_ray,
        progress=not args.no_progress,
        retry_failed=args.retry_failed,
    )
    gen = result["generation"]
    print(
        f"run {cfg.name}: {result['jobs']} jobs planned, {gen['pending_at_start']} generated now; "
        f"outputs in {args.out}"
    )
    return _print_status(RunStore(args.out))


def cmd_status(args: argparse.Namespace) -> int:
    return _print_status(RunStore(args.run))


def _print_status(store: RunStore) -> int:
    from harness.status import run_status

    print(run_status(store))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from harness import driver

    cfg = _config_for(args.run, args.config)
    use_ray = not args.no_ray
    if use_ray:
        from harness.ray_runtime import init_ray

        init_ray(cfg.runtime.ray_address, cfg.runtime.num_cpus)
    names = [s.name for s in cfg.scorers]
    for name in args.scorer or []:
        if name not in names:
            raise ConfigError(f"--scorer {name}: not among the config's scorers {names}")
    stats = driver.score_stage(
        RunStore(args.run), cfg, driver.load_words(cfg), use_ray, only=args.scorer
    )
    for name, s in stats.items():
        print(f"{name}: scored {s['scored']} rows (version {s['version']})")
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from harness import driver

    options = {"ppl_max": args.ppl_max, "n_boot": args.n_boot, "seed": args.seed}
    result = driver.aggregate_stage(
        RunStore(args.run),
        use=args.use_scorer,
        **{k: v for k, v in options.items() if v is not None},
    )
    print(result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="plan, generate, score and aggregate a config")
    r.add_argument("config", help="YAML config file")
    r.add_argument("--out", required=True, help="run directory (local path or s3:// / gs:// URI)")
    r.add_argument("--no-ray", action="store_true", help="run in this process, without Ray")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    r.add_argument(
        "--retry-failed", action="store_true", help="generate again the jobs that failed"
    )
    r.set_defaults(func=cmd_run)
    s = sub.add_parser("status", help="planned / done / failed per stage")
    s.add_argument("run")
    s.set_defaults(func=cmd_status)
    sc = sub.add_parser("score", help="(re)score an existing run: only what is missing")
    sc.add_argument("run")
    sc.add_argument("--scorer", action="append", help="only this scorer (repeatable)")
    sc.add_argument("--config", help="config with the scorers (default: the run's config.yaml)")
    sc.add_argument("--no-ray", action="store_true")
    sc.set_defaults(func=cmd_score)
    a = sub.add_parser("aggregate", help="summary tables from what is scored")
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
    a.set_defaults(func=cmd_aggregate)
    th = sub.add_parser("train-head", help="train a linear attribute head on a frozen LM")
    add_train_head_args(th)
    th.set_defaults(func=train_head_main)
    tp = sub.add_parser("token-prior", help="unigram token counts of a corpus (UDDIA's prior)")
    add_token_prior_args(tp)
    tp.set_defaults(func=token_prior_main)
    c = sub.add_parser("compare", help="per-cell differences of two runs' summaries")
    add_compare_args(c)
    c.set_defaults(func=compare_main)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return int(args.func(args))
    except (ConfigError, DatasetError, StoreError, JoinError, KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if "harness.ray_runtime" in sys.modules:
            from harness.ray_runtime import shutdown_ray

            shutdown_ray()

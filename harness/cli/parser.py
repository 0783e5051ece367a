"""The argument tree of `lidao-harness` / `python -m harness`: each command's options and the
function that runs it (`args.func`).

Building the tree imports every command's module but none of what a command uses to run (the
driver, Ray, torch): those come when the command runs.
"""

from __future__ import annotations

import argparse

from harness.cli.compare import add_compare_args, compare_main
from harness.cli.export import export_main
from harness.cli.human import add_human_args
from harness.cli.options import (
    ADDRESS_HELP,
    add_overrides,
    add_tracking,
    bounded,
    common_options,
)
from harness.cli.power import add_power_args
from harness.cli.run_commands import aggregate_main, run_main, score_main
from harness.cli.samples import add_samples_args
from harness.cli.status import status_main
from harness.cli.validate import validate_main
from harness.tools.token_prior import add_token_prior_args, token_prior_main
from harness.tools.train_head import add_train_head_args, train_head_main


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    p = argparse.ArgumentParser(
        prog="lidao-harness",
        description="Batch evaluation of decoding-time debiasing methods (also: python -m harness)",
        parents=[common],
    )
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    _run_args(add("run", "plan, generate, score and aggregate a config"))
    _validate_args(add("validate", "check a config completely and print its plan; starts nothing"))
    ls = add("list", "methods, scorers or models with their parameters and defaults")
    ls.add_argument("what", choices=("methods", "scorers", "models"))
    ls.set_defaults(func=list_main)
    s = add("status", "planned / done / failed per stage")
    s.add_argument("run")
    s.set_defaults(func=status_main)
    _score_args(add("score", "(re)score an existing run: only what is missing"))
    _aggregate_args(add("aggregate", "summary tables from what is scored"))
    _export_args(add("export", "upload a run's Parquet tables and report (extra: hub)"))
    th = add("train-head", "train a linear attribute head on a frozen LM")
    add_train_head_args(th)
    numbers = {  # refused by their range, naming the option, before any data is read
        **dict.fromkeys(
            ("epochs", "batch_size", "embed_batch_size", "max_tokens"), bounded(int, 1)
        ),
        "lr": bounded(float, 0, open_low=True),
        "val_fraction": bounded(float, 0, 1, open_high=True),
    }
    for action in th._actions:  # each default shown, unless None / False or the help says it
        action.type = numbers.get(action.dest, action.type)
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            action.help = f"{text} (default: %(default)s)".lstrip()
    th.set_defaults(func=train_head_main)
    tp = add("token-prior", "unigram token counts of a corpus (UDDIA's prior)")
    add_token_prior_args(tp)
    tp.set_defaults(func=token_prior_main)
    add_samples_args(add("samples", "browse generations with their scores (filters, jsonl/csv)"))
    c = add("compare", "per-cell differences of two runs' summaries")
    add_compare_args(c)
    c.set_defaults(func=compare_main)
    add_human_args(
        add("human", "blinded pairwise human evaluation: sample a set, import answers"), common
    )
    add_power_args(add("power", "pairs and samples per prompt a gap needs, from a pilot run"))
    return p


def _run_args(r: argparse.ArgumentParser) -> None:
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
    add_overrides(r)
    add_tracking(r)
    r.set_defaults(func=run_main)


def _validate_args(v: argparse.ArgumentParser) -> None:
    v.add_argument("config", help="YAML config file")
    v.add_argument("--out", help="also check that this run directory can be written")
    v.add_argument("--pilot", metavar="RUN", help="print the planned sizes' MDE from this run")
    add_overrides(v)
    v.set_defaults(func=validate_main)


def _score_args(sc: argparse.ArgumentParser) -> None:
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
    add_tracking(sc)
    sc.set_defaults(func=score_main)


def _aggregate_args(a: argparse.ArgumentParser) -> None:
    a.add_argument("run")
    a.add_argument(
        "--use-scorer",
        action="append",
        metavar="NAME",
        help="read this scorer where several scored one metric (repeatable)",
    )
    a.add_argument(
        "--ppl-max",
        type=bounded(float, 0, open_low=True),
        help="drop generations above this perplexity",
    )
    a.add_argument(
        "--n-boot",
        type=bounded(int, 0),
        help="bootstrap resamples (permutations: at most this many)",
    )
    a.add_argument("--seed", type=int, help="bootstrap / permutation seed")
    add_tracking(a)
    a.set_defaults(func=aggregate_main)


def _export_args(ex: argparse.ArgumentParser) -> None:
    ex.add_argument("run")
    ex.add_argument(
        "--hub", required=True, metavar="REPO", help="Hugging Face Hub dataset repo (user/name)"
    )
    ex.add_argument("--private", action="store_true", help="create the repository private")
    ex.add_argument("--revision", help="branch to commit to (default: main)")
    ex.set_defaults(func=export_main)


def list_main(args: argparse.Namespace) -> int:
    """The `list` subcommand: the catalog of methods, scorers or models."""
    from harness.cli.listing import catalog

    print("\n".join(catalog(args.what)))
    return 0


def version_text() -> str:
    """`lidao-harness VERSION (git COMMIT)`: the installed version, else the checkout's."""
    from results.run.history import git_commit, harness_version

    commit = git_commit()
    return f"lidao-harness {harness_version()}" + (f" (git {commit})" if commit else "")

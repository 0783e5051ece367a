"""`human sample` and `human import`: blinded pairwise human evaluation of a run
(docs/human-eval.md). Both hold the run's lock and record themselves in its history; the
tables come with the next `aggregate`."""

from __future__ import annotations

import argparse
import datetime as dt

import polars as pl

from results.human import (
    CRITERIA,
    HumanError,
    check_criteria,
    draw_set,
    read_answers,
    read_sets,
    write_choices,
    write_set,
)
from results.report.pieces import model_label, model_names
from results.run.identity import read_config
from results.run.store import RunStore

COLUMNS = ["job_id", "model", "task", "method", "prompt_id", "pair_id", "prompt_group"]
COLUMNS += ["prompt", "seed", "status", "continuation"]


def add_human_args(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """`human sample RUN --method M --vs R ... --out SET` and `human import RUN FILE...`."""
    sub = p.add_subparsers(dest="human_command", required=True)
    s = sub.add_parser("sample", parents=[common], help="draw a blinded annotation set")
    s.add_argument("run")
    s.add_argument("--method", required=True, help="the method judged (the paper: (e)LIDAO)")
    s.add_argument("--vs", required=True, metavar="REFERENCE", help="against (the paper: uddia)")
    s.add_argument("--fraction", type=float, default=0.2, help="of the prompts (default 0.2)")
    s.add_argument("--seed", type=int, default=0, help="of every draw (default 0)")
    s.add_argument(
        "--criteria", default=",".join(CRITERIA), help="comma-separated (default: %(default)s)"
    )
    s.add_argument("--out", required=True, metavar="SET", help="folder for the annotators")
    s.set_defaults(func=sample_main)
    i = sub.add_parser("import", parents=[common], help="check, un-blind and store answers")
    i.add_argument("run")
    i.add_argument("files", nargs="+", metavar="FILE", help="choices.csv or filled items.csv")
    i.set_defaults(func=import_main)


def sample_main(args: argparse.Namespace) -> int:
    """Draw the set, keep its key in the run directory, write SET/ for the annotators."""
    from results.run.invoke import driven

    criteria = list(check_criteria(args.criteria.split(",")))
    store = RunStore(args.run)
    if not store.exists("generations"):
        if not store.exists():
            why = "no such folder"
        elif not store.exists("plan.parquet") and not store.exists("config.yaml"):
            why = "not a run directory (no plan.parquet, no config.yaml)"
        else:
            raise HumanError(f"{args.run}: no generations to sample from")
        raise HumanError(f"{args.run}: {why}; `python -m harness run CONFIG --out RUN` makes one")
    with driven(store, "human sample") as inv:
        key = draw_set(
            store.read_generations(COLUMNS), args.method, args.vs, args.fraction, args.seed
        )
        set_id = str(key["set_id"][0])
        counts = key.group_by("model", "task", maintain_order=True).agg(
            items=pl.len(), units=pl.col("unit").n_unique()
        )
        names = model_names(read_config(store))  # the manifest names models as tables do
        counts = counts.insert_column(
            1, pl.Series("model_name", [model_label(m, names) for m in counts["model"]], pl.String)
        )
        hidden = (
            f"lidao-harness human sample RUN --method * --vs * --fraction {args.fraction} "
            f"--seed {args.seed} --criteria {','.join(criteria)} --out SET"
        )
        record = {
            "set": set_id,
            "method": args.method,
            "reference": args.vs,
            "seed": args.seed,
            "fraction": args.fraction,
            "criteria": criteria,
            "counts": counts.to_dicts(),
            "argv": inv.argv,
            "blinded_command": hidden,
            "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        paths = write_set(store, key, args.out, record)
        inv.extra["human_set"] = set_id
    print(
        f"set {set_id}: {key.height} items ({args.method} vs {args.vs}, criteria {', '.join(criteria)})"
    )
    for row in counts.iter_rows(named=True):
        print(
            f"  {row['model_name']} / {row['task']}: {row['items']} items from {row['units']} units"
        )
    print("for the annotators: " + ", ".join(paths))
    print(f"the key (never to annotators): {store.path('human', set_id)}")
    return 0


def import_main(args: argparse.Namespace) -> int:
    """Check every line of every file, then store each (set, annotator)'s answers."""
    from results.run.invoke import driven

    store = RunStore(args.run)
    if not store.exists("human"):
        raise HumanError(f"{args.run}: no annotation set (run `human sample` first)")
    with driven(store, "human import") as inv:
        answers = read_answers(args.files, read_sets(store))
        if answers.is_empty():
            raise HumanError(f"no answers in {', '.join(args.files)}")
        stored = write_choices(store, answers)
        inv.extra["human_answers"] = [
            {"set": s, "annotator": a, "answers": n} for (s, a), n in stored.items()
        ]
    for (set_id, annotator), n in stored.items():
        print(f"set {set_id}: {n} answers of {annotator!r} stored (replacing theirs, if any)")
    print(f"tables: `lidao-harness aggregate {args.run}`")
    return 0

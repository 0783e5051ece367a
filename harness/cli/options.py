"""Options shared by several commands, and what they read back from the parsed arguments.

`-v` / `-q` / `--include` (before or after the subcommand), the config overrides of `run` and
`validate`, the trackers of `run`, `score` and `aggregate`, the Ray address of `run` and `score`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

ADDRESS_HELP = (
    "runtime.ray_address: attach to this Ray cluster (or `auto`); without it and without "
    "RAY_ADDRESS the run starts a Ray instance of its own, whatever else runs on the machine"
)


def common_options() -> argparse.ArgumentParser:
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


def add_overrides(p: argparse.ArgumentParser) -> None:
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


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """The common-field overrides given on the command line (None: not given)."""
    return {
        "limit": args.limit,
        "samples": args.samples,
        "batch_size": args.batch_size,
        "device": args.device,
        "address": getattr(args, "address", None),
        "models": split_names(args.models) if args.models else None,
        "methods": split_names(args.methods) if args.methods else None,
        "set": list(getattr(args, "set", None) or []),
    }


def split_names(given: list[str] | None) -> list[str]:
    """The names of a repeatable option whose values may each be a comma-separated list."""
    return [v.strip() for item in given or [] for v in item.split(",") if v.strip()]


def _batch_size(text: str) -> int | str:
    """`--batch-size`: a whole number, or `auto` (the config checks the range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or 'auto', got {text!r}") from None


def bounded(
    kind: type[int] | type[float],
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> Callable[[str], int | float]:
    """An argparse type: a finite `kind` within [low, high] (an end excluded when open), so a
    bad number is refused naming its option (exit 2) instead of running to a meaningless
    answer or a traceback (`power --gap 0`, `--samples 0`, `aggregate --ppl-max -1`)."""
    wanted = (">" if open_low else ">=") + f" {low:g}"
    wanted += "" if high == math.inf else (" and <" if open_high else " and <=") + f" {high:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}") from None
        inside = (low < value if open_low else low <= value) and (
            value < high if open_high else value <= high
        )
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def add_tracking(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracking (optional extras: wandb, tensorboard)")
    g.add_argument(
        "--wandb", metavar="PROJECT", help="log the summary and figures to this W&B project"
    )
    g.add_argument(
        "--tensorboard", metavar="DIR", help="write the summary and figures as TensorBoard events"
    )

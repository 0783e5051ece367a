"""Which configs tests/test_generated_configs.py draws, without running them: the draws of
LIDAO_GENERATED_CONFIGS=N with LIDAO_GENERATED_SEED=S, counted as distinct configs and as those
that no derandomized stream of the given sizes draws (hypothesis's stream depends on N, so a
derandomized run of 16 and one of 200 draw different configs).

    PYTHONPATH=. python scripts/generated_draws.py --n 110 --seed 20261129 --against 16 65 200

A config is compared as its YAML-ready dict and the Ray flag, with the test's temp folder
replaced by TMP. The draws take seconds: `check` (validate, run) is replaced by a recorder.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMP = re.compile(r'[^"]*/gen-[^/"]+')  # the test's TemporaryDirectory(prefix="gen-")


def draws(n: int, seed: str) -> list[str]:
    """The configs the generated-config test draws for N and SEED ("": derandomized)."""
    os.environ["LIDAO_GENERATED_CONFIGS"] = str(n)
    os.environ["LIDAO_GENERATED_SEED"] = seed
    import tests.test_generated_configs as mod

    mod = importlib.reload(mod)  # EXAMPLES and SEED are read when the module is imported
    seen: list[str] = []

    def record(data: dict[str, Any], use_ray: bool, tmp: Path, capsys: Any) -> str:
        seen.append(TEMP.sub("TMP", json.dumps([data, use_ray], sort_keys=True, default=str)))
        return "refused"

    mod.check = record
    mod.test_validate_passes_then_run_completes_or_it_refuses_naming_the_field(
        offline_hub="", capsys=None
    )
    return seen


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, required=True, help="LIDAO_GENERATED_CONFIGS")
    p.add_argument("--seed", default="", help="LIDAO_GENERATED_SEED (default: derandomized)")
    p.add_argument(
        "--against", type=int, nargs="*", default=[], help="derandomized sizes already run"
    )
    args = p.parse_args()
    mine = draws(args.n, args.seed)
    before: set[str] = set()
    for n in args.against:
        before |= set(draws(n, ""))
    ray = sum(json.loads(s)[1] for s in set(mine))
    print(f"{len(mine)} draws, {len(set(mine))} distinct configs ({ray} on Ray)")
    if args.against:
        print(f"{len(set(mine) - before)} of them not drawn by the derandomized {args.against}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

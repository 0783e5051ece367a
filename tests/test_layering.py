"""The driver never imports torch or transformers: models load inside the actors only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from harness import cli, driver
from harness.config import load_config
from results.store import RunStore
import workers.methods.registry, workers.scorers.registry
cfg = load_config("examples/methods-tiny.yaml")
jobs = driver.plan(cfg, driver.load_words(cfg))
assert len(jobs) == 9 * 8 * 2, len(jobs)
for name in cfg.scorers:
    workers.scorers.registry.load_scorer(name.name)
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""


def test_planning_and_registries_do_not_import_torch() -> None:
    res = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "heavy: []" in res.stdout

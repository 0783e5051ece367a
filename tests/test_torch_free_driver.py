"""The driver never imports torch or transformers: models load inside the actors only.

The import rules between packages are in test_layering.py."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli_run import run_python

PROBE = """
import sys
from harness import driver
from harness.cli import commands as cli
from harness.config import load_config
from harness.stages.generation import planning
from results.run.store import RunStore
import workers.methods.registry, workers.scorers.registry
cfg = load_config("examples/methods-tiny.yaml")
jobs = planning.plan(cfg, driver.load_words(cfg))
assert len(jobs) == 9 * 8 * 2, len(jobs)
for name in cfg.scorers:
    workers.scorers.registry.load_scorer(name.name)
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""


def test_planning_and_registries_do_not_import_torch() -> None:
    res = run_python(["-c", PROBE], env=os.environ, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "heavy: []" in res.stdout


RUN_PROBE = """
import sys
from harness import driver
from harness.stages.generation.backends import Placement
from harness.config import load_config
from harness.stages.generation.stage import batch_jobs
from harness.stages.generation.ray_runtime import init_ray, shutdown_ray
cfg = load_config("examples/tiny.yaml", {"limit": 1, "samples": 1})
cfg = cfg.model_copy(update={"scorers": cfg.scorers[:1]})
init_ray(num_cpus=4)
try:
    result = driver.run(cfg, sys.argv[1], use_ray=True, progress=False)
    batch_jobs("auto", Placement(1, 0.0, 0.0, ""), 100)  # --no-ray's default device, probed
finally:
    shutdown_ray()
assert result["generation"]["pending_at_start"] == 2, result
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""


def test_a_run_on_ray_does_not_import_torch_in_the_driver(tmp_path: Path) -> None:
    """plan → generation (placement, actors) → scoring → aggregation on a local Ray: the models
    load in the actors; the driver's process never imports torch (about 210 MB)."""
    res = run_python(["-c", RUN_PROBE, str(tmp_path / "run")])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "heavy: []" in res.stdout, res.stdout[-2000:]

"""Power and sample-size planning: `results.stats.power` (pilot components, simulation, units
needed), `harness power` and `validate --pilot`, and the calibration of the summary's MDE and of
the planned sizes: seeded CI-sized versions of what `scripts/stats_calibration.py --power` runs
with 200+ replications (docs/statistics.md, "Power and sample size")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from calib_sim import analyse, simulate

from harness.cli.commands import main
from results.stats import power as pw
from tests.cli_run import config
from tests.fake_run import write_rows


def _pilot(metric: str, view: str, n_pairs: int, seed: int = 0) -> pw.Pilot:
    d = simulate(np.random.default_rng(seed), metric, view, n_pairs=n_pairs, samples=4)
    return pw.prepare(pw.Cell(metric, d.group, d.prompt, d.value, d.unit_of, 2, True))


def test_the_pilot_components_and_simulated_runs_are_the_pilots() -> None:
    pilot = _pilot("sentiment", "prompt", 200)
    su2, sp2, sw2 = pw.components(pilot.cell)  # truth: 0.2² × (0.5², 0.5², 0.7²)
    assert su2 == pytest.approx(0.01, rel=0.4) and sp2 == pytest.approx(0.01, rel=0.3)
    assert sw2 == pytest.approx(0.0196, rel=0.1)
    rng = np.random.default_rng(1)
    data = pw.simulate(rng, pilot, 50, 3, gap=10.0)
    assert data.prompt.size == 300 and data.unit_of.size == 100 and set(data.unit_of) == set(range(50))  # fmt: skip
    for u in range(50):  # the pair swap keeps one prompt of each group per pair
        assert sorted(data.group[np.isin(data.prompt, np.flatnonzero(data.unit_of == u))]) == [0, 0, 0, 1, 1, 1]  # fmt: skip
    gaps = [100 * float(np.mean(np.diff([d.value[d.group == g].mean() for g in (1, 0)])))
            for d in (pw.simulate(rng, pilot, 50, 3, gap=10.0) for _ in range(200))]  # fmt: skip
    assert np.mean(gaps) == pytest.approx(10.0, abs=0.5)  # the pilot's own gap is gone
    regard = pw.shifted("regard", np.zeros(10_000, np.int64), rng.integers(0, 3, 10_000).astype(float), 20.0, rng)  # fmt: skip
    assert float(np.mean(regard == 2)) == pytest.approx(1 / 3 + 0.2, abs=0.02)


def test_data_with_the_reported_mde_as_true_gap_are_detected_with_power_0_8() -> None:
    rng = np.random.default_rng(40)
    hits = []
    for r in range(300):  # each a pilot of 40 pairs × 4, then a run with its MDE as true gap
        pilot = analyse(simulate(rng, "sentiment", "prompt"), "sentiment", r, 400, 200)
        data = simulate(rng, "sentiment", "prompt", effect=pilot.mde / 20)  # (0.2 × 100)
        hits.append(analyse(data, "sentiment", r, n_boot=0, n_perm=200).p_value < 0.05)
    assert float(np.mean(hits)) == pytest.approx(0.8, abs=0.07)


def test_the_planned_pairs_give_the_asked_power() -> None:
    pilot = _pilot("sentiment", "prompt", 175, seed=3)
    got = pw.units_needed(pilot, 4, 8.0, 0.8, reps=100, n_perm=50)
    assert got is not None and got[1] >= 0.8
    rng = np.random.default_rng(41)
    outs = [analyse(simulate(rng, "sentiment", "prompt", n_pairs=got[0], effect=8.0 / 20), "sentiment", r, n_boot=0, n_perm=50) for r in range(150)]  # fmt: skip
    assert float(np.mean([o.p_value < 0.05 for o in outs])) == pytest.approx(0.8, abs=0.1)
    assert pw.units_needed(pilot, 4, 16.0, 0.8, reps=100, n_perm=50)[0] < got[0] / 2  # type: ignore[index]


def _pilot_rows(n_pairs: int = 24) -> list[dict[str, Any]]:
    rng = np.random.default_rng(5)
    return [
        {"prompt_id": f"{g}:{p:03d}", "pair_id": f"{p:03d}", "prompt_group": g, "seed": s,
         "label_c": g, "label_cx": g, "label_x": str(rng.choice(["female", "male"])),
         "sentiment": float(0.5 + 0.1 * rng.normal())}
        for p in range(n_pairs) for g in ("female", "male") for s in range(4)
    ]  # fmt: skip


def test_power_command_and_validate_pilot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path / "pilot")
    write_rows(run, _pilot_rows())
    args = ["power", run, "--gap", "10", "--view", "file", "--reps", "40", "--n-perm", "40"]
    assert main([*args, "--samples", "1", "--samples", "8"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "file sentiment (pilot 24 pairs × 4)" in line]
    one, eight = (int(line.split(": ")[-1].split()[0]) for line in lines)
    assert "true gap of 10 (× 100) at power 0.8, level 0.95" in out and one > eight >= 2
    assert main(["power", run, "--gap", "10", "--method", "gedi"]) == 2
    assert "no gedi cell" in capsys.readouterr().out
    assert main(["validate", str(config(tmp_path)), "--pilot", run]) == 0
    out = capsys.readouterr().out
    assert "minimum detectable gap (× 100, power 0.8, level 0.95) at 2 units × 1 samples" in out
    assert "tiny-random/gpt2/sentiment file sentiment: " in out

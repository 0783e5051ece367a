"""`compare`: two runs' summaries side by side, failing above a threshold; a run not yet
aggregated is aggregated in memory. `report_run` is in tests/conftest.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from fake_run import synthetic_run

from harness.cli.compare import add_compare_args, compare_main


def compare(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_compare_args(parser)
    return compare_main(parser.parse_args(list(argv)))


def test_compare_a_run_with_itself_shows_zero_differences(
    report_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(report_run.run, report_run.run, "--fail-above", "0") == 0
    out = capsys.readouterr().out
    assert "only in A: 0, only in B: 0" in out
    assert "+0.000" in out and "NO" not in out


def test_compare_reports_differences_and_fails_above_a_threshold(
    report_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = synthetic_run(str(tmp_path / "other"), models=("gpt2-large",), seed=7)  # no summary yet
    code = compare(
        report_run.run,
        other.uri,
        "--metric",
        "sentiment",
        "--view",
        "a(x)",
        "--fail-above",
        "0.001",
        "--n-boot",
        "50",
    )
    out = capsys.readouterr()
    assert code == 1 and "aggregated in memory" in out.out and "--fail-above" in out.err
    assert "only in A: 18" in out.out  # the tiny model: 3 methods × 3 tasks × (mean, bias)
    assert not (tmp_path / "other" / "summary.parquet").exists()


def test_compare_a_missing_run_is_an_error(
    report_run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(report_run.run, str(tmp_path / "nothing")) == 2
    assert "no generation rows" in capsys.readouterr().err


def test_compare_says_why_no_cell_is_shown(
    report_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # a value no cell has is a typo: exit 2, or `--fail-above` would pass on no cells at all
    fail = ("--fail-above", "0")
    assert compare(report_run.run, report_run.run, "--metric", "sentimnet", *fail) == 2
    out = capsys.readouterr().out
    assert "0 cells shown" in out
    assert "--metric sentimnet matches none of: " in out and "sentiment" in out
    assert compare(report_run.run, report_run.run, "--view", "a(x)", "--stat", "mode") == 2
    out = capsys.readouterr().out
    assert "--stat mode matches none of: " in out and "--view" not in out.split("no cells:")[1]

"""`status`, `list` and `score` on the everyday run (issue 24; `everyday_run`, tests/conftest.py):
plugin scorers in status and list (with typed parameters), `score --overwrite` replacing scores
only once the new ones are written, and a cluster that does not answer refused before Ray
starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness.cli.commands import main
from results.run.store import RunStore
from tests.cli_run import REPO, copy_run, harness


def test_status_knows_a_scorer_this_process_has_not_registered(
    everyday_run: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = copy_run(everyday_run, tmp_path)
    store = RunStore(str(out))
    vader = store.read_scores("sentiment-vader", "sentiment").to_dicts()
    store.write_scores("sentiment-elsewhere", "sentiment", [dict(r, scorer="x") for r in vader])
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"sentiment-elsewhere: ok {len(vader)}; missing 0" in shown
    assert "unknown scorer" not in shown


INCLUDED = """
from workers.scorers.registry import register_scorer
register_scorer("vader-typed", "workers.scorers.vader:VaderSentiment", "sentiment",
                params={"threshold": 0.5, "labels": ["pos", "neg"], "model": None,
                        "tokenizer": None}, kinds={"tokenizer": "str?"})
"""


def test_list_scorers_shows_included_scorers_with_typed_parameters(tmp_path: Path) -> None:
    (tmp_path / "typed_scorer.py").write_text(INCLUDED)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    res = harness("list", "scorers", "--include", "typed_scorer", env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "vader-typed  (metric sentiment; workers.scorers.vader:VaderSentiment)" in res.stdout
    assert "    threshold: float = 0.5" in res.stdout
    assert '    labels: list = ["pos", "neg"]' in res.stdout
    assert "    model: any = null" in res.stdout  # no declared kind: any type, null by default
    assert "    tokenizer: str? = null" in res.stdout  # its declared kind
    assert "    batch_size: int = 16" in res.stdout  # a built-in's (perplexity)


# ---- score --overwrite ---------------------------------------------------------------------


def test_score_overwrite_replaces_scores_only_when_the_new_ones_are_written(
    everyday_run: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.scorers.vader import VaderSentiment

    out = copy_run(everyday_run, tmp_path)
    store = RunStore(str(out))
    before = store.read_scores("sentiment-vader", "sentiment").sort("job_id")
    files_before = sorted(p.name for p in (out / "scores" / "sentiment-vader").iterdir())
    args = ["score", str(out), "--scorer", "sentiment-vader", "--no-ray", "--overwrite", "-q"]

    def broken(self: Any, rows: Any) -> list[dict[str, Any]]:
        raise RuntimeError("scorer broke mid-way")

    monkeypatch.setattr(VaderSentiment, "score", broken)
    assert main(args) == 1  # a failed scoring: the old scores stay whole
    after_failure = RunStore(str(out)).read_scores("sentiment-vader", "sentiment").sort("job_id")
    assert after_failure.equals(before)
    assert sorted(p.name for p in (out / "scores" / "sentiment-vader").iterdir()) == files_before

    def constant(self: Any, rows: Any) -> list[dict[str, Any]]:
        return [dict(self.key(r), sentiment=0.125) for r in rows]

    monkeypatch.setattr(VaderSentiment, "score", constant)
    assert main(args) == 0
    after = RunStore(str(out)).read_scores("sentiment-vader", "sentiment").sort("job_id")
    assert after["job_id"].to_list() == before["job_id"].to_list()  # every row, once
    assert (after["sentiment"] == 0.125).all()
    assert not (out / "overwrite").exists()  # the staging folder is gone
    monkeypatch.undo()
    plain = ["score", str(out), "--scorer", "sentiment-vader", "--no-ray", "-q"]
    assert main(plain) == 0  # without --overwrite nothing is missing: nothing changes
    again = RunStore(str(out)).read_scores("sentiment-vader", "sentiment")
    assert (again["sentiment"] == 0.125).all()


def test_score_refuses_a_cluster_that_does_not_answer_before_ray_starts(
    everyday_run: tuple[Path, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    out = copy_run(everyday_run, tmp_path)
    before = sorted(p.name for p in (out / "scores").rglob("*"))
    assert main(["score", str(out), "--scorer", "gender", "--address", dead]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: runtime.ray_address: {dead}: no Ray cluster answers (")
    monkeypatch.setenv("RAY_ADDRESS", dead)
    assert main(["score", str(out), "--scorer", "gender", "--overwrite"]) == 2
    assert f"RAY_ADDRESS: {dead}: no Ray cluster answers" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "scores").rglob("*")) == before  # nothing touched


def test_status_labels_models_by_their_entry_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli_run import config

    out, entry = tmp_path / "run", "models=[{id: tiny-random/gpt2, name: my-tiny-lm}]"
    args = ["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--no-progress"]
    args += ["--set", "methods=[vanilla]", "--set", "samples_per_prompt=1", "--set", entry]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "  my-tiny-lm / vanilla / sentiment: planned" in shown, shown
    assert "  tiny-random/gpt2 / vanilla" not in shown and "config:" not in shown

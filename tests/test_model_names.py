"""A model entry's `name` labels the model wherever a report, a listing or a set shows it; the
Parquet tables keep the id."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from fake_run import synthetic_run

from harness.cli.sample_rows import load_samples
from results.report.build import aggregate_run
from results.report.pieces import model_label, model_names
from results.report.plot import forest_figure
from results.report.results_json import write_results_json
from results.run.store import RunStore

NAMED = "/models/some-folder/smollm2-135m"  # a local folder id, as a table would print it


@pytest.fixture(scope="module")
def named_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("named") / "run"
    store = synthetic_run(
        str(root),
        models=(NAMED, "tiny-random/gpt2"),
        methods=("vanilla", "lidao-min"),
        tasks=("sentiment",),
        n_prompts=4,
    )
    config = {
        "name": "named",
        "models": [{"id": NAMED, "name": "SmolLM2"}, {"id": "tiny-random/gpt2"}],
    }
    (root / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    return root, aggregate_run(store, n_boot=50)


def test_model_label_prefers_the_entry_name() -> None:
    names = model_names({"models": [{"id": "a/b", "name": "B"}, {"id": "c"}, "junk"]})
    assert names == {"a/b": "B"}
    assert model_label("a/b", names) == "B" and model_label("c", names) == "c"
    assert model_label("gpt2-large") == "GPT-2"  # the paper's LMs keep the paper's names


def test_tables_figures_and_results_json_use_the_name(named_run: tuple[Path, object]) -> None:
    root, res = named_run
    tables = (root / "report" / "tables.md").read_text()
    assert "SmolLM2 vanilla" in tables and f"{NAMED} vanilla" not in tables
    assert NAMED not in tables  # nor in the side tables (filter, rows per group, comparisons)
    assert "tiny-random/gpt2 vanilla" in tables  # no name: the id
    html = (root / "report" / "index.html").read_text()
    assert "SmolLM2 vanilla" in html and f"{NAMED} vanilla" not in html
    assert f">{NAMED}</td>" not in html and ' class="t">SmolLM2</td>' in html  # side tables
    titles = [ax.get_title() for ax in forest_figure(res.cells).axes]  # type: ignore[attr-defined]
    assert any(t.startswith("SmolLM2 ·") for t in titles)
    assert not any(NAMED in t for t in titles)
    summary = pl.read_parquet(root / "summary.parquet")
    assert set(summary["model"].drop_nulls()) == {NAMED, "tiny-random/gpt2"}  # the identity
    write_results_json(RunStore(str(root)))
    doc = json.loads((root / "results.json").read_text())
    shown = {(r["model"], r["model_name"]) for r in doc["results"] if r["model"]}
    assert shown == {(NAMED, "SmolLM2"), ("tiny-random/gpt2", "tiny-random/gpt2")}


def test_a_random_weight_model_is_named_in_the_notes(named_run: tuple[Path, object]) -> None:
    _, res = named_run
    notes = [n for n in res.notes if "random weights" in n]  # type: ignore[attr-defined]
    assert len(notes) == 1 and "tiny-random/gpt2" in notes[0]


def test_samples_carry_the_name_beside_the_id(named_run: tuple[Path, object]) -> None:
    root, _ = named_run
    frame = load_samples(str(root)).frame
    pairs = set(frame.select("model", "model_name").unique().iter_rows())
    assert pairs == {(NAMED, "SmolLM2"), ("tiny-random/gpt2", "tiny-random/gpt2")}

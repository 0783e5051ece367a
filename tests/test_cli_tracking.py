"""What the everyday run reports beyond its folder (issue 24; `everyday_run`, tests/conftest.py):
results.json against its schema, TensorBoard events and an offline W&B run holding the summary
and figures, W&B refusing the login as one error line, and a missing tracker package refused
before the run."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from harness.cli.commands import main
from results.run.store import RunStore
from tests.cli_run import REPO, config, copy_run

# ---- results.json --------------------------------------------------------------------------


def test_results_json_validates_against_its_schema_and_holds_every_cell(
    everyday_run: tuple[Path, str, str], tmp_path: Path
) -> None:
    import jsonschema

    from results.report.results_json import write_results_json

    out = copy_run(everyday_run, tmp_path)
    schema = json.loads((REPO / "docs" / "results.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = json.loads((out / "results.json").read_text())
    jsonschema.validate(doc, schema)
    summary = pl.read_parquet(out / "summary.parquet")
    assert len(doc["results"]) == summary.height
    gaps = summary.filter(pl.col("p_value").is_not_null())
    assert gaps.height  # the gender gaps carry p-values
    cells = {
        (c["method"], c["metric"], c["stat"], c["group"], c["view"]): c for c in doc["results"]
    }
    for row in gaps.iter_rows(named=True):
        cell = cells[(row["method"], row["metric"], row["stat"], row["group"], row["view"])]
        assert cell["p_value"] == pytest.approx(row["p_value"])
        assert cell["ci_low"] == row["ci_low"] and cell["ci_high"] == row["ci_high"]
    assert doc["config"]["methods"] == [{"name": "vanilla", "params": {}}]  # --set, recorded
    assert doc["config"]["samples_per_prompt"] == 1
    assert doc["versions"]["packages"]["pyarrow"] and doc["versions"]["lidao_harness"]
    # a secret in an old snapshot never reaches results.json
    snap = yaml.safe_load((out / "config.yaml").read_text())
    snap["scorers"].append({"name": "perspective", "params": {"api_key": "sekrit-99"}})
    (out / "config.yaml").write_text(yaml.safe_dump(snap))
    write_results_json(RunStore(str(out)))
    text = (out / "results.json").read_text()
    assert "sekrit-99" not in text and "<redacted>" in text
    jsonschema.validate(json.loads(text), schema)
    doc["results"][0]["p_value"] = 2.0  # the schema does check
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


# ---- tracking ------------------------------------------------------------------------------


def tf_records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file (length, crc, data, crc)."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        yield data[at + 12 : at + 12 + length]
        at += 12 + length + 4


def test_tensorboard_events_hold_the_summary_and_figures(
    everyday_run: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboardX", reason="the tensorboard extra (tensorboardX)")
    from tensorboardX.proto.event_pb2 import Event

    from harness.cli.tracking import summary_scalars

    out = copy_run(everyday_run, tmp_path)
    logdir = tmp_path / "tb"
    assert main(["aggregate", str(out), "--tensorboard", str(logdir), "-q"]) == 0
    assert f"tensorboard: {logdir}" in capsys.readouterr().out
    (events,) = list(logdir.glob("events.out.tfevents.*"))
    scalars: dict[str, float] = {}
    images, texts = set(), set()
    for record in tf_records(events):
        event = Event.FromString(record)
        for v in event.summary.value:
            if v.HasField("image"):
                images.add(v.tag)
            elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "text":
                texts.add(v.tag)
            else:
                scalars[v.tag] = v.simple_value
    expected = summary_scalars(RunStore(str(out)))
    assert expected and set(scalars) == set(expected)
    for tag, value in expected.items():
        assert scalars[tag] == pytest.approx(value, rel=1e-6, abs=1e-6), tag  # float32 on disk
    assert images == {"report/forest"}
    assert any(t.startswith("config") for t in texts)


def test_wandb_offline_run_holds_the_summary_and_figures(
    everyday_run: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra")
    from harness.cli.tracking import summary_scalars

    out = copy_run(everyday_run, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert main(["aggregate", str(out), "--wandb", "everyday-test", "-q"]) == 0
    (run_dir,) = list((tmp_path / "wandb").glob("offline-run-*"))
    (table,) = list(run_dir.glob("files/media/table/summary_*.table.json"))
    logged = json.loads(table.read_text())
    summary = pl.read_parquet(out / "summary.parquet")
    assert logged["columns"] == summary.columns and len(logged["data"]) == summary.height
    assert list(run_dir.glob("files/media/images/report/forest_*.png"))
    (record,) = list(run_dir.glob("run-*.wandb"))
    raw = record.read_bytes()
    for tag in summary_scalars(RunStore(str(out))):  # every scalar's name is in the run
        assert tag.encode() in raw, tag


def test_wandb_refusing_the_login_is_one_error_line_and_keeps_the_files(
    everyday_run: tuple[Path, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without a key and off a terminal, wandb.init raises UsageError: that was a traceback.
    wandb = pytest.importorskip("wandb", reason="the wandb extra")

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    out = copy_run(everyday_run, tmp_path)
    assert main(["aggregate", str(out), "--wandb", "proj", "-q"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: --wandb proj: W&B refused the run (No API key configured.")
    assert "WANDB_MODE=offline" in err and f"aggregate {out} --wandb proj" in err
    assert (out / "summary.parquet").exists() and (out / "results.json").exists()


def test_a_missing_tracker_package_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    out = tmp_path / "run"
    args = ["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--wandb", "proj"]
    assert main(args) == 2
    assert "--wandb: the 'wandb' package is not installed; pip install" in capsys.readouterr().err
    assert not out.exists()

"""Issue 41's smaller config and `validate` items, each a case a hostile user found: a count
whose name holds `token` echoed as `<redacted>`, dataset fields their kind ignores, group names
alike but for their Unicode normalisation, a file name over 255 bytes, a CSV field over the
reader's limit, a plugin's import error that did not name its scorer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.config import parse_config
from tests.validate_helpers import write_config


def test_a_count_whose_name_holds_token_is_echoed_not_redacted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main
    from jobs.redact import is_secret_key

    cfg = write_config(tmp_path)
    assert main(["validate", str(cfg), "--set", "generation.max_token=5"]) == 2
    err = capsys.readouterr().err
    assert "(with --set generation.max_token=5)" in err and "<redacted>" not in err
    assert not any(is_secret_key(k) for k in ("max_token", "num_keys", "n_tokens", "min_key"))
    assert all(is_secret_key(k) for k in ("token", "hf_token", "api_key", "aws_secret", "sig"))


@pytest.mark.parametrize(
    ("dataset", "why"),
    [
        (
            {"kind": "realtoxicityprompts", "path": "rtp.jsonl", "files": {"a": "x.jsonl"}},
            "files: not read by kind realtoxicityprompts (it reads `path`); drop it",
        ),
        (
            {"kind": "prompt-list", "path": "p.jsonl", "files": {"a": "x.jsonl"}},
            "files: not read by kind prompt-list (it reads `path`); drop it",
        ),
        (
            {"kind": "paired-jsonl", "path": "p.jsonl", "files": {"a": "x", "b": "y"}},
            "path: not read by kind paired-jsonl (it reads `files`); drop it",
        ),
        (
            {"kind": "paired-jsonl", "files": {"caf\u00e9": "x.jsonl", "cafe\u0301": "y.jsonl"}},
            "files: groups 'caf\\xe9' and 'cafe\\u0301' are the same name in two Unicode "
            "normalisations (they print alike); write them alike",
        ),
    ],
)
def test_a_dataset_field_its_kind_ignores_or_two_alike_groups_are_refused(
    tmp_path: Path, dataset: dict[str, Any], why: str
) -> None:
    """Issue 41: realtoxicityprompts with `files:` and `path:` read `path` and ignored
    `files` silently; two group names in two normalisations made two groups."""
    from harness.config import ConfigError

    data = json.loads(write_config(tmp_path).read_text())
    with pytest.raises(ConfigError) as exc:
        parse_config({**data, "dataset": dataset})
    key, rest = why.split(": ", 1)  # the field inside the section, named either way
    assert f"dataset: Value error, {why}" in str(exc.value) or (
        f"dataset.{key}: {rest}" in str(exc.value)
    )


def test_a_file_name_too_long_names_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41: a 300-character name gave `File name too long`, exit 1, no field."""
    from harness.cli.commands import main

    long = tmp_path / ("a" * 300)
    hint = "File name too long (a file or folder name holds at most 255 bytes"
    for changes in (
        {"dataset": {"kind": "prompt-list", "path": f"{long}.jsonl"}},
        {"gender_words": str(long)},
    ):
        assert main(["validate", str(write_config(tmp_path, **changes))]) == 2
        field = "dataset.path" if "dataset" in changes else "gender_words"
        assert f"  {field}: {long}" in capsys.readouterr().out
    assert main(["validate", str(write_config(tmp_path)), "--out", str(long)]) == 2
    out = capsys.readouterr().out
    assert f"  --out: {long}: {hint}" in out


def test_a_csv_field_over_the_readers_limit_is_named_with_its_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41: a 5 MB CSV field was called "not a CSV file in UTF-8"."""
    import csv

    from harness.cli.commands import main
    from results.human.files import read_answers
    from results.human.sampling import HumanError

    path = tmp_path / "p.csv"
    path.write_text(f"text\nThe nurse said\n{'x' * 5_000_000}\n")
    cfg = write_config(tmp_path, dataset={"kind": "prompt-list", "path": str(path)})
    assert main(["validate", str(cfg), "--set", "dataset.text_field=text"]) == 2
    why = f"a field is larger than {csv.field_size_limit():,} characters (the CSV reader's limit)"
    assert f"  dataset.path: {path}: line 3: {why}; shorten it" in capsys.readouterr().out
    answers = tmp_path / "answers.csv"
    answers.write_text(f"item_id,annotator,criterion,choice\ni1,ann,{'y' * 5_000_000},a\n")
    with pytest.raises(HumanError) as exc:
        read_answers([str(answers)], {})
    assert f"{answers}:2: {why}" in str(exc.value) and "not a CSV file" not in str(exc.value)


def test_a_plugin_that_cannot_be_imported_is_named_by_its_scorer(tmp_path: Path) -> None:
    """Issue 41: the import error of a plugin's module did not say which scorer it was."""

    from workers.plugins import PluginError, load_method, load_scorer, register_scorer

    (tmp_path / "broken_scorer_mod.py").write_text("import no_such_module_here\n")
    sys.path.insert(0, str(tmp_path))
    try:
        register_scorer("broken-plugin", "broken_scorer_mod:Scorer", "toxicity", params={})
        with pytest.raises(PluginError) as exc:
            load_scorer("broken-plugin")
    finally:
        sys.path.remove(str(tmp_path))
        from jobs.catalog import scorers

        for table in (scorers.SCORERS, scorers.SCORER_METRICS, scorers.SCORER_PARAMS):
            table.pop("broken-plugin", None)
    assert str(exc.value) == (
        "scorer 'broken-plugin' (broken_scorer_mod:Scorer): cannot import "
        "(ModuleNotFoundError: No module named 'no_such_module_here')"
    )
    assert load_method("vanilla").__name__ == "Vanilla"

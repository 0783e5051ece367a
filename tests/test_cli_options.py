"""The CLI's options (issue 24): --version and the program name, the --limit help, `--set` on
run / validate (any field, the key named when wrong, secrets redacted), pairs and prompts in
`validate`, and the README showing each option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from harness.cli.commands import main
from harness.cli.parser import build_parser
from harness.config import ConfigError, dump_config, load_config
from tests.cli_run import PAIRS, REPO, config

# ---- small things: version, program name, --limit help ------------------------------------


def test_version_program_name_and_limit_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    version = (REPO / "pyproject.toml").read_text().split('version = "')[1].split('"')[0]
    assert capsys.readouterr().out.startswith(f"lidao-harness {version}")
    help_text = build_parser().format_help()
    assert help_text.startswith("usage: lidao-harness ") and "export" in help_text
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    run_help = sub.choices["run"].format_help()  # type: ignore[index]
    assert "first N pairs" in " ".join(run_help.split()) and "--set KEY=VALUE" in run_help


# ---- --set ---------------------------------------------------------------------------------


def test_set_changes_any_field_and_names_the_key_when_wrong(tmp_path: Path) -> None:
    path = config(tmp_path)
    sets = [
        "models.0.dtype=bfloat16",
        "methods.1.params.gamma=0.25",  # `lidao-min` given by name only
        "generation.top_p=0.5",
        "tasks=[sentiment, regard]",
        "models.1.id=tiny-random/opt",  # one past the end appends an entry
        "dataset.files.male=data/pairs-male.jsonl",  # relative to the config's folder
    ]
    shutil.copytree(PAIRS, tmp_path / "data")
    cfg = load_config(path, {"set": sets})
    assert cfg.models[0].dtype == "bfloat16" and cfg.models[1].id == "tiny-random/opt"
    assert cfg.methods[1].params == {"gamma": 0.25} and cfg.generation.top_p == 0.5
    assert cfg.tasks == ["sentiment", "regard"]
    assert cfg.dataset.files is not None
    assert cfg.dataset.files["male"] == str(tmp_path / "data" / "pairs-male.jsonl")
    snapshot = yaml.safe_load(dump_config(cfg))  # what run writes to config.yaml
    assert snapshot["models"][0]["dtype"] == "bfloat16" and snapshot["generation"]["top_p"] == 0.5

    def refused(*items: str) -> str:
        with pytest.raises(ConfigError) as exc:
            load_config(path, {"set": list(items)})
        return str(exc.value)

    assert "models.0.dtype" in refused("models.0.dtype=bf17")  # pydantic names the field
    assert "--set models.0.dtype=bf17" in refused("models.0.dtype=bf17")
    assert "--set models.5.dtype: models has 1 entries" in refused("models.5.dtype=float16")
    assert "--set models.x: models is a list" in refused("models.x=1")
    no_field = refused("generation.max_new_tokens.x=1")
    assert "--set generation.max_new_tokens.x: generation.max_new_tokens is 3, not a" in no_field
    assert "expected KEY=VALUE" in refused("generation.top_p")
    assert "--set generation.top_p: the value is not valid YAML" in refused("generation.top_p=[")
    assert "generation.top_q" in refused("generation.top_q=0.5")  # unknown field, by name
    secret = refused("scorers.0.params.api_key=sekrit-77", "generation.top_q=1")
    assert "sekrit-77" not in secret and "api_key=<redacted>" in secret


def test_validate_takes_set_and_prints_pairs_and_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    rc = main(["validate", str(path), "--limit", "3", "--set", "samples_per_prompt=2", "-q"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "dataset: 3 pairs × 2 groups = 6 prompts; limit 3 (--limit counts pairs)" in out
    assert "6 prompts × 2 samples = 12 jobs" in out
    assert main(["validate", str(path), "--set", "models.0.dtype=half"]) == 2
    assert "models.0.dtype" in capsys.readouterr().err


def test_the_readme_says_how_to_use_the_venv_and_shows_each_new_option() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "source .venv/bin/activate" in readme and ".venv/bin/python -m harness" in readme
    for shown in (
        "lidao-harness --version",
        "--set models.0.dtype=bfloat16",
        "--overwrite",
        "python -m harness export RUN_DIR --hub",
        "--wandb",
        "--tensorboard DIR",
        "results.json",
        "report/index.html",
    ):
        assert shown in readme, shown


TRAIN_HEAD = [
    "train-head",
    "--model",
    "m",
    "--data",
    "d.jsonl",
    "--task",
    "sentiment",
    "--out",
    "h",
]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["power", "R", "--gap", "0"], "argument --gap: must be > 0 and <= 100, got '0'"),
        (["power", "R", "--gap", "nan"], "argument --gap: must be > 0 and <= 100, got 'nan'"),
        (["power", "R", "--gap", "5", "--power", "1"], "--power: must be > 0 and < 1"),
        (
            ["power", "R", "--gap", "5", "--samples", "0"],
            "--samples: must be >= 1 and <= 1000, got '0'",
        ),
        (["power", "R", "--gap", "5", "--reps", "x"], "--reps: a whole number, got 'x'"),
        (["power", "R", "--gap", "5", "--metric", "bogus"], "--metric: invalid choice: 'bogus'"),
        (["aggregate", "R", "--ppl-max", "-1"], "--ppl-max: must be > 0, got '-1'"),
        (["aggregate", "R", "--n-boot", "-5"], "--n-boot: must be >= 0, got '-5'"),
        (["compare", "A", "B", "--ppl-max", "inf"], "--ppl-max: must be > 0, got 'inf'"),
        ([*TRAIN_HEAD, "--epochs", "0"], "argument --epochs: must be >= 1, got '0'"),
        ([*TRAIN_HEAD, "--lr", "0"], "argument --lr: must be > 0, got '0'"),
        ([*TRAIN_HEAD, "--val-fraction", "1"], "--val-fraction: must be >= 0 and < 1"),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_option(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They used to run: `power --gap 0` to "more than 20000 pairs", `--samples 0` to a
    traceback, `aggregate --ppl-max -1` to a summary without rows (campaign, issue 29)."""
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(args)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
    good = build_parser().parse_args(["power", "R", "--gap", "0.5", "--power", "0.9"])
    assert (good.gap, good.power, good.reps) == (0.5, 0.9, 200)

"""Config validation: unknown keys, unknown names, bad YAML, redaction of secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import ConfigError, dump_config, load_config, parse_config

BASE = {
    "name": "t",
    "dataset": {"kind": "paired-jsonl", "files": {"female": "f.jsonl", "male": "m.jsonl"}},
    "models": [{"id": "tiny-random/gpt2"}],
    "methods": ["vanilla"],
    "tasks": ["sentiment"],
    "scorers": ["gender"],
}


def with_(**changes: object) -> dict[str, object]:
    return {**BASE, **changes}


def test_the_quickstart_is_valid() -> None:
    cfg = load_config(Path(__file__).parents[1] / "examples" / "quickstart.yaml")
    assert cfg.methods[0].name == "vanilla" and Path(cfg.dataset.files["female"]).is_file()  # type: ignore[index]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (with_(sampels_per_prompt=3), r"sampels_per_prompt: unknown key"),
        (with_(generation={"top_k": 3}), r"generation.top_k: unknown key"),
        (with_(methods=["lidao-mni"]), r"methods.0: unknown method 'lidao-mni'"),
        (
            with_(scorers=["sentimnet-vader"]),
            r"scorers.0: unknown scorer 'sentimnet-vader'; did you mean sentiment-vader",
        ),
        (with_(tasks=["fairness"]), r"tasks.0"),
        (
            with_(methods=[{"name": "vanilla", "params": {"lr": 1}}]),
            r"unknown parameter\(s\) \['lr'\]",
        ),
        (with_(dataset={"kind": "paired-jsonl"}), r"paired-jsonl needs"),
        (with_(models=[{"id": "x", "dtype": "int3"}]), r"models.0.dtype"),
        (
            with_(models=[{"id": "tiny-random/gpt3"}]),
            r"models.0.id: unknown tiny model 'tiny-random/gpt3'",
        ),
    ],
)
def test_bad_configs_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "cfg.yaml")


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndataset: [\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line \d+: not valid YAML"):
        load_config(path)


def test_secrets_are_redacted_in_the_snapshot() -> None:
    cfg = parse_config(
        with_(
            scorers=[{"name": "gender", "params": {"api_key": "sekrit-123", "max_new_tokens": 5}}]
        )
    )
    text = dump_config(cfg)
    assert "sekrit-123" not in text and "<redacted>" in text and "max_new_tokens: 5" in text


@pytest.mark.parametrize("name", ["quickstart.yaml", "methods-tiny.yaml", "paper-gpt2-large.yaml"])
def test_example_configs_validate(name: str) -> None:
    cfg = load_config(Path(__file__).parents[1] / "examples" / name)
    assert cfg.models and cfg.methods and cfg.scorers


def test_a_paper_model_defaults_to_the_papers_sampling_parameters() -> None:
    from harness.driver import generation_for

    opt = {"id": "facebook/opt-6.7b"}
    cfg = parse_config(with_(models=[opt, {"id": "tiny-random/gpt2"}]))
    paper, tiny = (generation_for(cfg, m) for m in cfg.models)
    assert (paper.temperature, paper.repetition_penalty, paper.top_p) == (0.75, 1.2, 0.9)
    assert (tiny.temperature, tiny.repetition_penalty) == (1.0, 1.0)
    # what the user writes wins, at the run level or the model level
    cfg = parse_config(with_(models=[opt], generation={"temperature": 0.5}))
    chosen = generation_for(cfg, cfg.models[0])
    assert (chosen.temperature, chosen.repetition_penalty) == (0.5, 1.2)
    cfg = parse_config(with_(models=[{**opt, "generation": {"max_new_tokens": 5}}]))
    assert generation_for(cfg, cfg.models[0]).temperature == 1.0

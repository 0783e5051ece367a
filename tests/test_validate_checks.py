"""`validate` runs every check `run` would hit before its first generation; `run` and `score`
refuse on the same problems before anything starts: every problem listed at once, API keys and
endpoints, devices, local files and the output folder, URLs probed together. Servers on
127.0.0.1 only; unreachable URLs are closed ports; the hub is a fake endpoint (HF_ENDPOINT) and an
empty HF_HOME (the `offline_hub` fixture, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_perspective import FakePerspective

from harness.cli import machine, preflight
from harness.cli.validate import validate
from harness.config import parse_config
from tests.validate_helpers import closed_port, problems_of, write_config

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "data"


BOTH = """
import sys, time
from harness.cli.commands import main
t0 = time.perf_counter()
codes = [main(["validate", CFG]), main(["run", CFG, "--out", OUT, "--no-progress"])]
heavy = sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules)
print("codes", codes, "heavy", heavy, "took %.1f" % (time.perf_counter() - t0))
"""


def test_validate_lists_every_problem_and_run_refuses_before_starting(
    tmp_path: Path, offline_hub: str
) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    (tmp_path / "ghost_plugin.py").write_text(
        "from workers.methods.registry import register_method\n"
        "register_method('ghost', 'ghost_pkg.method:Ghost', params={})\n"
    )
    cfg = write_config(
        tmp_path,
        dataset={
            "kind": "paired-jsonl",
            "files": {"female": str(PAIRS / "pairs-female.jsonl"), "male": f"{dead}/male.jsonl"},
        },
        gender_words=f"{dead}/pairs.txt?token=sekrit-77",
        models=[{"id": "tiny-random/gpt2", "num_gpus": 64}, {"id": "org/not-cached"}],
        methods=["vanilla", "ghost"],
        scorers=["gender", "perspective", "perplexity"],
        runtime={"device": "cuda:64", "cache_dir": str(tmp_path / "cache")},
    )
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("PERSPECTIVE_API_KEY", "RAY_ADDRESS")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    env["LIDAO_HARNESS_INCLUDE"] = "ghost_plugin"
    code = BOTH.replace("CFG", repr(str(cfg))).replace("OUT", repr(str(out)))
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "codes [2, 2] heavy []" in res.stdout, (res.stdout[-3000:], res.stderr[-3000:])
    report, refusal = res.stdout.split("\nproblems (", 1)[1], res.stderr
    expected = {
        "dataset.files.male: ": f"{dead}/male.jsonl: unreachable",
        "gender_words: ": "set gender_words to the local path, or put the file at",
        "models.1.id: ": "org/not-cached is not in the Hugging Face cache",
        "scorers.2.params.model (default): ": "openai-community/gpt2-xl is not in the",
        "PERSPECTIVE_API_KEY: ": "`python -m harness score RUN --scorer perspective`",
        "runtime.device: ": "cuda:64 asked",
        "models.0.num_gpus: ": "64 GPU(s) asked",
        "methods.1: ": "ghost: module 'ghost_pkg.method'",
    }
    for field, text in expected.items():
        for where, name in ((report, "validate"), (refusal, "run")):
            hits = [ln for ln in where.splitlines() if ln.strip().startswith(field)]
            assert len(hits) == 1 and text in hits[0], (name, field, where[-4000:])
    assert "8 problem(s); nothing was started" in report
    assert "8 problem(s); nothing was started" in refusal
    assert "sekrit-77" not in report + refusal  # a URL token never reaches the output
    assert "Retrying" not in report + refusal
    assert not out.exists()  # `run` wrote nothing: no run directory, no plan, no generations


def test_run_refuses_a_missing_key_before_generating(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, scorers=["gender", "perspective"])
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PERSPECTIVE_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(cfg), "--out", str(out), "--no-ray"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert "PERSPECTIVE_API_KEY: scorers.1 (perspective) needs an API key" in res.stderr
    assert not out.exists()  # no plan, no generations: nothing was written


def test_perspective_key_file_and_endpoint_name_their_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "key.txt"
    empty.write_text("\n")
    monkeypatch.delenv("PERSPECTIVE_API_KEY", raising=False)
    monkeypatch.delenv("PERSPECTIVE_API_ENDPOINT", raising=False)
    base = json.loads(write_config(tmp_path).read_text())
    items = [  # one perspective entry per config: a run keeps one setting per scorer
        preflight.check_keys(
            parse_config({**base, "scorers": [{"name": "perspective", "params": p}]})
        )[0]
        for p in ({"api_key_file": str(empty)}, {"cache_only": True})
    ]
    assert items[0].field == "scorers.0.params.api_key_file" and "is empty" in str(items[0].problem)
    assert items[1].problem is None and items[1].where == "cache only (no key needed)"
    with FakePerspective(api_key="k") as server:
        monkeypatch.setenv("PERSPECTIVE_API_KEY", "k")
        monkeypatch.setenv("PERSPECTIVE_API_ENDPOINT", server.endpoint)
        cfg = parse_config(
            {**json.loads(write_config(tmp_path).read_text()), "scorers": ["perspective"]}
        )
        reachable = preflight.check_services(preflight.check_keys(cfg), preflight.probe_url)
    assert [i.problem for i in reachable] == [None, None]
    monkeypatch.setenv("PERSPECTIVE_API_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    dead = preflight.check_services(preflight.check_keys(cfg), preflight.probe_url)
    assert dead[1].field == "PERSPECTIVE_API_ENDPOINT" and "cache_only" in str(dead[1].problem)


def test_devices_are_checked_on_this_machine_only(tmp_path: Path) -> None:
    base = json.loads(write_config(tmp_path).read_text())
    cuda = parse_config({**base, "runtime": {"device": "cuda"}})
    attached = parse_config({**base, "runtime": {"device": "cuda", "ray_address": "10.0.0.1:6379"}})
    assert machine.is_local_run(attached) is False and machine.is_local_run(attached, False)
    on_cluster = machine.check_devices(attached, machine.is_local_run(attached))
    assert [(i.where, i.problem) for i in on_cluster] == [("on the cluster's nodes", None)]
    n, why = machine.local_gpus()
    item = machine.check_devices(cuda, local=True)[0]
    assert item.field == "runtime.device"
    if n == 0:
        assert item.problem == f"cuda asked, but {why}; set runtime.device: cpu (or --device cpu)"
    else:
        assert item.problem is None
    share = parse_config({**base, "scorers": [{"name": "gender", "num_gpus": 0.5}]})
    items = machine.check_devices(share, local=True)
    assert [i.field for i in items] == ["scorers.0.num_gpus"]
    assert (items[0].problem is None) == (n > 0)


def test_a_missing_local_file_and_output_under_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    cfg = parse_config(
        {**json.loads(write_config(tmp_path).read_text()), "gender_words": str(tmp_path / "no")}
    )
    (tmp_path / "f").write_text("")
    lines, problems = validate(cfg, "c.yaml", out=str(tmp_path / "f" / "run"))
    assert problems == 2, lines
    assert problems_of(lines) == [
        f"gender_words: {tmp_path / 'no'}: no such file (a relative path in a config is read "
        "from the config's folder)",
        f"--out: {tmp_path / 'f'} is a file, not a folder",
    ]
    assert main(["validate", str(write_config(tmp_path)), "--out", str(tmp_path / "f")]) == 2
    assert f"  --out: {tmp_path / 'f'} exists and is not a folder" in capsys.readouterr().out
    assert machine.check_output(str(tmp_path / "new" / "run")).problem is None
    assert machine.check_output("mock:///bucket/run") == preflight.Item(
        "--out", "mock:///bucket/run", "writable"
    )  # a probe object written and deleted through pyarrow
    remote = machine.check_output("nosuch://bucket/run")
    assert str(remote.problem).startswith("nosuch://bucket/run: cannot write (")


def test_the_method_model_parameters_match_the_methods() -> None:
    from workers.methods.registry import load_method

    for name, params in preflight.METHOD_MODEL_PARAMS.items():
        assert load_method(name).needs.extra_models == params


def test_urls_are_probed_all_at_once_and_each_once(tmp_path: Path) -> None:
    """Three URLs, five fields: three probes in flight together (a barrier of three would
    break if they ran one after another), one line per URL naming every field that uses it."""
    barrier = threading.Barrier(3, timeout=20)
    asked: list[str] = []

    def probe(url: str) -> str | None:
        asked.append(url)
        barrier.wait()
        return None if url.endswith("ok.jsonl") else "unreachable (test)"

    specs = [
        ("dataset.files.female", "http://h/ok.jsonl"),
        ("dataset.files.male", "http://h/m.jsonl"),
        ("methods.1.params.head", "http://h/head.pt"),
        ("methods.2.params.head", "http://h/head.pt"),
    ]
    items = preflight.check_files(specs, str(tmp_path), probe)
    assert sorted(asked) == ["http://h/head.pt", "http://h/m.jsonl", "http://h/ok.jsonl"]
    assert [i.problem is None for i in items] == [True, False, False, False]
    from harness.cli.validate import _file_problems

    lines = _file_problems(items)
    assert len(lines) == 2 and lines[1].startswith(
        "methods.1.params.head, methods.2.params.head: http://h/head.pt: unreachable (test); "
        "without network, download it elsewhere and set them to the local path"
    )


def test_scorer_parameters_are_checked_against_the_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown names (with the nearest), kinds, enumerated values and bounds: each named by its
    field, all at once, before anything runs; `--set` reaches the same check."""
    from harness.cli.commands import main

    cfg = write_config(
        tmp_path,
        scorers=[
            {"name": "gender", "params": {"bogus": 1}},
            {"name": "sentiment-vader", "params": {"text_fieldd": "x"}},
            {"name": "regard", "params": {"text_field": "bogus", "batch_size": 0}},
            {"name": "perplexity", "params": {"model": 3, "dtype": "float8"}},
        ],
    )
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    expected = [
        "scorers.0.params.bogus: unknown gender parameter 'bogus' (known: none)",
        "scorers.1.params.text_fieldd: unknown sentiment-vader parameter 'text_fieldd'; did you "
        "mean text_field? (known: text_field)",
        "scorers.2.params.text_field: 'bogus' must be one of continuation, prompt+continuation",
        "scorers.2.params.batch_size: 0 must be at least 1",
        "scorers.3.params.model: 3 must be a string",
        "scorers.3.params.dtype: 'float8' must be one of float32, float16, bfloat16",
    ]
    for line in expected:
        assert f"  {line}\n" in err, err
    assert "invalid config (6 error(s))" in err
    plain = write_config(tmp_path, scorers=["gender", "sentiment-vader"])
    assert main(["validate", str(plain), "--set", "scorers.1.params.text_field=prompt"]) == 2
    err = capsys.readouterr().err
    assert "scorers.1.params.text_field: 'prompt' must be one of continuation" in err
    assert "(with --set scorers.1.params.text_field=prompt)" in err
    assert main(["validate", str(plain), "--set", "scorers.0.params.x=1"]) == 2
    assert "scorers.0.params.x: unknown gender parameter 'x'" in capsys.readouterr().err


def test_a_method_or_scorer_given_twice_is_refused_naming_both_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Methods: the same name with parameters that resolve alike (a default written out counts);
    scorers: the same name (scores/<scorer>/ holds one setting)."""
    from harness.cli.commands import main

    cfg = write_config(
        tmp_path,
        methods=[
            "vanilla",
            "lidao-min",
            "vanilla",
            {"name": "lidao-min", "params": {"gamma": 0.5}},
        ],
        scorers=["gender", {"name": "gender"}],
    )
    assert main(["validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "methods.2: vanilla with these parameters is methods.0 again" in err
    assert "methods.3: lidao-min with these parameters is methods.1 again" in err
    assert "scorers.1: gender is scorers.0 again" in err
    other = write_config(
        tmp_path, methods=["lidao-min", {"name": "lidao-min", "params": {"gamma": 0.7}}]
    )
    assert main(["validate", str(other)]) == 0  # two settings of one method: a fair grid


def test_max_new_tokens_after_the_longest_prompt_must_fit_the_models_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Read from the model's config (tiny GPT-2: 512 positions) and counted with its
    tokenizer; the longest of the example prompts is 8 tokens with BOS, so 504 fits (a run of
    it generates 504 tokens) and 505 does not. The perplexity scorer's model counts too."""
    from harness.cli.commands import main

    scorers = ["gender", {"name": "perplexity", "params": {"model": "tiny-random/opt"}}]
    for new, code in ((504, 0), (505, 2)):
        cfg = write_config(tmp_path, generation={"max_new_tokens": new}, scorers=scorers)
        assert main(["validate", str(cfg)]) == code
    out = capsys.readouterr().out
    assert (
        "generation.max_new_tokens: 505 new tokens after the longest prompt (8 tokens) exceed "
        "the 512 tokens tiny-random/gpt2 (models.0.id) takes; lower it to at most 504" in out
    )
    assert "exceed the 512 tokens tiny-random/opt (scorers.1.params.model) takes" in out
    own = {"id": "tiny-random/llama", "generation": {"max_new_tokens": 600}}
    cfg = write_config(tmp_path, models=[{"id": "tiny-random/falcon"}, own])
    assert main(["validate", str(cfg), "--set", "generation.max_new_tokens=600"]) == 2
    out = capsys.readouterr().out
    assert "models.1.generation.max_new_tokens: 600 new tokens" in out  # its own setting
    assert "tiny-random/falcon" not in out.split("problems (")[1]  # 2048 positions


def test_the_tiny_models_context_is_what_their_configs_declare() -> None:
    from workers.hub import model_context
    from workers.tiny import TINY_FAMILIES, tiny_config

    for family in TINY_FAMILIES:
        config = tiny_config(family, 100)
        declared = getattr(config, "n_positions", None) or config.max_position_embeddings
        assert model_context(f"tiny-random/{family}") == declared


# ---- messages that name the path, field or stage and what to do (issue 29, item 11) --------


def test_a_missing_prompt_file_names_the_path_it_resolved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    (tmp_path / "conf").mkdir()
    cfg = write_config(tmp_path / "conf", dataset={"kind": "prompt-list", "path": "p.jsonl"})
    assert main(["validate", str(cfg)]) == 2
    assert (
        f"dataset.path: {tmp_path / 'conf' / 'p.jsonl'}: no such file (a relative path in a "
        "config is read from the config's folder)" in capsys.readouterr().out
    )


def test_a_folder_or_a_named_pipe_as_the_prompt_file_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "dir.jsonl").mkdir()
    for name, what in (
        ("pipe.jsonl", "not a regular file (a named pipe"),
        ("dir.jsonl", "a folder, not a file"),
    ):
        cfg = write_config(tmp_path, dataset={"kind": "prompt-list", "path": str(tmp_path / name)})
        assert main(["validate", str(cfg)]) == 2
        assert f"dataset.path: {tmp_path / name}: {what}" in capsys.readouterr().out


def test_a_numeric_prompt_text_is_named_as_such(tmp_path: Path) -> None:
    from jobs.datasets import load_prompt_list
    from jobs.files import DatasetError

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": {"text": "The nurse"}}\n{"prompt": {"text": 42}}\n')
    with pytest.raises(
        DatasetError, match=r"p\.jsonl: line 2: prompt.text is 42, not text; write it in quotes"
    ):
        load_prompt_list(str(path))


def test_score_on_a_folder_that_is_no_run_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    gone = tmp_path / "no-run"
    assert main(["score", str(gone), "--no-ray"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {gone}: not a run directory (no config.yaml, plan.parquet or generations); "
        f"`python -m harness run CONFIG --out {gone}` makes one"
    )


def test_two_scorers_of_one_metric_are_settled_with_the_cli_option(tmp_path: Path) -> None:
    from fake_run import score_row, write_rows

    from results.stats.join import JoinError, join_run

    store = write_rows(
        str(tmp_path / "run"), [{"prompt_id": "A", "label": "female", "sentiment": 0.3}]
    )
    store.write_scores(
        "sentiment", "sentiment", [score_row("j00000", "sentiment") | {"scorer": "sentiment"}]
    )
    with pytest.raises(JoinError) as exc:
        join_run(store)
    assert str(exc.value).endswith(
        "metric 'sentiment' was scored by sentiment, sentiment-vader; pick one with --use-scorer "
        "(e.g. `--use-scorer sentiment`)"
    )


def test_an_output_path_with_a_newline_is_refused(tmp_path: Path) -> None:
    item = machine.check_output(str(tmp_path / "run\nname"))
    assert item.field == "--out" and str(item.problem).endswith(
        "holds a control character (a newline, a tab...); every path of the run would hold it: "
        "give a plain name"
    )
    assert machine.check_output(str(tmp_path / "run name")).problem is None

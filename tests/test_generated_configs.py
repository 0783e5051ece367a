"""The invariant `validate` passes ⇒ `run` completes; `validate` refuses ⇒ it names the field,
over configs drawn by hypothesis: methods × scorers × their parameters (valid values, and invalid
ones of the kinds the catalog declares: a wrong type, a value outside the choices or the range,
an unknown name) × in-process / Ray × `score_during_generation` × dtypes × dataset shapes, on
the tiny models, offline (the `offline_hub` fixture: a real model is not cached).

Each drawn config is either refused by `validate`, every problem line naming a config field
(or an option / a variable), or `run` exits 0 with every planned job generated ok and scored
by every scorer. The CI sample is derandomized (the same configs on every machine) and small:
LIDAO_GENERATED_CONFIGS=N draws N instead (docs/footguns.md, "Configs"). The derandomized draws
are the same stream wherever they run, so a larger N repeats the configs an earlier run saw;
LIDAO_GENERATED_SEED=S (an integer) draws from hypothesis's seed S instead, configs no run of
another seed has seen (the seeds used so far: docs/footguns.md, "Configs").
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

from harness.cli.commands import main
from jobs.catalog import (
    DEFAULT_PARAMS,
    PARAM_CHOICES,
    PARAM_RANGES,
    SCORER_CHOICES,
    SCORER_PARAMS,
    param_kind,
    scorer_param_kind,
)
from results.run.store import RunStore
from tests.cli_run import PAIR_FILES, harness

EXAMPLES = int(os.environ.get("LIDAO_GENERATED_CONFIGS", "16"))
SEED = os.environ.get("LIDAO_GENERATED_SEED", "").strip()  # unset: derandomized (CI's stream)
TINY = ["tiny-random/gpt2", "tiny-random/opt", "tiny-random/llama", "tiny-random/falcon"]
METHODS = ["vanilla", "lidao-min", "lidao-prod", "elidao-min", "uddia", "pplm", "gedi", "dexperts"]
SCORERS = ["gender", "sentiment-vader", "perplexity"] * 3 + ["sentiment"]  # sentiment: not cached
# Parameters whose valid values are files or models: drawn from these, else left at default.
VALID = {
    "gedi_model": TINY[:2],
    "expert": TINY[:2],
    "anti_expert": TINY[:2],
    "code_desired": ["good"],
    "code_undesired": ["bad"],
    "steps": [0, 1, 2],
    "model": TINY + ["org/not-cached", "tiny-random/gpt5", "tiny-random/bert"],
    # eLIDAO: the named templates, custom ones with and without #GENDER#, control characters
    "instruction": ["plain", "instruct", "Be fair.", "Say #GENDER#:", "#GENDER#\x00\x1b[1m"],
}
OPAQUE = ("head", "prior", "revision", "endpoint", "api_key_file", "cache_file")
# A problem line: an indented config field (dotted), an option or a variable, then ": ".
FIELD = re.compile(r"^\s+(--\w[\w-]*|[A-Z_]{3,}|[a-z_]+(\.[\w+-]+)*)( \(default\))?: ")


def wrong(kind: str, choices: Any, low: Any) -> st.SearchStrategy[Any]:
    """Values a parameter of `kind` refuses: another type, a value beside its choices, below
    its range."""
    base = kind.rstrip("?")
    other = {"float": "x", "int": 1.5, "bool": 3, "str": 7, "list": "x", "dict": 2}.get(base)
    bad = [] if other is None else [other]
    if choices:
        bad.append("bogus")
    if low is not None and base in ("int", "float"):
        bad.append(low - 1)
    return st.sampled_from(bad) if bad else st.nothing()


def right(key: str, kind: str, choices: Any, low: Any, high: Any) -> st.SearchStrategy[Any]:
    """Modest values a parameter of `kind` takes (files and models from `VALID`)."""
    base = kind.rstrip("?")
    if key in VALID:
        return st.sampled_from(VALID[key])
    if choices:
        return st.sampled_from(list(choices))
    if base == "bool":
        return st.booleans()
    if base == "int":
        lo = int(low or 1)
        return st.integers(lo, lo + 2)
    if base == "float":
        lo = float(low or 0.0)
        return st.floats(lo, float(high) if high is not None else lo + 1.0)
    return st.nothing()


@st.composite
def params(draw: Any, defaults: dict[str, Any], kind_of: Any, choices: Any, ranges: Any) -> dict:
    out: dict[str, Any] = {}
    for key in draw(
        st.lists(st.sampled_from(sorted(defaults) or ["none"]), max_size=2, unique=True)
    ):
        if key in OPAQUE or key == "none":
            continue
        kind, (low, high) = kind_of(key), ranges.get(key, (None, None))
        good = right(key, kind, choices.get(key), low, high)
        out[key] = draw(
            good | wrong(kind, choices.get(key), low) if draw(st.integers(0, 7)) == 7 else good
        )
    if draw(st.integers(0, 19)) == 19:  # hypothesis draws 0 first: the rare case is the top
        out["bogus_param"] = 1
    return out


def entry(name: str, given: dict[str, Any]) -> Any:
    return {"name": name, "params": given} if given else name


@st.composite
def configs(draw: Any, tmp: Path) -> tuple[dict[str, Any], bool]:
    methods = draw(st.lists(st.sampled_from(METHODS), min_size=1, max_size=2, unique=True))
    scorers = draw(st.lists(st.sampled_from(SCORERS), max_size=3, unique=True))
    scorer_params = {**SCORER_PARAMS["perplexity"], "model": "tiny-random/gpt2"}
    shape = draw(st.sampled_from(["pairs", "list", "odd"]))
    if shape == "pairs":
        dataset: dict[str, Any] = {
            "kind": "paired-jsonl",
            "files": dict(PAIR_FILES),
            "limit": draw(st.integers(1, 2)),
        }
    else:
        texts = (
            ["The nurse said", "Él dijo que"]
            if shape == "list"
            else ["The man \x1b[1m said", "She \u202e said\x07"]
        )
        path = tmp / f"{shape}.jsonl"
        path.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in texts))
        dataset = {"kind": "prompt-list", "path": str(path)}
    data = {
        "name": "drawn",
        "dataset": dataset,
        "models": [
            {"id": m, "dtype": draw(st.sampled_from(["float32", "float32", "bfloat16", "float16"]))}
            for m in draw(st.lists(st.sampled_from(TINY), min_size=1, max_size=2, unique=True))
        ],
        "methods": [
            entry(
                m,
                draw(
                    params(
                        DEFAULT_PARAMS[m],
                        lambda k, m=m: param_kind(m, k),
                        PARAM_CHOICES,
                        PARAM_RANGES,
                    )
                ),
            )
            for m in methods
        ],
        # regard: the task dexperts and gedi have no published alpha and codes for
        "tasks": [draw(st.sampled_from(["sentiment", "toxicity", "regard"]))],
        "samples_per_prompt": draw(st.integers(1, 2)),
        "generation": {"max_new_tokens": draw(st.sampled_from([1, 2, 3] * 3 + [520]))},
        "scorers": [
            entry(
                s,
                ({"model": "tiny-random/gpt2"} if s == "perplexity" else {})
                | draw(
                    params(
                        scorer_params if s == "perplexity" else SCORER_PARAMS[s],
                        lambda k, s=s: scorer_param_kind(s, k, SCORER_PARAMS[s].get(k)),
                        SCORER_CHOICES,
                        {"batch_size": (1, None), "max_length": (1, None)},
                    )
                ),
            )
            for s in scorers
        ],
        "runtime": {
            "device": "cpu",
            "batch_size": draw(st.sampled_from([1, 4, "auto"])),
            "score_during_generation": draw(st.sampled_from(["auto", True, False])),
            "cache_dir": str(tmp / "cache"),
        },
        "aggregation": {"n_boot": 0, "n_perm": 0},
    }
    use_ray = draw(st.integers(0, 7)) == 7
    return data, use_ray


def check(data: dict[str, Any], use_ray: bool, tmp: Path, capsys: Any) -> str:
    """Validate `data`; refused: every problem names a field; accepted: `run` completes."""
    cfg = tmp / "c.yaml"
    cfg.write_text(yaml.safe_dump(data, allow_unicode=True))
    code = main(["validate", str(cfg)])
    out, err = capsys.readouterr()
    if code:
        listed = out.split("\nproblems (", 1)[1] if "\nproblems (" in out else err
        lines = [
            ln
            for ln in listed.splitlines()[1:]
            if ln.startswith("  ") and not ln.startswith("    ")
        ]
        assert code == 2 and lines, (out, err)
        assert all(FIELD.match(ln) for ln in lines), (listed, data)
        return "refused"
    run = tmp / "run"
    args = ["run", str(cfg), "--out", str(run), "--no-progress", "-q"]
    if use_ray:
        res = harness(*args)
        assert res.returncode == 0, (res.stderr[-3000:], data)
    else:
        assert main([*args, "--no-ray"]) == 0, (capsys.readouterr().err[-3000:], data)
    store = RunStore(str(run))
    planned = store.read_plan(["job_id"])["job_id"]
    gen = store.read_generations(["job_id", "status", "error"])
    assert sorted(gen["job_id"]) == sorted(planned), data
    assert set(gen["status"]) == {"ok"}, (
        gen.filter(gen["status"] != "ok")["error"].to_list(),
        data,
    )
    from jobs.catalog import SCORER_METRICS

    for s in data["scorers"]:
        name = s if isinstance(s, str) else s["name"]
        scores = store.read_scores(name, SCORER_METRICS[name], columns=["job_id", "status"])
        assert sorted(scores["job_id"]) == sorted(planned), (name, data)
        assert set(scores["status"]) <= {"ok", "empty"}, (name, scores["status"].to_list(), data)
    return "ran"


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a run takes seconds
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
@seed(int(SEED) if SEED else None)  # hypothesis: a seed of None leaves it derandomized
@given(data=st.data())
def test_validate_passes_then_run_completes_or_it_refuses_naming_the_field(
    data: st.DataObject, offline_hub: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with tempfile.TemporaryDirectory(prefix="gen-") as tmp:
        drawn, use_ray = data.draw(configs(Path(tmp)))
        event(check(drawn, use_ray, Path(tmp), capsys) + (" on Ray" if use_ray else ""))


def drawn_like(tmp: Path, **changes: Any) -> dict[str, Any]:
    """A config of the drawn kind: two pairs, tiny GPT-2, 2 new tokens, the gender scorer."""
    data: dict[str, Any] = {
        "name": "fixed",
        "dataset": {"kind": "paired-jsonl", "files": dict(PAIR_FILES), "limit": 2},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 2},
        "scorers": ["gender"],
        "runtime": {"device": "cpu", "cache_dir": str(tmp / "cache")},
        "aggregation": {"n_boot": 0, "n_perm": 0},
    }
    return {**data, **changes}


EXPERTS = {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt"}


@pytest.mark.parametrize(
    ("changes", "outcome"),
    [  # issue 41: each passed `validate` and failed every job of its method in `run`
        ({"methods": [{"name": "elidao-min", "params": {"instruction": "Be fair."}}]}, "refused"),
        ({"methods": [{"name": "elidao-min", "params": {"instruction": "\x1b#GENDER#"}}]}, "refused"),
        ({"methods": [{"name": "dexperts", "params": EXPERTS}], "tasks": ["regard"]}, "refused"),
        ({"methods": [{"name": "gedi", "params": {"gedi_model": "tiny-random/gpt2"}}],
          "tasks": ["regard"]}, "refused"),
        ({"scorers": [{"name": "perplexity", "params": {"model": "tiny-random/gpt5"}}]}, "refused"),
        ({"methods": [{"name": "elidao-min", "params": {"instruction": "Say #GENDER#:"}}]}, "ran"),
    ],
)  # fmt: skip
def test_the_configs_validate_passed_and_run_failed_are_refused_naming_the_field(
    changes: dict[str, Any],
    outcome: str,
    tmp_path: Path,
    offline_hub: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert check(drawn_like(tmp_path, **changes), False, tmp_path, capsys) == outcome

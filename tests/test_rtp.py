"""RealToxicityPrompts as a dataset kind (`jobs.datasets.load_realtoxicityprompts`): its
filters, `limit` and seeded sample, and the config section. The public JSONL cannot be
downloaded in tests: each test writes a few lines shaped like it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from harness.config import parse_config
from jobs.datasets import RtpFilter, load_realtoxicityprompts
from jobs.files import DatasetError

# (challenging, prompt.toxicity, text): line i + 1 of the file
LINES: list[tuple[bool, float | None, str]] = [
    (False, 0.10, "The weather report said that"),
    (True, 0.91, "She shouted at the idiots who"),
    (False, 0.55, "He told the crowd that the"),
    (True, 0.30, "Why do people always say"),
    (False, None, "A note without a score"),
    (False, 1.0, "The worst thing he ever said was"),
    (True, 0.76, "They called him a"),
    (False, 0.25, "My grandmother used to tell"),
]


def write_rtp(path: Path, lines: list[tuple[bool, float | None, str]] = LINES) -> str:
    """RTP-shaped JSONL: filename/begin/end, challenging, prompt and continuation scores."""
    with path.open("w") as fh:
        for i, (hard, tox, text) in enumerate(lines):
            rec: dict[str, Any] = {
                "filename": f"{i:07d}-deadbeef.txt",
                "begin": 10 * i,
                "end": 10 * i + 90,
                "challenging": hard,
                "prompt": {"text": text, "toxicity": tox, "profanity": 0.1},
                "continuation": {"text": " and so on.", "toxicity": 0.05},
            }
            fh.write(json.dumps(rec) + "\n")
    return str(path)


def texts(prompts: list[Any]) -> list[str]:
    return [p.text for p in prompts]


def test_every_line_with_ids_from_the_whole_file(tmp_path: Path) -> None:
    spec = write_rtp(tmp_path / "prompts.jsonl")
    prompts = load_realtoxicityprompts(spec, RtpFilter())
    assert texts(prompts) == [t for _, _, t in LINES]
    assert prompts[1].prompt_id == "prompts:00002" and prompts[1].group == "female"
    hard = load_realtoxicityprompts(spec, RtpFilter(challenging=True))
    assert texts(hard) == [LINES[i][2] for i in (1, 3, 6)]
    assert [p.prompt_id for p in hard] == ["prompts:00002", "prompts:00004", "prompts:00007"]


def test_toxicity_bins_are_half_open_and_one_is_included(tmp_path: Path) -> None:
    spec = write_rtp(tmp_path / "prompts.jsonl")
    toxic = load_realtoxicityprompts(spec, RtpFilter(toxicity_bins=((0.5, 1.0),)))
    assert texts(toxic) == [LINES[i][2] for i in (1, 2, 5, 6)]  # 0.91, 0.55, 1.0, 0.76
    low = RtpFilter(toxicity_bins=((0.0, 0.25), (0.75, 1.0)), challenging=True)
    assert texts(load_realtoxicityprompts(spec, low)) == [LINES[i][2] for i in (1, 6)]
    edge = load_realtoxicityprompts(spec, RtpFilter(toxicity_bins=((0.25, 0.5),)))
    assert texts(edge) == [LINES[3][2], LINES[7][2]]  # 0.30 and 0.25; no line without a score


def test_limit_takes_the_first_or_a_seeded_sample_in_file_order(tmp_path: Path) -> None:
    spec = write_rtp(tmp_path / "prompts.jsonl")
    assert texts(load_realtoxicityprompts(spec, RtpFilter(limit=3))) == [t for _, _, t in LINES[:3]]
    a = load_realtoxicityprompts(spec, RtpFilter(limit=4, sample_seed=7))
    b = load_realtoxicityprompts(spec, RtpFilter(limit=4, sample_seed=7))
    c = load_realtoxicityprompts(spec, RtpFilter(limit=4, sample_seed=8))
    assert a == b and len(a) == 4 and a != c
    ids = [p.prompt_id for p in a]
    assert ids == sorted(ids) and set(a) <= set(load_realtoxicityprompts(spec, RtpFilter()))


def test_bad_lines_and_empty_selections_name_the_file(tmp_path: Path) -> None:
    spec = write_rtp(tmp_path / "prompts.jsonl")
    with pytest.raises(DatasetError, match=r"prompts.jsonl: no prompt passes"):
        load_realtoxicityprompts(spec, RtpFilter(challenging=True, toxicity_bins=((0.0, 0.2),)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": {"text": "x", "toxicity": "high"}}) + "\n")
    with pytest.raises(DatasetError, match=r"bad.jsonl: line 1: prompt.toxicity is not a number"):
        load_realtoxicityprompts(str(bad), RtpFilter(toxicity_bins=((0.5, 1.0),)))


def rtp_config(dataset: dict[str, Any], scorers: list[Any] | None = None) -> Any:
    data = {
        "name": "rtp",
        "dataset": dataset,
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["toxicity"],
        "scorers": scorers or [],
    }
    return parse_config(data, "rtp.yaml")


def test_the_config_section_checks_the_filters() -> None:
    from harness.config import ConfigError
    from jobs.files import RTP_URL

    cfg = rtp_config({"kind": "realtoxicityprompts", "challenging": True})
    assert cfg.dataset.rtp_path() == RTP_URL  # the public file unless `path` names a copy
    with pytest.raises(ConfigError, match="only for kind realtoxicityprompts"):
        rtp_config({"kind": "prompt-list", "path": "p.jsonl", "challenging": True})
    with pytest.raises(ConfigError, match=r"toxicity_bins: \[0.5, 0.2\]"):
        rtp_config({"kind": "realtoxicityprompts", "toxicity_bins": [[0.5, 0.2]]})


def test_the_planner_reads_the_kind(tmp_path: Path) -> None:
    from harness.stages.generation import planning

    spec = write_rtp(tmp_path / "prompts.jsonl")
    cfg = rtp_config(
        {"kind": "realtoxicityprompts", "path": spec, "toxicity_bins": [[0.5, 1]], "limit": 2,
         "sample_seed": 3}
    )  # fmt: skip
    prompts = planning.load_prompts(cfg, planning.load_words(cfg))
    assert prompts == load_realtoxicityprompts(
        spec, RtpFilter(toxicity_bins=((0.5, 1.0),), limit=2, sample_seed=3)
    )


# ---- the time estimates of `validate` (harness/cli/estimates.py) ---------------------------

REPO = Path(__file__).resolve().parents[1]


def example_config(tmp_path: Path, lines: int = 40) -> Any:
    """examples/rtp-cluster.yaml with a local RTP-shaped copy of `lines` lines."""
    import yaml

    rows = [(i % 3 == 0, (i % 10) / 10, f"Prompt number {i} says that") for i in range(lines)]
    data = yaml.safe_load((REPO / "examples" / "rtp-cluster.yaml").read_text())
    data["dataset"]["path"] = write_rtp(tmp_path / "prompts.jsonl", rows)
    data["runtime"]["cache_dir"] = str(tmp_path / "cache")
    return parse_config(data, "rtp-cluster.yaml")


def test_the_perspective_estimate_is_texts_over_the_quota() -> None:
    from harness.cli.estimates import perspective_estimate

    def cfg(**params: Any) -> Any:
        return rtp_config(
            {"kind": "realtoxicityprompts"}, [{"name": "perspective", "params": params}]
        )

    # the case: 2.5M texts at the default 1 query/s are 29 days
    est = perspective_estimate(cfg(), 2_500_000)
    assert est is not None and est.seconds == 2_500_000.0
    assert "28.9 days" in est.line() and "WARNING: over a day" in est.line()
    # 2.5 q/s over a 60 s window: 150 a window, so 3,000 texts take 20 windows
    est = perspective_estimate(cfg(qps=2.5), 3000)
    assert est is not None and est.seconds == pytest.approx(3000 * 60 / 150)
    assert est.line().startswith("  estimate perspective: 20 min (up to 3,000 texts at 150 per")
    assert "WARNING" not in est.line()
    # 0.7 q/s over 10 s: the limiter lets 7 through a window (not 7.0000001, not 6)
    est = perspective_estimate(cfg(qps=0.7, quota_window_s=10.0), 70)
    assert est is not None and est.seconds == pytest.approx(100.0)
    none = perspective_estimate(cfg(qps=0.01), 10)
    assert none is not None and none.seconds is None and "allows no call" in none.line()
    # cache_only sends nothing: no time, no warning, whatever the quota
    cached = perspective_estimate(cfg(cache_only=True, qps=1 / 86_400), 30)
    assert cached is not None and cached.seconds == 0.0
    assert "none is sent" in cached.line() and "WARNING" not in cached.line()


def test_validate_of_the_rtp_cluster_example_prints_both_estimates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline: the dataset a local copy, the hub switched off, every URL answered."""
    from harness.cli.estimates import GPU_TOKENS_PER_S, duration
    from harness.cli.validate import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cfg = example_config(tmp_path)
    lines, _ = validate(cfg, "rtp-cluster.yaml", use_ray=False, probe=lambda url: None)
    n = sum(1 for i in range(40) if (i % 10) / 10 < 0.5)  # the non-toxic half: 20 prompts
    assert f"rtp-cluster.yaml: well-formed; {n} prompts × 25 samples" in lines[0]
    texts = n * 25 * 3
    (persp,) = [line for line in lines if "estimate perspective:" in line]
    assert f"up to {texts:,} texts at 60 per 60 s window (qps 1)" in persp
    assert persp.startswith(f"  estimate perspective: {texts / 60:.0f} min")
    (gen,) = [line for line in lines if "estimate generation" in line]
    # runtime.gpus: 8 asks for GPUs: the H100 figures at GPT-2 large's size, on 8 replicas
    rates = GPU_TOKENS_PER_S
    seconds = sum(n * 25 * 20 / rates[m] for m in ("vanilla", "uddia", "lidao-min"))
    assert gen.startswith(
        f"  estimate generation openai-community/gpt2-large: {duration(seconds / 8)} ("
    )
    assert "on 8 GPU replica(s)" in gen and "H100" in gen


def test_run_logs_the_estimates_and_warns_of_a_stage_over_a_day(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run`'s refusal step (what it runs before starting) logs the estimate lines."""
    from harness.cli import validate as validate_module
    from harness.cli.validate import refuse_on_problems

    (tmp_path / "key").write_text("k\n")
    slow = {"qps": 1 / 86_400, "quota_window_s": 86_400.0, "api_key_file": str(tmp_path / "key")}
    cfg = rtp_config(
        {"kind": "realtoxicityprompts", "path": write_rtp(tmp_path / "prompts.jsonl")},
        [{"name": "perspective", "params": slow}],  # 1 text a day
    )
    offline = functools.partial(validate_module.validate, probe=lambda url: None)
    monkeypatch.setattr(validate_module, "validate", offline)  # the service "answers"
    with caplog.at_level("INFO", logger="harness"):
        refuse_on_problems(cfg, "rtp.yaml", str(tmp_path / "run"), use_ray=False)
    (warned,) = [r for r in caplog.records if "estimate perspective" in r.getMessage()]
    assert warned.levelname == "WARNING" and "8.0 days" in warned.getMessage()
    generation = [r for r in caplog.records if "estimate generation" in r.getMessage()]
    # a tiny model on this machine's CPUs: estimated, never "none"
    assert len(generation) == 1 and "CPU replica(s)" in generation[0].getMessage()
    assert "none" not in generation[0].getMessage()

"""`samples RUN`: filters, where, sort, pair view, JSONL / CSV, errors, a closed pipe, no torch.

Runs are written row by row (`tests/fake_run.py`): no model, no generation.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_run import score_row, write_rows

from harness.cli.commands import main

REPO = Path(__file__).resolve().parents[1]


def case_rows() -> list[dict[str, Any]]:
    """Three pairs × two groups × two seeds × two methods (vanilla, lidao) + one failed job."""
    rows: list[dict[str, Any]] = []
    for method in ("vanilla", "lidao"):
        for pair in (0, 1, 2):
            for group, noun in (("female", "woman"), ("male", "man")):
                for seed in (0, 1):
                    n = len(rows)
                    rows.append(
                        {
                            "job_id": f"j{n:03d}",
                            "method": method,
                            "prompt_id": f"{group}:{pair:05d}",
                            "pair_id": f"{pair:05d}",
                            "prompt_group": group,
                            "prompt": f"The {noun} number {pair} worked as",
                            "seed": seed,
                            "continuation": f" {method} text {n}",
                            "label_x": "male" if n % 3 == 0 else "female",
                            "label_cx": group,
                            "label_c": group,
                            "toxicity": n / 20,
                            "sentiment": 1 - n / 20,
                        }
                    )
    rows[5]["toxicity"] = None  # an error score: the row stays, its toxicity is null
    rows.append(
        {
            "job_id": "jfail",
            "method": "lidao",
            "prompt_id": "male:00000",
            "pair_id": "00000",
            "prompt_group": "male",
            "seed": 2,
            "status": "error",
            "continuation": "",
            "finish_reason": "error",
            "error": "non-finite distribution at step 3",
        }
    )
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("samples") / "run")
    write_rows(root, case_rows())
    return root


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["samples", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def records(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    rc, out, err = cli(capsys, *argv, "--format", "jsonl")
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def ids(recs: list[dict[str, Any]]) -> list[str]:
    return [r["job_id"] for r in recs]


def test_filters_select_exactly_the_matching_rows(
    run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = {r["job_id"]: r for r in case_rows()}
    everything = records(capsys, run, "--limit", "0")
    assert sorted(ids(everything)) == sorted(rows)
    got = records(capsys, run, "--method", "lidao", "--group", "female", "--limit", "0")
    assert sorted(ids(got)) == sorted(
        j
        for j, r in rows.items()
        if r["method"] == "lidao" and r["prompt_group"] == "female" and "status" not in r
    )
    # a text label (the continuation's gender label), not the prompt's group
    got = records(capsys, run, "--group", "x:male", "--limit", "0")
    assert sorted(ids(got)) == sorted(j for j, r in rows.items() if r.get("label_x") == "male")
    assert ids(records(capsys, run, "--status", "error")) == ["jfail"]
    assert records(capsys, run, "--status", "error")[0]["error"].startswith("non-finite")
    assert ids(records(capsys, run, "--grep", "LIDAO TEXT 12")) == ["j012"]
    got = records(capsys, run, "--grep", "Man Number 1", "--limit", "0")  # woman and man
    assert sorted(ids(got)) == sorted(
        j for j, r in rows.items() if " number 1 " in r.get("prompt", "") and "status" not in r
    )
    assert len(records(capsys, run)) == 20  # the default limit
    assert len(records(capsys, run, "--limit", "3")) == 3
    assert records(
        capsys, run, "--task", "sentiment", "--model", "tiny-random/gpt2", "--limit", "0"
    )
    rc, _, err = cli(capsys, run, "--method", "gedi")
    assert rc == 2 and "--method gedi" in err and "lidao, vanilla" in err


def test_where_compares_score_columns_and_names_unknown_ones(
    run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = case_rows()
    want = sorted(r["job_id"] for r in rows if (r.get("toxicity") or 0) > 0.5)
    assert sorted(ids(records(capsys, run, "--where", "toxicity>0.5", "--limit", "0"))) == want
    both = records(
        capsys, run, "--where", "toxicity>=0.5", "--where", "sentiment>0.45", "--limit", "0"
    )
    assert ids(both) == ["j010"]  # toxicity 0.5, sentiment 0.5
    assert sorted(ids(records(capsys, run, "--where", "label_x=male", "--limit", "0"))) == sorted(
        r["job_id"] for r in rows if r.get("label_x") == "male"
    )
    rc, _, err = cli(capsys, run, "--where", "toxicty>0.5")
    assert rc == 2
    assert "'toxicty'" in err and "unknown column" in err
    assert "score columns: label_x, label_cx, label_c, sentiment, toxicity" in err
    rc, _, err = cli(capsys, run, "--where", "perplexity<50")
    assert rc == 2 and "no perplexity scorer ran" in err
    rc, _, err = cli(capsys, run, "--where", "label_x>male")
    assert rc == 2 and "compare it with = or !=" in err
    rc, _, err = cli(capsys, run, "--where", "toxicity>high")
    assert rc == 2 and "is a number" in err
    rc, _, err = cli(capsys, run, "--where", "toxicity")
    assert rc == 2 and "COLUMN OP VALUE" in err


def test_sort_orders_by_a_column_with_nulls_last(
    run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    down = records(capsys, run, "--sort=-toxicity", "--limit", "0", "--status", "ok")
    values = [r["toxicity"] for r in down]
    assert values[-1] is None and values[:-1] == sorted(values[:-1], reverse=True)
    assert ids(down)[0] == "j023"
    up = records(capsys, run, "--sort", "toxicity", "--limit", "2")
    assert ids(up) == ["j000", "j001"]
    rc, _, err = cli(capsys, run, "--sort", "nope")
    assert rc == 2 and "--sort nope" in err


def test_pair_view_puts_both_prompts_of_a_seed_and_method_side_by_side(
    run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = cli(capsys, run, "--pair", "00001", "--method", "vanilla", "--limit", "0")
    assert rc == 0
    blocks = [b for b in out.split("\n\n")[1:] if b.strip()]
    assert len(blocks) == 2  # seeds 0 and 1
    first = blocks[0].splitlines()
    assert first[0] == "tiny-random/gpt2 · vanilla · sentiment · seed 0"
    side = [line for line in first if "prompt:" in line]
    assert len(side) == 1  # one line holds both prompts
    left, right = side[0].split(" | ")
    assert "The woman number 1" in left and "The man number 1" in right
    cont = next(line for line in first if line.startswith("→"))
    assert "vanilla text 4" in cont and "vanilla text 6" in cont  # female seed 0, male seed 0
    # --limit counts side-by-side blocks; jsonl gives the pair's rows
    rc, out, _ = cli(capsys, run, "--pair", "00001", "--limit", "1")
    assert out.count(" · seed ") == 1
    recs = records(capsys, run, "--pair", "00000", "--method", "lidao", "--limit", "0")
    assert sorted(ids(recs)) == ["j012", "j013", "j014", "j015", "jfail"]
    rc, _, err = cli(capsys, run, "--pair", "00042")
    assert rc == 2 and "00042" in err and "00000, 00001" in err


def test_jsonl_and_csv_carry_the_same_records(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    recs = records(capsys, run, "--limit", "0", "--sort", "job_id")
    rc, out, _ = cli(capsys, run, "--limit", "0", "--sort", "job_id", "--format", "csv")
    assert rc == 0
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == len(recs) == 25
    assert list(table[0]) == list(recs[0])  # same columns, same order
    for j, c in zip(recs, table, strict=True):
        for key, value in j.items():
            if value is None:
                assert c[key] == ""
            elif isinstance(value, float):
                assert float(c[key]) == value
            else:
                assert c[key] == str(value)
    first = recs[0]
    assert first["continuation"] == " vanilla text 0" and first["toxicity"] == 0.0
    assert first["toxicity_scorer"] == "toxicity" and first["label_c"] == "female"
    assert "token_ids" not in first  # lists stay in the Parquet


def test_text_listing_is_wrapped_and_plain_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    long = "word " * 60
    write_rows(str(tmp_path), [{"continuation": long, "toxicity": 0.25, "label": "female"}])
    monkeypatch.setenv("COLUMNS", "60")
    rc, out, _ = cli(capsys, str(tmp_path))
    assert rc == 0 and "\033[" not in out
    assert out.startswith("1 of 1 samples match\n")
    assert max(len(line) for line in out.splitlines()) <= 60
    assert "toxicity=0.25" in out and "a(x)=female  a(c,x)=female  a(c)=female" in out
    text = " ".join(line[14:].strip() for line in out.splitlines() if "word" in line)
    assert text.split() == long.split()  # wrapped, nothing lost


def test_a_second_scorer_of_a_metric_gets_prefixed_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = write_rows(str(tmp_path), [{"job_id": "a", "toxicity": 0.1}])
    other = score_row("a", "toxicity", toxicity=0.9) | {"scorer": "perspective"}
    store.write_scores("perspective", "toxicity", [other])
    rec = records(capsys, str(tmp_path))[0]
    assert rec["toxicity"] == 0.9 and rec["toxicity_scorer"] == "perspective"
    assert rec["toxicity.toxicity"] == 0.1
    rec = records(capsys, str(tmp_path), "--use-scorer", "toxicity")[0]
    assert rec["toxicity"] == 0.1 and rec["perspective.toxicity"] == 0.9
    rc, _, err = cli(capsys, str(tmp_path), "--use-scorer", "toxicity-hf")
    assert rc == 2 and "no scores from it" in err
    rc, out, err = cli(
        capsys, str(tmp_path), "--where", "toxicity.toxicity<0.5", "--format", "jsonl"
    )
    assert rc == 0 and json.loads(out)["job_id"] == "a"
    assert "perspective in `toxicity` columns" in err


def test_not_a_run_and_a_run_without_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    rc, out, err = cli(capsys, str(tmp_path / "empty"))
    assert rc == 2 and "not a run directory" in err and out == ""
    rc, _, err = cli(capsys, str(tmp_path / "absent"))
    assert rc == 2 and "not a run directory" in err
    bare = tmp_path / "bare"
    write_rows(str(bare), [{"job_id": "a"}, {"job_id": "b", "prompt_group": "male"}])
    (bare / "config.yaml").write_text("scorers: [gender, {name: perspective}]\n")
    rc, out, err = cli(capsys, str(bare))
    assert rc == 0 and "2 of 2 samples match" in out and " a nurse." in out
    assert "no scores yet from gender, perspective" in err
    rc, _, err = cli(capsys, str(bare), "--where", "toxicity>0.5")
    assert rc == 2 and "none (nothing scored)" in err
    (tmp_path / "planned").mkdir()
    (tmp_path / "planned" / "config.yaml").write_text("name: x\n")
    rc, _, err = cli(capsys, str(tmp_path / "planned"))
    assert rc == 2 and "no generations yet" in err


def test_partly_scored_rows_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_rows(str(tmp_path), [{"job_id": "a", "toxicity": 0.3}, {"job_id": "b"}])
    rc, _, err = cli(capsys, str(tmp_path), "--format", "jsonl")
    assert rc == 0 and "toxicity: 1 of 2 ok rows not scored yet" in err


def test_s3_run_is_browsed_through_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    moto_server = pytest.importorskip("moto.server")
    import boto3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="runs")
        uri = f"s3://runs/r1?endpoint_override={host}:{port}&scheme=http"
        write_rows(uri, case_rows()[:4])
        capsys.readouterr()  # moto's start-up line
        got = records(capsys, uri, "--where", "toxicity>0.07")
        assert ids(got) == ["j002", "j003"]
    finally:
        server.stop()


def _python(code: str) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_no_torch_and_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    """One subprocess: `samples` writes ~1 MB into a pipe closed after one line, then says
    whether torch was imported (on stderr, the only stream left)."""
    rows = [
        {"job_id": f"j{i:04d}", "continuation": "text " * 200, "toxicity": 0.5} for i in range(600)
    ]
    write_rows(str(tmp_path), rows)
    code = (
        "import sys\n"
        "from harness.cli.commands import main\n"
        f"rc = main(['samples', {str(tmp_path)!r}, '--limit', '0'])\n"
        "print('rc', rc, 'torch', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    proc = _python(code)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"600 of 600 samples match")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert "rc 0 torch False" in err


def test_only_the_current_plan_and_the_latest_score_version_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from results.schema import PLAN_SCHEMA

    store = write_rows(str(tmp_path), [{"job_id": j, "toxicity": 0.2} for j in "abc"])
    newer = [score_row(j, "toxicity", version="v2", toxicity=0.7) for j in "ab"]
    os.utime(store.write_scores("toxicity", "toxicity", newer), (4e9, 4e9))  # written later
    gens = store.read_generations()
    store.write_plan_tables(
        [gens.filter(gens["job_id"] != "c").select(PLAN_SCHEMA.names).to_arrow()]
    )
    rc, out, err = cli(capsys, str(tmp_path), "--format", "jsonl")
    recs = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and ids(recs) == ["a", "b"]
    assert [r["toxicity"] for r in recs] == [0.7, 0.7]
    assert {r["toxicity_version"] for r in recs} == {"v2"}
    assert "1 generation row(s) outside the current plan" in err
    assert "version 'v2' shown; older ['v1'] not" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bold_only_on_a_terminal_and_never_with_no_color(
    run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    shown = []
    for no_color in (None, "1"):
        if no_color:
            monkeypatch.setenv("NO_COLOR", no_color)
        term = _Terminal()
        monkeypatch.setattr(sys, "stdout", term)
        assert main(["samples", run, "--limit", "1"]) == 0
        shown.append(term.getvalue())
    assert "\033[1m[1] tiny-random/gpt2 · lidao" in shown[0] and "\033[2mprompt" in shown[0]
    assert "\033[" not in shown[1] and "[1] tiny-random/gpt2 · lidao" in shown[1]

"""Human evaluation through the CLI on a tiny run: sample a blinded set, answer it (a filled
items.csv and a page-style choices.csv), import, aggregate; the blinding, the checks of the
import and the replacement of one annotator's answers."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pytest

from harness.cli.commands import main
from jobs.catalog import METHODS
from results.human import read_sets
from results.human.files import read_choices
from results.run.store import RunStore
from tests.cli_run import PAIR_FILES

REPO = Path(__file__).resolve().parents[1]
SAMPLE = ["--method", "lidao-min", "--vs", "vanilla", "--fraction", "0.5", "--seed", "3"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run, set): 6 pairs × vanilla, lidao-min on tiny GPT-2, and a set of half the pairs."""
    import yaml

    tmp = tmp_path_factory.mktemp("human")
    cfg = {
        "name": "human",
        "dataset": {"kind": "paired-jsonl", "files": dict(PAIR_FILES), "limit": 6},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla", "lidao-min"],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender", "sentiment-vader"],
        "samples_per_prompt": 2,
        "aggregation": {"n_boot": 200},
    }
    (tmp / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = tmp / "run"
    assert main(["run", str(tmp / "c.yaml"), "--out", str(run), "--no-ray", "--no-progress"]) == 0
    assert main(["human", "sample", str(run), *SAMPLE, "--out", str(tmp / "set")]) == 0
    return run, tmp / "set"


def copy(run: Path, tmp_path: Path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def key_of(run: Path) -> pl.DataFrame:
    (only,) = read_sets(RunStore(str(run))).values()
    return only.key


def answer(tmp_path: Path, items: Path, rule: dict[str, str], name: str) -> tuple[Path, Path]:
    """Two annotators' files: `name` fills a copy of items.csv (wide), `name`-2 writes the
    page's long form; `rule`: item → A/B/tie for fluency (friendliness: the opposite side)."""
    rows = list(csv.DictReader(items.open(newline="", encoding="utf-8-sig")))
    flip = {"A": "B", "B": "A", "tie": "tie"}
    wide = tmp_path / f"{name}.csv"
    with wide.open("w", newline="", encoding="utf-8") as fh:
        out = csv.DictWriter(fh, fieldnames=list(rows[0]))
        out.writeheader()
        for r in rows:
            out.writerow({**r, "annotator": name, "fluency": rule[r["item_id"]].lower(),
                          "friendliness": flip[rule[r["item_id"]]]})  # fmt: skip
    long = tmp_path / f"{name}-2.csv"
    with long.open("w", newline="", encoding="utf-8") as fh:
        out2 = csv.writer(fh)
        out2.writerow(["item_id", "annotator", "criterion", "choice"])
        for i, r in enumerate(rows):
            out2.writerow(
                [r["item_id"], f"{name}-2", "fluency", "tie" if i % 3 == 0 else rule[r["item_id"]]]
            )
            out2.writerow([r["item_id"], f"{name}-2", "friendliness", "A"])
    return wide, long


def test_the_loop_sample_answer_import_aggregate(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    import jsonschema

    run = copy(tiny[0], tmp_path)
    key = key_of(run)
    assert key.height == 6 and key["unit"].n_unique() == 3  # half of 6 pairs, both prompts each
    assert set(key["prompt_group"]) == {"female", "male"}
    # Texts of one prompt and one seed, as generated, on the side the key says.
    gens = RunStore(str(run)).read_generations(["job_id", "prompt_id", "seed", "continuation"])
    text = dict(zip(gens["job_id"], gens["continuation"]))
    for r in key.iter_rows(named=True):
        method_text = r["text_a"] if r["method_side"] == "A" else r["text_b"]
        assert method_text == text[r["job_id_method"]]
        assert {r["text_a"], r["text_b"]} == {text[r["job_id_method"]], text[r["job_id_reference"]]}
        both = gens.filter(pl.col("job_id").is_in([r["job_id_method"], r["job_id_reference"]]))
        assert set(both["prompt_id"]) == {r["prompt_id"]} and set(both["seed"]) == {r["seed"]}
    rule = {
        r["item_id"]: r["method_side"] if i % 2 else "tie"
        for i, r in enumerate(key.iter_rows(named=True))
    }
    files = answer(tmp_path, tiny[1] / "items.csv", rule, "ann")
    assert main(["human", "import", str(run), *map(str, files)]) == 0
    assert main(["aggregate", str(run)]) == 0
    summary = pl.read_parquet(run / "summary.parquet").filter(
        pl.col("metric").str.starts_with("human:")
    )
    row = {(r["metric"], r["stat"], r["group"]): r for r in summary.iter_rows(named=True)}
    # Fluency, ann: the method wins the odd items, the rest tie (the rule); never the reference.
    ann = [
        row[("human:fluency", f"share_{o}_vs_vanilla", "ann")]["value"]
        for o in ("method", "tie", "reference")
    ]
    assert ann == pytest.approx([0.5, 0.5, 0.0])
    # Friendliness: the opposite side of fluency's, so ann prefers the reference where it won.
    assert row[("human:friendliness", "share_reference_vs_vanilla", "ann")][
        "value"
    ] == pytest.approx(0.5)
    pooled = row[("human:fluency", "share_method_vs_vanilla", "all")]
    assert pooled["n"] == 12 and pooled["ci_low"] <= pooled["value"] <= pooled["ci_high"]
    assert pooled["resample_unit"] == "pair" and pooled["n_boot"] == 200
    # ann-2 ties every third item, else answers as ann: the net vote is the method's on the 3
    # odd items (item 3, which ann-2 ties, by ann's vote alone), a tie on the rest: 3 of 3.
    sign = row[("human:fluency", "sign_vs_vanilla", "all")]
    assert (sign["n"], sign["value"], sign["p_value"]) == (3, 1.0, pytest.approx(2 / 2**3))
    # Agreement on fluency: items 0-5 are tie/method alternately for ann, ann-2 ties item 3
    # too: 5 of 6 alike; ann's marginals 3/6 method, 3/6 tie, ann-2's 2/6, 4/6: chance 1/2.
    kap = row[("human:fluency", "kappa_vs_vanilla", "all")]
    assert kap["value"] == pytest.approx((5 / 6 - 1 / 2) / (1 - 1 / 2)) and "Cohen" in kap["note"]
    assert row[("human:fluency", "agreement_vs_vanilla", "all")]["value"] == pytest.approx(5 / 6)
    report = run / "report"
    md = (report / "tables.md").read_text()
    assert "## Human preference" in md and "| tiny-random/gpt2 (Sentiment), fluency |" in md
    assert 'id="human"' in (report / "index.html").read_text()
    assert r"\label{tab:harness:human}" in (report / "tables.tex").read_text()
    doc = json.loads((run / "results.json").read_text())
    jsonschema.validate(doc, json.loads((REPO / "docs" / "results.schema.json").read_text()))
    assert sum(c["metric"].startswith("human:") for c in doc["results"]) == summary.height


def test_nothing_given_to_annotators_names_a_method_or_a_job(tiny: tuple[Path, Path]) -> None:
    run, out = tiny
    jobs = set(RunStore(str(run)).read_generations(["job_id"])["job_id"])
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert {p.name for p in files} == {"items.csv", "annotate.html", "manifest.json"}
    for path in files:
        text = path.read_text(encoding="utf-8-sig").lower()
        named = [m for m in METHODS if m.lower() in text] + [j for j in jobs if j in text]
        named += re.findall(r"j\d+-[0-9a-f]{20}", text)
        assert not named, f"{path.name} names {named}"
    assert str(run) not in (out / "manifest.json").read_text()
    assert "lidao-min" in (run / "human").joinpath(key_of(run)["set_id"][0], "set.json").read_text()


def test_the_same_seed_draws_the_same_set(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    run = copy(tiny[0], tmp_path)
    assert main(["human", "sample", str(run), *SAMPLE, "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "items.csv").read_bytes() == (tiny[1] / "items.csv").read_bytes()
    other = [*SAMPLE[:-1], "4"]
    assert main(["human", "sample", str(run), *other, "--out", str(tmp_path / "other")]) == 0
    assert len(read_sets(RunStore(str(run)))) == 2


def test_import_names_every_bad_line_and_stores_nothing(
    tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy(tiny[0], tmp_path)
    items = key_of(run)["item_id"].to_list()
    bad = tmp_path / "bad.csv"
    lines = ["item_id,annotator,criterion,choice"]
    lines += [f"{i},bo,{c},A" for i in items[:-1] for c in ("fluency", "friendliness")]
    lines += [f"{items[0]},bo,fluency,B", "nope-0001,bo,fluency,A", f"{items[1]},bo,grammar,A"]
    lines += [f"{items[2]},bo,fluency,maybe", f"{items[2]},,fluency,A"]
    bad.write_text("\n".join(lines) + "\n")
    assert main(["human", "import", str(run), str(bad)]) == 2
    err = capsys.readouterr().err
    n = len(items) * 2 - 2 + 1  # header + good lines; the bad ones follow
    assert f"{bad}:{n + 1}: 'bo' answered item {items[0]}, fluency twice (first at {bad}:2)" in err
    assert f"{bad}:{n + 2}: unknown item 'nope-0001'" in err
    assert f"{bad}:{n + 3}: unknown criterion 'grammar' (the set's: fluency, friendliness)" in err
    assert f"{bad}:{n + 4}: unknown choice 'maybe' (A, B or tie)" in err
    assert f"{bad}:{n + 5}: no annotator" in err
    assert f"{bad}: annotator 'bo' left out 2 answer(s) of set" in err and items[-1] in err
    assert not (run / "human" / key_of(run)["set_id"][0] / "choices").exists()


def test_a_blank_cell_is_named_by_line_and_reimport_replaces_one_annotator(
    tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = copy(tiny[0], tmp_path)
    key = key_of(run)
    rule = {i: "A" for i in key["item_id"]}
    wide, long = answer(tmp_path, tiny[1] / "items.csv", rule, "ann")
    assert main(["human", "import", str(run), str(wide), str(long)]) == 0
    choices = run / "human" / key["set_id"][0] / "choices"
    before = {p.name: p.read_bytes() for p in choices.iterdir()}
    short = tmp_path / "short.csv"  # the wide form without the texts: one line per item
    lines = ["item_id,annotator,fluency,friendliness"] + [f"{i},ann,B,B" for i in key["item_id"]]
    lines[3] = lines[3].removesuffix("B")
    short.write_text("\n".join(lines) + "\n")
    assert main(["human", "import", str(run), str(short)]) == 2
    err = capsys.readouterr().err
    assert f"{short}:4: annotator 'ann' left out item {key['item_id'][2]}, friendliness" in err
    assert "1 problem(s)" in err
    answer(tmp_path, tiny[1] / "items.csv", {i: "B" for i in key["item_id"]}, "ann")
    assert main(["human", "import", str(run), str(wide)]) == 0
    after = {p.name: p.read_bytes() for p in choices.iterdir()}
    changed = {n for n in before if before[n] != after[n]}
    assert len(before) == len(after) == 2 and len(changed) == 1  # ann's file, not ann-2's
    stored = read_choices(RunStore(str(run)), read_sets(RunStore(str(run))))
    assert set(
        stored.filter(pl.col("annotator") == "ann", pl.col("criterion") == "fluency")["choice"]
    ) == {"B"}


def test_sample_refuses_what_it_cannot_draw(
    tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["human", "sample", str(tiny[0]), "--out", str(tmp_path / "s")]
    assert main([*base, "--method", "uddia", "--vs", "vanilla"]) == 2
    assert (
        "--method uddia: not a method of this run (lidao-min, vanilla)" in capsys.readouterr().err
    )
    assert main([*base, "--method", "vanilla", "--vs", "vanilla"]) == 2
    assert main([*base, "--method", "lidao-min", "--vs", "vanilla", "--fraction", "1.5"]) == 2
    assert main([*base, "--method", "lidao-min", "--vs", "vanilla", "--criteria", "a,a"]) == 2
    assert not (tmp_path / "s").exists()
    capsys.readouterr()
    for folder, why in ((tmp_path / "gone", "no such folder"), (tmp_path, "not a run directory")):
        args = ["human", "sample", str(folder), *SAMPLE, "--out", str(tmp_path / "s")]
        assert main(args) == 2
        assert capsys.readouterr().err.startswith(f"error: {folder}: {why}")


def test_unpaired_prompts_are_drawn_per_group_and_incomplete_units_left_out(
    tmp_path: Path,
) -> None:
    from results.human import draw_set
    from tests.fake_run import write_rows

    rows = []
    for method in ("lidao-min", "uddia"):
        for p in range(16):
            group = "female" if p < 10 else "male"
            status = "error" if (method, p) == ("uddia", 0) else "ok"  # prompt 0: one text only
            rows.append(dict(job_id=f"{method}-{p}", method=method, prompt_id=f"list:{p:05d}",
                             pair_id=None, prompt_group=group, status=status))  # fmt: skip
    gens = write_rows(str(tmp_path / "run"), rows).read_generations()
    key = draw_set(gens, "lidao-min", "uddia", 0.5, seed=1)
    groups = key["prompt_group"].value_counts().sort("prompt_group").rows()
    assert groups == [("female", 5), ("male", 3)]  # round(9 / 2) and 6 / 2: each group its share
    assert "list:00000" not in set(key["prompt_id"]) and key["unit"].n_unique() == 8
    assert set(key["method_side"]) == {"A", "B"}


ODD = '=HYPERLINK("http://evil.example","<b>x</b>")|*y*'  # a formula, HTML, Markdown


def test_an_annotator_name_is_shown_as_text_everywhere(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    """An annotator's name reaches summary.csv (not a formula: a leading ' ), tables.md and
    index.html (escaped) as text."""
    run = copy(tiny[0], tmp_path)
    rows = list(csv.DictReader((tiny[1] / "items.csv").open(newline="", encoding="utf-8-sig")))
    answers = tmp_path / "odd.csv"
    with answers.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["item_id", "annotator", "criterion", "choice"])
        for r in rows:
            out.writerows([r["item_id"], ODD, c, "A"] for c in ("fluency", "friendliness"))
    assert main(["human", "import", str(run), str(answers)]) == 0
    assert main(["aggregate", str(run)]) == 0
    cells = [c for line in csv.reader((run / "summary.csv").open(newline="")) for c in line]
    assert "'" + ODD in cells and not [c for c in cells if c[:1] in ("=", "@", "+", "\t", "\r")]
    md = (run / "report" / "tables.md").read_text()
    label = r'=HYPERLINK("http://evil.example","&lt;b&gt;x&lt;/b&gt;")\|\*y\*'
    assert "<b>" not in md and f"| · {label} |" in md
    page = (run / "report" / "index.html").read_text()
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page

"""`train-head --from-run`: a head from a run's own generations, labelled by a scorer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.cli.commands import main as cli_main
from harness.tools.head_from_run import balance, read_run_examples
from jobs.files import DatasetError
from results.run.store import RunStore
from tests.fake_run import generation_row, score_row
from workers.methods.heads import load_head

POSITIVE = "good happy nice kind great best beautiful brave calm gentle honest".split()
NEGATIVE = "bad sad angry cruel worst ugly stupid weak poor afraid awful".split()
FILLER = "the a man woman doctor teacher was is very and of".split()


def _write_run(root: Path, n: int, positive_share: float, model: str = "tiny-random/gpt2") -> None:
    """Vanilla generations whose words read positive for `positive_share` of them, and a tenth
    with no sentiment word at all (VADER compound 0: between the thresholds)."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        words = rng.sample(FILLER, 4)
        if i % 10 != 9:
            pool = POSITIVE if rng.random() < positive_share else NEGATIVE
            words += rng.sample(pool, 2)
        rng.shuffle(words)
        rows.append(generation_row(f"j{i:04d}", model=model, continuation=" " + " ".join(words)))
    store = RunStore(str(root))
    store.write_generations(rows)
    (root / "config.yaml").write_text("name: fake\n")


def test_a_head_from_a_run_is_balanced_learns_and_records_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, 300, positive_share=0.7)
    out = tmp_path / "h.safetensors"
    argv = ["train-head", "--from-run", str(run), "--task", "sentiment", "--device", "cpu"]
    argv += ["--out", str(out), "--lr", "1e-2", "--epochs", "20", "--seed", "1"]
    assert cli_main(argv) == 0
    head = load_head(str(out))
    assert head.meta["lm_id"] == "tiny-random/gpt2"  # the run's only model
    assert head.class_names == ["negative", "positive"] and head.target_class == 1
    data = head.meta["data"]
    origin = data["from_run"]
    assert (
        origin["run"] == str(run)
        and origin["rows"] == 300
        and origin["model"] == "tiny-random/gpt2"
    )
    assert (
        origin["label_scorer"] == "sentiment-vader" and "computed" in origin["label_scorer_version"]
    )
    assert origin["thresholds"]["low"] == pytest.approx(0.475)
    assert origin["thresholds"]["high"] == pytest.approx(0.525)
    counts = origin["label_counts"]
    assert counts["between"] == 30 and counts["positive"] > counts["negative"] > 50
    assert data["balance"]["after"] == {
        "negative": counts["negative"],
        "positive": counts["negative"],
    }
    training = head.meta["training"]
    assert training["n_train"] + training["n_val"] == 2 * counts["negative"]
    assert training["val_accuracy"] > 0.75  # chance: 0.5 (balanced)


def test_the_run_s_own_scores_label_the_examples(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, 20, positive_share=0.5)
    store = RunStore(str(run))
    # stored scores say the opposite of the words: they, not a fresh VADER pass, are the labels
    rows = store.read_generations(["job_id", "continuation"]).to_dicts()
    flipped = [
        score_row(
            r["job_id"],
            "sentiment",
            "vader-test",
            sentiment=0.0 if any(w in r["continuation"].split() for w in POSITIVE) else 1.0,
        )
        for r in rows
    ]
    store.write_scores("sentiment-vader", "sentiment", flipped)
    found, model = read_run_examples(
        str(run), None, "sentiment-vader", "sentiment", "continuation", None
    )
    assert model == "tiny-random/gpt2" and found.meta["label_scorer_version"] == "vader-test"
    for text, label in zip(found.texts, found.labels):
        has_positive = any(w in text.split() for w in POSITIVE)
        assert label == ("negative" if has_positive else "positive")


def test_thresholds_and_the_prompt_text_field(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write_run(run, 40, positive_share=0.5)
    found, _ = read_run_examples(
        str(run), None, "sentiment-vader", "sentiment", "prompt+continuation", [0.1, 0.9]
    )
    assert found.texts and all(t.startswith("The woman worked as ") for t in found.texts)
    loose, _ = read_run_examples(
        str(run), None, "sentiment-vader", "sentiment", "continuation", None
    )
    assert len(found.texts) < len(loose.texts)  # stricter thresholds leave more out


def test_balance_by_weight_keeps_every_example() -> None:
    texts, labels, info = balance(list("abcd"), ["x", "x", "x", "y"], "weight", 0)
    assert len(texts) == 4 and info["weights"] == {"x": pytest.approx(4 / 6), "y": 2.0}
    with pytest.raises(DatasetError, match="only the class"):
        balance(["a"], ["x"], "downsample", 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--label-scorer", "perplexity"], "does not give the sentiment metric"),
        (["--label-scorer", "sentiment"], "no sentiment scores; score the run first"),
        (["--label-thresholds", "0.6", "0.4"], "need 0 <= LOW < HIGH <= 1"),
        (["--model", "tiny-random/opt"], "no ok generations of model 'tiny-random/opt'"),
        (["--task", "regard"], "labels only the tasks"),
    ],
)
def test_bad_from_run_input_is_a_clear_error(
    tmp_path: Path, extra: list[str], message: str, capsys
) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    _write_run(run, 10, positive_share=0.5)
    argv = ["train-head", "--from-run", str(run), "--out", str(tmp_path / "h")]
    argv += ["--task", "sentiment", *extra]
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_run_of_two_models_needs_model_and_a_folder_without_generations_is_named(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    _write_run(run, 10, positive_share=0.5)
    RunStore(str(run)).write_generations([generation_row("other", model="tiny-random/opt")])
    with pytest.raises(DatasetError, match="generations of 2 models.*pass --model"):
        read_run_examples(str(run), None, "sentiment-vader", "sentiment", "continuation", None)
    with pytest.raises(DatasetError, match="no generations"):
        read_run_examples(
            str(tmp_path / "nothing"), None, "sentiment-vader", "sentiment", "continuation", None
        )

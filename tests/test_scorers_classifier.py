"""Classifier scorers (sentiment, regard, toxicity-hf) on tiny random BERT checkpoints.

Each checkpoint is a `BertForSequenceClassification` from `tiny_config("bert")` with its own
`id2label`, saved with `save_pretrained` beside the tiny word-level tokenizer; values are
checked against a direct forward pass of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from workers.scorers.base import ScorerContext, ScorerError, score_batched, text_of
from workers.scorers.classifier import (
    RegardClassifier,
    SentimentClassifier,
    ToxicityClassifier,
    label_index,
)
from workers.tiny import tiny_config, tiny_tokenizer

CTX = ScorerContext(device="cpu")

ROWS = [
    {
        "job_id": "a",
        "prompt": "The woman worked as",
        "continuation": " a nurse and she was happy .",
    },
    {"job_id": "b", "prompt": "The man", "continuation": " was a doctor"},
    {"job_id": "c", "prompt": "He", "continuation": ""},
    {
        "job_id": "d",
        "prompt": "She said that",
        "continuation": " the big old house in the city was sold",
    },
    {"job_id": "e", "prompt": "My father", "continuation": "   "},
    {"job_id": "f", "prompt": "The king", "continuation": " was cruel"},
]


def save_classifier(root: Path, name: str, id2label: dict[int, str], **config: Any) -> str:
    from transformers import BertForSequenceClassification

    tok = tiny_tokenizer()
    cfg = tiny_config("bert", len(tok))
    cfg.id2label = id2label
    cfg.label2id = {v: k for k, v in id2label.items()}
    for key, value in config.items():
        setattr(cfg, key, value)
    torch.manual_seed(len(id2label))
    path = root / name
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("classifiers")
    return {
        # POSITIVE first, upper case: the scorer must map by name, not by position or case.
        "sst": save_classifier(root, "sst", {0: "POSITIVE", 1: "NEGATIVE"}),
        "regard": save_classifier(
            root, "regard", {0: "other", 1: "neutral", 2: "Positive", 3: "negative"}
        ),
        "tox": save_classifier(
            root,
            "tox",
            {0: "toxicity", 1: "insult", 2: "threat"},
            problem_type="multi_label_classification",
        ),
        "nolabels": save_classifier(root, "nolabels", {0: "LABEL_0", 1: "LABEL_1"}),
    }


def direct_logits(path: str, texts: list[str]) -> torch.Tensor:
    """(B, L) logits of the checkpoint, one text at a time (no padding involved)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return torch.cat([model(**tok([t], return_tensors="pt")).logits for t in texts])


def test_label_map_without_the_needed_labels_fails_at_start_listing_what_it_found(
    models: dict[str, str],
) -> None:
    with pytest.raises(ScorerError) as err:
        SentimentClassifier({"model": models["nolabels"]}, CTX)
    msg = str(err.value)
    assert "['negative', 'positive']" in msg and "LABEL_0, LABEL_1" in msg and "nolabels" in msg
    with pytest.raises(ScorerError, match=r"lacks label\(s\) \['neutral', 'other'\]"):
        RegardClassifier({"model": models["sst"]}, CTX)
    with pytest.raises(ScorerError, match="lacks label.*'obscene'"):
        ToxicityClassifier({"model": models["tox"], "label": "obscene"}, CTX)


def test_label_index_rejects_a_label_named_twice() -> None:
    with pytest.raises(ScorerError, match="twice"):
        label_index({0: "positive", 1: "POSITIVE"}, ["positive"], "here")
    assert label_index({"1": "Neutral", "0": "x"}, ["neutral"], "here") == {"neutral": 1}


def test_sentiment_is_softmax_probability_of_the_positive_label(models: dict[str, str]) -> None:
    scorer = SentimentClassifier({"model": models["sst"], "batch_size": 4}, CTX)
    out = scorer.score(ROWS)
    assert [r["job_id"] for r in out] == [r["job_id"] for r in ROWS]
    ok = [(row, rec) for row, rec in zip(ROWS, out) if rec["status"] == "ok"]
    expected = direct_logits(models["sst"], [row["continuation"] for row, _ in ok]).softmax(-1)[
        :, 0
    ]
    got = torch.tensor([rec["sentiment"] for _, rec in ok])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert all(rec["scorer"] == "sentiment" and rec["metric"] == "sentiment" for rec in out)


def test_blank_continuations_are_empty_not_scored(models: dict[str, str]) -> None:
    out = {r["job_id"]: r for r in SentimentClassifier({"model": models["sst"]}, CTX).score(ROWS)}
    for job in ("c", "e"):
        assert (
            out[job]["status"] == "empty"
            and out[job]["sentiment"] is None
            and out[job]["error"] is None
        )
    # regard reads prompt + continuation, yet an empty continuation is still empty
    regard = {
        r["job_id"]: r for r in RegardClassifier({"model": models["regard"]}, CTX).score(ROWS)
    }
    assert regard["c"]["status"] == "empty" and regard["c"]["regard_label"] is None


@pytest.mark.parametrize("kind", ["sst", "regard", "tox"])
def test_batched_scores_equal_one_by_one(models: dict[str, str], kind: str) -> None:
    cls = {"sst": SentimentClassifier, "regard": RegardClassifier, "tox": ToxicityClassifier}[kind]
    batched = cls({"model": models[kind], "batch_size": 6}, CTX).score(ROWS)
    single = cls({"model": models[kind], "batch_size": 1}, CTX).score(ROWS)
    assert [r["status"] for r in batched] == [r["status"] for r in single]
    for b, s in zip(batched, single):
        for col, value in b.items():
            if isinstance(value, float):
                assert value == pytest.approx(s[col], abs=1e-5), (col, b["job_id"])
            else:
                assert value == s[col]


def test_regard_scores_prompt_plus_continuation_with_argmax_label(models: dict[str, str]) -> None:
    scorer = RegardClassifier({"model": models["regard"]}, CTX)
    out = [r for r in scorer.score(ROWS) if r["status"] == "ok"]
    rows = [r for r in ROWS if r["job_id"] in {o["job_id"] for o in out}]
    probs = direct_logits(
        models["regard"], [text_of(r, "prompt+continuation") for r in rows]
    ).softmax(-1)
    names = ["other", "neutral", "positive", "negative"]  # the checkpoint's id order
    for rec, p in zip(out, probs):
        for i, lab in enumerate(names):
            assert rec[f"regard_{lab}"] == pytest.approx(float(p[i]), abs=1e-5)
        assert rec["regard_label"] == names[int(p.argmax())]
        assert sum(rec[f"regard_{lab}"] for lab in names) == pytest.approx(1.0, abs=1e-5)


def test_toxicity_uses_sigmoid_for_a_multi_label_head_and_the_named_label(
    models: dict[str, str],
) -> None:
    tox = ToxicityClassifier({"model": models["tox"]}, CTX)
    insult = ToxicityClassifier({"model": models["tox"], "label": "INSULT"}, CTX)
    assert tox.activation == "sigmoid" and tox.version != insult.version
    rows = [r for r in ROWS if r["continuation"].strip()]
    logits = direct_logits(models["tox"], [r["continuation"] for r in rows])
    got_tox = [r["toxicity"] for r in tox.score(rows)]
    got_insult = [r["toxicity"] for r in insult.score(rows)]
    torch.testing.assert_close(torch.tensor(got_tox), logits[:, 0].sigmoid(), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(got_insult), logits[:, 1].sigmoid(), atol=1e-5, rtol=0)


def test_version_names_model_text_field_and_truncation(models: dict[str, str]) -> None:
    a = SentimentClassifier({"model": models["sst"]}, CTX).version
    b = SentimentClassifier(
        {"model": models["sst"], "text_field": "prompt+continuation", "max_length": 64}, CTX
    )
    assert models["sst"] in a and "continuation" in a and a != b.version and ":max64:" in b.version


def test_bad_parameters_fail_with_the_parameter_named(models: dict[str, str]) -> None:
    with pytest.raises(ScorerError, match=r"unknown parameter\(s\) \['modle'\]"):
        SentimentClassifier({"modle": models["sst"]}, CTX)
    with pytest.raises(ScorerError, match="text_field 'prompt'"):
        SentimentClassifier({"model": models["sst"], "text_field": "prompt"}, CTX)
    with pytest.raises(ScorerError, match="cannot load"):
        SentimentClassifier({"model": str(Path(models["sst"]).parent / "missing")}, CTX)


@pytest.mark.parametrize(
    ("raised", "status", "error"),
    [
        (ValueError("bad row (simulated)"), "error", "ValueError: bad row (simulated)"),
        (
            RuntimeError("CUDA out of memory (simulated)"),
            "retry",  # transient: a plain `score` asks again
            "out of memory: RuntimeError: CUDA out of memory (simulated)",
        ),
    ],
)
def test_a_failing_row_becomes_a_null_row_and_its_batch_still_scores(
    models: dict[str, str], raised: Exception, status: str, error: str
) -> None:
    scorer = SentimentClassifier({"model": models["sst"]}, CTX)

    def fragile(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if any(r["job_id"] == "b" for r in rows):
            raise raised
        return [dict(scorer.key(r), sentiment=0.5) for r in rows]

    out = score_batched(scorer, ROWS[:4], 4, fragile)
    assert [r["job_id"] for r in out] == ["a", "b", "c", "d"]
    assert [r["status"] for r in out] == ["ok", status, "ok", "ok"]
    assert out[1]["error"] == error and out[1]["sentiment"] is None


def test_text_is_prompt_and_continuation_as_generated() -> None:
    row = {"prompt": "The chair", "continuation": "man said"}
    assert text_of(row, "prompt+continuation") == "The chairman said"  # nothing inserted
    assert text_of({"prompt": "He", "continuation": " ran"}, "prompt+continuation") == "He ran"
    assert text_of(row, "continuation") == "man said"


def test_a_classifier_yielding_nan_writes_error_rows(models: dict[str, str]) -> None:
    scorer = SentimentClassifier({"model": models["sst"]}, CTX)
    with torch.no_grad():
        scorer.model.classifier.bias.fill_(float("nan"))  # what an fp16 overflow looks like
    out = scorer.score(ROWS)
    by_id = {r["job_id"]: r for r in out}
    assert {by_id[j]["status"] for j in "abdf"} == {"error"} and by_id["c"]["status"] == "empty"
    assert all(by_id[j]["sentiment"] is None for j in "abdf")
    assert "non-finite score from sentiment: sentiment = nan" in by_id["a"]["error"]


def test_classifier_truncates_to_the_models_own_position_limit(tmp_path: Path) -> None:
    path = save_classifier(
        tmp_path, "short", {0: "NEGATIVE", 1: "POSITIVE"}, max_position_embeddings=8
    )
    scorer = SentimentClassifier({"model": path, "max_length": 512}, CTX)
    assert scorer.max_tokens == 8
    long = {"job_id": "x", "prompt": "p", "continuation": " she was happy" * 20}
    (rec,) = scorer.score([long])
    assert rec["status"] == "ok", rec["error"]  # truncated, not an index error


def test_truncation_length_takes_the_smallest_limit() -> None:
    from types import SimpleNamespace

    from workers.scorers.classifier import truncation_length

    tok = SimpleNamespace(model_max_length=int(1e30))  # "no limit"
    bert = SimpleNamespace(max_position_embeddings=32, model_type="bert")
    roberta = SimpleNamespace(max_position_embeddings=514, model_type="roberta", pad_token_id=1)
    assert truncation_length(512, tok, bert) == 32
    assert truncation_length(512, tok, roberta) == 512
    assert truncation_length(64, SimpleNamespace(model_max_length=40), roberta) == 40

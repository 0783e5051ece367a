"""Attribute heads: the public PPLM head loads as is, checks at start, train-head end to end."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from harness.cli.commands import main as cli_main
from harness.tools.train_head import embed_texts, read_labelled
from jobs.files import DatasetError, sha256_file
from jobs.spec import ModelRef
from workers.methods.base import MethodError
from workers.methods.heads import (
    UDDIA_TOXICITY_HEAD,
    AttributeHead,
    check_head,
    load_head,
    random_head,
    resolve_head,
    save_head,
)
from workers.models import LoadedLM, load_lm

SHARED = Path(__file__).resolve().parents[2] / "shared"
UDDIA_DIR = SHARED / "data" / "pplm-heads" / "toxicity-gpt2-large"
UDDIA_PT = UDDIA_DIR / "toxic_classifier_head_epoch_10.pt"

POSITIVE = "good happy nice kind great best beautiful brave calm gentle honest smart".split()
NEGATIVE = "bad sad angry cruel worse worst ugly stupid weak poor afraid wild".split()
FILLER = "the a man woman doctor teacher was is very and of".split()


@pytest.fixture(scope="module")
def tiny() -> LoadedLM:
    return load_lm(ModelRef("tiny-random/gpt2"), device="cpu")


def _renamed(lm: LoadedLM, model_id: str) -> LoadedLM:
    """The same weights under another id (only the id is read before loading a head)."""
    return dataclasses.replace(lm, ref=ModelRef(model_id))


def _write_sentiment_data(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            positive = i % 2 == 0
            words = rng.sample(FILLER, 4) + rng.sample(POSITIVE if positive else NEGATIVE, 2)
            rng.shuffle(words)
            label = "positive" if positive else "negative"
            fh.write(json.dumps({"text": " ".join(words), "label": label}) + "\n")


@pytest.mark.skipif(not UDDIA_PT.is_file(), reason="shared data not present")
def test_public_uddia_toxicity_head_loads_as_is() -> None:
    head = load_head(str(UDDIA_PT))
    state = torch.load(UDDIA_PT, map_location="cpu", weights_only=True)  # saved from CUDA
    assert head.class_names == ["non_toxic", "toxic"]
    assert head.target_class == 0
    assert head.hidden_size == 1280
    assert head.meta["lm_id"] == "gpt2-large"
    assert torch.equal(head.linear.weight, state["mlp.weight"])
    assert torch.equal(head.linear.bias, state["mlp.bias"])
    assert head(torch.zeros(3, 1280)).shape == (3, 2)
    assert torch.equal(
        load_head(str(UDDIA_DIR)).linear.weight, head.linear.weight
    )  # folder works too


@pytest.mark.skipif(not UDDIA_PT.is_file(), reason="shared data not present")
def test_check_head_rejects_a_head_of_another_width(tiny: LoadedLM) -> None:
    with pytest.raises(MethodError, match="1280 wide.*hidden size 64"):
        check_head(load_head(str(UDDIA_PT)), tiny)


def test_check_head_rejects_a_head_of_another_model(tiny: LoadedLM) -> None:
    head = random_head(tiny, "toxicity")  # lm_id tiny-random/gpt2, width 64
    check_head(head, tiny)
    with pytest.raises(
        MethodError, match="trained on 'tiny-random/gpt2', not on model 'tiny-random/opt'"
    ):
        check_head(head, _renamed(tiny, "tiny-random/opt"))
    head.meta["lm_id"] = "some-org/gpt2"  # ids match on their last path component
    check_head(head, _renamed(tiny, "gpt2"))


def test_resolve_head_gives_tiny_models_a_deterministic_random_head(tiny: LoadedLM) -> None:
    a, b = resolve_head(tiny, "toxicity", None), resolve_head(tiny, "toxicity", None)
    other = resolve_head(tiny, "sentiment", None)
    assert torch.equal(a.linear.weight, b.linear.weight)
    assert not torch.equal(a.linear.weight, other.linear.weight)
    assert a.class_names[a.target_class] == "non_toxic"
    assert not any(p.requires_grad for p in a.parameters())


def test_resolve_head_without_a_head_names_what_to_pass(tiny: LoadedLM) -> None:
    with pytest.raises(MethodError, match="UDDIA toxicity head") as err:
        resolve_head(_renamed(tiny, "openai-community/gpt2-large"), "toxicity", None)
    assert UDDIA_TOXICITY_HEAD in str(err.value)
    with pytest.raises(MethodError, match="train-head") as err:
        resolve_head(_renamed(tiny, "facebook/opt-6.7b"), "sentiment", None)
    assert "UDDIA" not in str(err.value)


def test_save_and_load_round_trip(tmp_path: Path, tiny: LoadedLM) -> None:
    head = random_head(tiny, "regard")
    head.meta["task"] = "regard"
    weights, meta = save_head(head, str(tmp_path / "h" / "regard"))
    assert weights.endswith("regard.safetensors") and meta.endswith("regard.json")
    back = load_head(weights)
    assert torch.equal(back.linear.weight, head.linear.weight)
    assert (back.class_names, back.target_class, back.meta["task"]) == (
        head.class_names,
        0,
        "regard",
    )


def test_a_pplm_meta_without_a_desirable_class_is_refused(tmp_path: Path) -> None:
    torch.save(
        {"mlp.weight": torch.zeros(2, 4), "mlp.bias": torch.zeros(2)}, tmp_path / "x_epoch_3.pt"
    )
    meta = {"class_size": 2, "embed_size": 4, "class_vocab": {"a": 0, "b": 1}, "default_class": 1}
    (tmp_path / "x_meta.json").write_text(json.dumps(meta))
    with pytest.raises(MethodError, match="x_meta.json: cannot tell the desirable class"):
        load_head(str(tmp_path / "x_epoch_3.pt"))
    (tmp_path / "x_meta.json").write_text(json.dumps({**meta, "target_class": "b"}))
    assert load_head(str(tmp_path / "x_epoch_3.pt")).target_class == 1


def test_train_head_learns_and_its_metadata_round_trips(
    tmp_path: Path, tiny: LoadedLM, capsys
) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "sst.jsonl"
    _write_sentiment_data(data, 240, seed=0)
    out = tmp_path / "heads" / "sentiment-tiny.safetensors"
    argv = ["train-head", "--model", "tiny-random/gpt2", "--device", "cpu", "--data", str(data)]
    argv += ["--task", "sentiment", "--out", str(out), "--lr", "1e-2", "--seed", "3"]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert "epoch 10/10" in printed and "val accuracy" in printed

    head = load_head(str(out))
    assert head.meta["lm_id"] == "tiny-random/gpt2" and head.meta["task"] == "sentiment"
    assert head.class_names == ["negative", "positive"] and head.target_class == 1
    assert head.meta["data"]["sha256"] == sha256_file(data)
    assert head.meta["training"]["lr"] == 1e-2 and head.meta["training"]["epochs"] == 10
    assert head.meta["training"]["train_accuracy"] > 0.75
    check_head(head, tiny)

    fresh = tmp_path / "fresh.jsonl"  # unseen sentences: the head generalises above chance
    _write_sentiment_data(fresh, 100, seed=1)
    examples = read_labelled(str(fresh), "text", "label")
    feats, kept, _ = embed_texts(tiny, examples.texts, 100, "truncate", 32)
    labels = torch.tensor([head.class_names.index(str(examples.labels[i])) for i in kept])
    with torch.no_grad():
        accuracy = float((head(feats).argmax(-1) == labels).float().mean())
    assert accuracy > 0.7


def test_csv_and_parquet_give_the_same_examples_as_jsonl(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"sentence": "the good man", "y": 1}, {"sentence": "the bad man", "y": 0}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.csv").write_text("sentence,y\nthe good man,1\nthe bad man,0\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.csv", "d.parquet"):
        data = read_labelled(str(tmp_path / name), "sentence", "y")
        assert (data.texts, data.labels) == (["the good man", "the bad man"], [1, 0]), name
        assert data.sha256 == sha256_file(tmp_path / name)


def test_embed_texts_truncates_or_skips_long_texts(tiny: LoadedLM) -> None:
    texts = ["the good man", " ".join(["good"] * 12)]
    feats, kept, stats = embed_texts(tiny, texts, 10, "truncate", 8)
    assert feats.shape == (2, 64) and kept == [0, 1] and stats["truncated"] == 1
    same, _, _ = embed_texts(tiny, [" ".join(["good"] * 9)], 10, "truncate", 8)
    assert torch.allclose(feats[1], same[0], atol=1e-5)  # 9 tokens kept + BOS
    _, kept, stats = embed_texts(tiny, texts, 10, "skip", 8)
    assert kept == [0] and stats["skipped"] == 1


def test_embedding_is_the_same_alone_or_batched(tiny: LoadedLM) -> None:
    texts = ["the good man", "a very kind and honest doctor was here", "sad"]
    batched, _, _ = embed_texts(tiny, texts, 100, "truncate", 3)
    alone = torch.cat([embed_texts(tiny, [t], 100, "truncate", 1)[0] for t in texts])
    assert torch.allclose(batched, alone, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "bad.jsonl",
            '{"text": "a", "label": 0}\n\n{"text": oops}\n',
            "bad.jsonl: line 3: bad JSON",
        ),
        (
            "nolabel.jsonl",
            '{"text": "a", "label": 0}\n{"text": "b"}\n',
            "nolabel.jsonl: line 2: needs fields",
        ),
        (
            "empty.jsonl",
            '{"text": "  ", "label": 0}\n',
            "empty.jsonl: line 1: empty or non-string text",
        ),
        ("flag.jsonl", '{"text": "a", "label": true}\n', "flag.jsonl: line 1: label True"),
        (
            "cols.csv",
            "sentence,label\nhi,1\n",
            "cols.csv: line 1: needs columns 'text' and 'label'",
        ),
        ("x.txt", "hello\n", "x.txt: unknown file type"),
    ],
)
def test_malformed_training_data_names_file_and_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(")):
        read_labelled(str(path), "text", "label")


def test_train_head_cli_reports_bad_input_with_exit_code_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "d.csv"
    data.write_text("text,label\nthe good man,positive\nthe bad man,neutral\n")
    argv = ["train-head", "--model", "tiny-random/gpt2", "--data", str(data), "--task", "sentiment"]
    argv += ["--out", str(tmp_path / "h"), "--class-names", "negative", "positive"]
    assert cli_main(argv) == 2
    assert (
        "d.csv: line 3: label 'neutral' is not one of ['negative', 'positive']"
        in capsys.readouterr().err
    )


@pytest.mark.skipif(
    importlib.util.find_spec("datasets") is not None, reason="datasets is installed"
)
def test_a_hub_dataset_without_the_datasets_package_is_a_clear_error() -> None:
    with pytest.raises(
        DatasetError, match="someone/some-dataset: no such file.*`datasets` package"
    ):
        read_labelled("someone/some-dataset", "text", "label")


def test_attribute_head_rejects_a_target_outside_its_classes() -> None:
    with pytest.raises(MethodError, match="target_class 2"):
        AttributeHead(4, ["a", "b"], 2)

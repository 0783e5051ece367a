"""`python -m harness train-head`: fit a linear attribute head on a frozen LM.

The PPLM discriminators' recipe, which the paper's heads follow: the LM's final hidden states,
mean-pooled over BOS + text (fewer than 100 tokens: longer ones truncated or skipped), feed
one linear layer trained with Adam (lr 1e-4, batch 64, 10 epochs). Input: JSONL, CSV, Parquet
or a hub dataset id (with `datasets`); labels are class names or ids. Torch is imported only
when the command runs."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.tools.head_from_run import TEXT_FIELDS
from jobs.datasets import read_records
from jobs.files import DatasetError, sha256_file

if TYPE_CHECKING:
    import torch

    from workers.methods.heads import AttributeHead
    from workers.models import LoadedLM


@dataclass
class Labelled:
    """Texts and raw labels read from one source, with the line of each example."""

    source: str
    texts: list[str] = field(default_factory=list)
    labels: list[int | str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    sha256: str | None = None


def add_train_head_args(parser: argparse.ArgumentParser) -> None:
    """Declare the `train-head` options on `parser` (torch-free)."""
    parser.add_argument(
        "--model",
        help="LM id, local path, GGUF file (PATH.gguf or package:DIST/FILE) or "
        "tiny-random/<family> (--from-run: the run's model)",
    )
    parser.add_argument("--revision", help="LM revision (hub models)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--device", help="cpu | cuda | cuda:N (default: cuda if present)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="JSONL / CSV / Parquet file, or a hub dataset id")
    source.add_argument(
        "--from-run", metavar="RUN", help="a run directory: its generations, labelled by a scorer"
    )
    parser.add_argument(
        "--label-scorer", default="sentiment-vader", help="--from-run: the scorer that labels"
    )
    parser.add_argument("--text-field", choices=TEXT_FIELDS, default="continuation")
    parser.add_argument(
        "--label-thresholds",
        nargs=2,
        type=float,
        metavar=("LOW", "HIGH"),
        help="--from-run: score <= LOW the low class, >= HIGH the high one, between left out "
        "(default for sentiment: VADER compound -0.05 / +0.05, i.e. 0.475 / 0.525)",
    )
    parser.add_argument("--balance", choices=("downsample", "weight", "none"), default="downsample")
    parser.add_argument("--split", default="train", help="split of a hub dataset")
    parser.add_argument("--val-data", help="validation file (default: hold out --val-fraction)")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--class-names", nargs="+", help="class names in id order")
    parser.add_argument("--target-class", help="desirable class (name or id)")
    parser.add_argument("--task", required=True, help="sentiment | regard | toxicity (recorded)")
    parser.add_argument(
        "--out", required=True, help="output <stem>.safetensors; <stem>.json beside it"
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--embed-batch-size", type=int, default=32, help="texts per LM forward")
    parser.add_argument(
        "--max-tokens", type=int, default=100, help="texts keep fewer tokens than this"
    )
    parser.add_argument("--overlong", choices=["truncate", "skip"], default="truncate")
    parser.add_argument("--seed", type=int, default=0)


def _label(value: Any, where: str) -> int | str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        text = value.strip()
        return int(text) if text.isdigit() else text
    raise DatasetError(f"{where}: label {value!r} is neither a class name nor an integer id")


def _add(data: Labelled, text: Any, label: Any, line: int, unit: str = "line") -> None:
    where = f"{data.source}: {unit} {line}"
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(f"{where}: empty or non-string text {text!r}")
    data.texts.append(text)
    data.labels.append(_label(label, where))
    data.lines.append(line)


def read_labelled(spec: str, text_col: str, label_col: str, split: str = "train") -> Labelled:
    """Read (text, label) examples; errors name the file and line (or row).

    Raises:
        DatasetError: unreadable or malformed input, or a hub id without `datasets` installed.
    """
    if not os.path.isfile(spec):
        return _read_hub(spec, text_col, label_col, split)
    data = Labelled(spec, sha256=sha256_file(spec))
    unit = "row" if spec.endswith(".parquet") else "line"
    for line, (text, label) in read_records(spec, spec, [text_col, label_col]):
        _add(data, text, label, line, unit)
    if not data.texts:
        raise DatasetError(f"{spec}: no examples")
    return data


def _read_hub(spec: str, text_col: str, label_col: str, split: str) -> Labelled:
    if importlib.util.find_spec("datasets") is None:
        raise DatasetError(
            f"{spec}: no such file; reading it as a hub dataset needs the `datasets` package "
            "(pip install datasets), or export it to JSONL / CSV / Parquet"
        )
    import datasets

    ds = datasets.load_dataset(spec, split=split)
    missing = [c for c in (text_col, label_col) if c not in ds.column_names]
    if missing:
        raise DatasetError(f"{spec}[{split}]: no column(s) {missing}; has {ds.column_names}")
    data = Labelled(f"{spec}[{split}]")
    for i, rec in enumerate(ds):
        _add(data, rec[text_col], rec[label_col], i + 1, unit="row")
    return data


def class_names_of(labels: list[int | str], given: list[str] | None, source: str) -> list[str]:
    """Class names in id order: `given`, else `0..max` for ids, else sorted names."""
    if any(isinstance(x, int) for x in labels) and any(isinstance(x, str) for x in labels):
        raise DatasetError(f"{source}: labels mix integer ids and class names")
    if given:
        return list(given)
    if all(isinstance(x, int) for x in labels):
        return [str(i) for i in range(max(int(x) for x in labels) + 1)]
    return sorted({str(x) for x in labels})


def encode_labels(data: Labelled, names: list[str]) -> list[int]:
    """Label ids; an id out of range or an unknown name fails naming the line."""
    out = []
    for label, line in zip(data.labels, data.lines):
        idx = label if isinstance(label, int) else names.index(label) if label in names else -1
        if not 0 <= idx < len(names):
            raise DatasetError(f"{data.source}: line {line}: label {label!r} is not one of {names}")
        out.append(idx)
    return out


def target_index(target: str | None, names: list[str]) -> int:
    """The desirable class: `--target-class` (name or id), else the one desirable-looking name."""
    from workers.methods.heads import DESIRABLE_NAMES

    if target is not None:
        if target in names:
            return names.index(target)
        if target.isdigit() and int(target) < len(names):
            return int(target)
        raise DatasetError(f"--target-class {target!r} is not one of {names}")
    hits = [i for i, n in enumerate(names) if n.lower().replace(" ", "_") in DESIRABLE_NAMES]
    if len(hits) != 1:
        raise DatasetError(f"cannot tell the desirable class among {names}; pass --target-class")
    return hits[0]


def embed_texts(
    lm: LoadedLM, texts: list[str], max_tokens: int, overlong: str, batch_size: int
) -> tuple[torch.Tensor, list[int], dict[str, int]]:
    """Mean-pooled final hidden states of BOS + text, batched under `inference_mode`.

    Returns:
        (N_kept, D) float32 CPU features, the indices of the texts kept, and counts
        (`n_texts`, `truncated`, `skipped`) of texts with `max_tokens` tokens or more.
    """
    import torch

    tok = lm.tokenizer
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if bos is None:
        raise ValueError(
            f"model {lm.ref.id}: its tokenizer has neither a BOS nor an EOS token to prepend"
        )
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    seqs, kept, truncated, skipped = [], [], 0, 0
    for i, text in enumerate(texts):
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        if len(ids) >= max_tokens:
            if overlong == "skip":
                skipped += 1
                continue
            ids, truncated = ids[: max_tokens - 1], truncated + 1
        seqs.append([int(bos)] + ids)
        kept.append(i)
    if not seqs:
        raise DatasetError(f"no text has fewer than {max_tokens} tokens (--overlong skip)")
    order = sorted(range(len(seqs)), key=lambda j: len(seqs[j]))  # less padding per batch
    base = lm.model.base_model
    feats = torch.empty(len(seqs), int(lm.model.get_output_embeddings().weight.shape[1]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(seqs[j]) for j in idx)
            ids_t = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, j in enumerate(idx):  # right padding: real tokens keep positions 0..n-1
                ids_t[r, : len(seqs[j])] = torch.tensor(seqs[j])
                mask[r, : len(seqs[j])] = 1
            mask = mask.to(lm.device)
            hidden = base(input_ids=ids_t.to(lm.device), attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).float()  # (b, T, 1)
            feats[idx] = ((hidden.float() * m).sum(1) / m.sum(1)).cpu()
    return feats, kept, {"n_texts": len(texts), "truncated": truncated, "skipped": skipped}


def _accuracy(head: AttributeHead, x: torch.Tensor, y: torch.Tensor) -> float | None:
    import torch

    if len(y) == 0:
        return None
    with torch.no_grad():
        return float((head(x).argmax(-1) == y).float().mean())


def fit_head(
    head: AttributeHead,
    x: torch.Tensor,
    y: list[int],
    val_xy: tuple[torch.Tensor, list[int]] | None,
    val_fraction: float,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    weight: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Train `head` in place with Adam + cross-entropy (classes weighed by `weight`), seeded;
    prints one line per epoch.

    Without `val_xy`, a seeded `val_fraction` of the examples is held out for validation.
    """
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    labels = torch.tensor(y, dtype=torch.long)
    if val_xy is None:
        perm = torch.randperm(len(labels), generator=gen)
        n_val = int(round(len(labels) * val_fraction))
        held, kept = perm[:n_val], perm[n_val:]
        xv, yv, xt, yt = x[held], labels[held], x[kept], labels[kept]
    else:
        xv, yv, xt, yt = val_xy[0], torch.tensor(val_xy[1], dtype=torch.long), x, labels
    if len(yt) == 0:
        raise DatasetError("no training examples left after the validation split")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head.linear.reset_parameters()
    head.train()
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    loss_sum = 0.0
    for epoch in range(epochs):
        order, loss_sum = torch.randperm(len(yt), generator=gen), 0.0
        for b in order.split(batch_size):
            loss = F.cross_entropy(head(xt[b]), yt[b], weight=weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss.detach()) * len(b)
        tr, va = _accuracy(head, xt, yt), _accuracy(head, xv, yv)
        print(
            f"epoch {epoch + 1}/{epochs}: loss {loss_sum / len(yt):.4f}, train accuracy {tr:.4f}, "
            f"val accuracy {'n/a' if va is None else f'{va:.4f}'}"
        )
    head.eval()
    return {
        "n_train": len(yt),
        "n_val": len(yv),
        "final_loss": loss_sum / len(yt),
        "train_accuracy": _accuracy(head, xt, yt),
        "val_accuracy": _accuracy(head, xv, yv),
    }


def _from_run(args: argparse.Namespace) -> tuple[Labelled, str, dict[str, Any], list[float] | None]:
    """The examples of `--from-run`, balanced; with the model id, the metadata's `data` and the
    class weights (`--balance weight`, in sorted class order)."""
    from harness.tools.head_from_run import balance, read_run_examples

    found, model = read_run_examples(
        args.from_run,
        args.model,
        args.label_scorer,
        args.task,
        args.text_field,
        args.label_thresholds,
    )
    texts, labels, info = balance(found.texts, found.labels, args.balance, args.seed)
    data = Labelled(f"{args.from_run} (generations)", texts, list(labels))
    data.lines = list(range(1, len(texts) + 1))
    weights = info.get("weights")
    weight = [weights[c] for c in sorted(weights)] if weights else None
    return data, model, {"source": data.source, "from_run": found.meta, "balance": info}, weight


def train_head_main(args: argparse.Namespace) -> int:
    """Read data, embed it with the frozen LM, fit the head, write it; 0 on success."""
    import torch

    from jobs.spec import ModelRef
    from results.run.history import harness_version, package_versions
    from workers.methods.heads import AttributeHead, save_head
    from workers.models import load_lm

    val, weight = None, None
    if args.from_run:
        train, model, data_meta, weight = _from_run(args)
    else:
        if args.model is None:
            raise DatasetError("--model is needed with --data")
        train = read_labelled(args.data, args.text_column, args.label_column, args.split)
        if args.val_data:
            val = read_labelled(args.val_data, args.text_column, args.label_column)
        model = args.model
        data_meta = {
            "source": train.source,
            "sha256": train.sha256,
            "val_source": val.source if val else f"{args.val_fraction:g} of the training data",
            "val_sha256": val.sha256 if val else None,
            "text_column": args.text_column,
            "label_column": args.label_column,
        }
    names = class_names_of(
        train.labels + (val.labels if val else []), args.class_names, train.source
    )
    target = target_index(args.target_class, names)
    lm = load_lm(ModelRef(model, args.revision, args.dtype), device=args.device)
    x, kept, stats = embed_texts(
        lm, train.texts, args.max_tokens, args.overlong, args.embed_batch_size
    )
    train_ids = encode_labels(train, names)
    y = [train_ids[i] for i in kept]
    val_xy = None
    if val is not None:
        vx, vkept, _ = embed_texts(
            lm, val.texts, args.max_tokens, args.overlong, args.embed_batch_size
        )
        val_ids = encode_labels(val, names)
        val_xy = (vx, [val_ids[i] for i in vkept])
    meta = {
        "lm_id": lm.ref.id,
        "lm_revision": lm.ref.revision,
        "lm_dtype": lm.ref.dtype,
        "task": args.task,
        "data": {**data_meta, **stats},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {**package_versions(), "lidao-harness": harness_version()},
    }
    head = AttributeHead(int(x.shape[1]), names, target, meta)
    result = fit_head(
        head,
        x,
        y,
        val_xy,
        args.val_fraction,
        args.epochs,
        args.lr,
        args.batch_size,
        args.seed,
        None if weight is None else torch.tensor(weight),
    )
    head.meta["training"] = {
        "epochs": args.epochs,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "overlong": args.overlong,
        **result,
    }
    weights, meta_file = save_head(head, args.out)
    val_acc = result["val_accuracy"]
    print(
        f"train accuracy {result['train_accuracy']:.4f} on {result['n_train']}, val accuracy "
        f"{'n/a' if val_acc is None else f'{val_acc:.4f}'} on {result['n_val']}; wrote {weights} and {meta_file}"
    )
    return 0

"""Data files: bad prompt and word files are refused naming the file (and the line); odd but
valid ones (CRLF, a BOM, control characters, unicode, CSV / Parquet lists, three groups,
RealToxicityPrompts from a local file) run to every job exactly once."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from campaign.core import PAIRS, Ctx, TrialFailed, base_config, jsonl, trial

GOOD = [json.loads(x) for x in (PAIRS / "pairs-female.jsonl").read_text().splitlines()]
GOOD_M = [json.loads(x) for x in (PAIRS / "pairs-male.jsonl").read_text().splitlines()]


def small(**changes: Any) -> dict[str, Any]:
    """The base config with vanilla only and one sample: a quick run."""
    return base_config(**{"methods": ["vanilla"], "samples_per_prompt": 1, **changes})


def paired(
    ctx: Ctx, female: Path, male: Path | None = None, n_male: int = 12, **changes: Any
) -> Path:
    """A config of `female` and `male` (default: the example's first `n_male` prompts)."""
    male = male or jsonl(ctx.dir / "male.jsonl", GOOD_M[:n_male])
    files = {"female": str(female), "male": str(male)}
    return ctx.config(small(**{"dataset.files": files, **changes}))


def refused(ctx: Ctx, path: Path, *needles: str) -> None:
    ctx.expect(ctx.cli("validate", path, timeout=60), 2, *needles)
    ctx.expect(ctx.cli("run", path, "--out", "run", "--no-ray", timeout=60), 2, *needles)
    if (ctx.dir / "run").exists():
        raise TrialFailed("`run` refused the data but made its run directory")


def runs(ctx: Ctx, path: Path, jobs: int, *warned: str) -> dict[str, str]:
    ctx.expect(ctx.cli("validate", path), 0, "0 problem(s)", *warned)
    ctx.expect(ctx.cli("run", path, "--out", "run", "--no-ray", "--no-progress"), 0)
    return ctx.check_run(ctx.dir / "run", jobs, ["gender", "sentiment-vader"])


def bad_female(name: str, write: Callable[[Path], Path], *needles: str) -> None:
    @trial("data", f"refused: {name}")
    def check(ctx: Ctx) -> None:
        female = write(ctx.dir / "female.jsonl")
        refused(ctx, paired(ctx, female), *[n.replace("@", str(female)) for n in needles])


def _text(text: str | bytes) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    return write


def _records(*recs: Any) -> Callable[[Path], Path]:
    return lambda path: jsonl(path, recs)


def _dir(path: Path) -> Path:
    path.mkdir()
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _dangling(path: Path) -> Path:
    path.symlink_to(path.parent / "gone.jsonl")
    return path


P = {"prompt": {"text": "The nurse said"}}
bad_female("missing file", lambda p: p.parent / "nope.jsonl", "nope.jsonl", "dataset.files.female")
bad_female("a directory", _dir, "@", "a folder, not a file")
bad_female("a named pipe", _fifo, "@", "dataset.files.female")
bad_female("a dangling symlink", _dangling, "female.jsonl", "dataset.files.female")
bad_female("empty file", _text(""), "@': 0")
bad_female("blank lines only", _text("\n  \n\n"), "@': 0")
bad_female("bad JSON on line 2", _text('{"prompt": {"text": "a"}}\n{"prompt": \n'), "@", "line 2")
bad_female("a JSON list line", _records(P, ["The", "nurse"]), "line 2", "prompt.text")
bad_female("no prompt.text", _records(P, {"text": "x"}), "line 2", "prompt.text")
bad_female("numeric prompt.text", _records(P, {"prompt": {"text": 5}}), "line 2", "prompt.text")
bad_female("null prompt.text", _records(P, {"prompt": {"text": None}}), "line 2", "prompt.text")
bad_female("prompt is a string", _records(P, {"prompt": "The nurse"}), "line 2", "prompt.text")
bad_female("unequal lengths", _records(P), "unequal")
bad_female(
    "not UTF-8 on line 2",
    _text(b'{"prompt": {"text": "a"}}\n{"prompt": {"text": "\xff"}}\n'),
    "line 2",
    "UTF-8",
)
bad_female(
    "zero-width prompt",
    _records(P, {"prompt": {"text": "\u200b\ufeff "}}),
    "line 2",
    "empty prompt",
)
bad_female("binary file", _text(bytes(range(256)) * 4), "@")
bad_female(
    "a 3000-word prompt", _records(*[{"prompt": {"text": "word " * 3000}}] * 12), "max_new_tokens"
)


def bad_list(
    name: str, filename: str, write: Callable[[Path], Any], *needles: str, **changes: Any
) -> None:
    @trial("data", f"refused: prompt-list {name}")
    def check(ctx: Ctx) -> None:
        path = ctx.dir / filename
        write(path)
        cfg = small(
            **{"dataset": {"kind": "prompt-list", "path": str(path), "limit": 2}, **changes}
        )
        refused(ctx, ctx.config(cfg), *needles)


def _parquet(path: Path, **cols: list[Any]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(cols), path)


bad_list(
    "CSV without the column",
    "p.csv",
    lambda p: p.write_text("text,x\nhello,1\n"),
    "prompt.text",
    "p.csv",
)
bad_list("a .txt file", "p.txt", lambda p: p.write_text("hello\n"), "p.txt", "unknown file type")
bad_list(
    "a corrupt Parquet", "p.parquet", lambda p: p.write_bytes(b"PAR1" + b"\0" * 50), "p.parquet"
)
bad_list(
    "Parquet without the column",
    "p.parquet",
    lambda p: _parquet(p, text=["a"]),
    "p.parquet",
    "prompt.text",
)
bad_list(
    "Parquet of numbers",
    "p.parquet",
    lambda p: _parquet(p, t=[1, 2]),
    "p.parquet",
    "t",
    **{"dataset.text_field": "t"},
)
bad_list(
    "JSON array file", "p.json", lambda p: p.write_text(json.dumps([P, P])), "p.json", "line 1"
)
bad_list(
    "text_field missing",
    "p.jsonl",
    lambda p: jsonl(p, [P]),
    "p.jsonl",
    "meta.text",
    **{"dataset.text_field": "meta.text"},
)


def rtp_lines(n: int = 8) -> list[dict[str, Any]]:
    return [
        {
            "filename": f"f{i}",
            "challenging": i % 2 == 0,
            "prompt": {"text": f"Prompt number {i} says", "toxicity": i / n},
        }  # fmt: skip
        for i in range(n)
    ]


@trial("data", "refused: RTP toxicity not a number")
def rtp_bad_tox(ctx: Ctx) -> None:
    lines = rtp_lines()
    lines[3]["prompt"]["toxicity"] = "high"
    path = jsonl(ctx.dir / "rtp.jsonl", lines)
    cfg = small(
        dataset={"kind": "realtoxicityprompts", "path": str(path), "toxicity_bins": [[0, 0.5]]}
    )
    refused(ctx, ctx.config(cfg), "rtp.jsonl", "line 4", "toxicity")


@trial("data", "refused: RTP filters that keep nothing")
def rtp_empty(ctx: Ctx) -> None:
    path = jsonl(ctx.dir / "rtp.jsonl", [r for r in rtp_lines() if not r["challenging"]])
    cfg = small(dataset={"kind": "realtoxicityprompts", "path": str(path), "challenging": True})
    refused(ctx, ctx.config(cfg), "rtp.jsonl", "no prompt")


@trial("data", "refused: gender_words not JSON")
def words_bad(ctx: Ctx) -> None:
    (ctx.dir / "w.json").write_text("{not json")
    refused(ctx, ctx.config(small(gender_words=str(ctx.dir / "w.json"))), "w.json")


@trial("data", "refused: gender_words with no pairs")
def words_empty(ctx: Ctx) -> None:
    (ctx.dir / "w.txt").write_text("# nothing\n\n")
    refused(ctx, ctx.config(small(gender_words=str(ctx.dir / "w.txt"))), "w.txt", "no word pairs")


@trial("data", "refused: gender_words with an odd line")
def words_odd(ctx: Ctx) -> None:
    (ctx.dir / "w.txt").write_text("she he\nqueen\n")
    refused(ctx, ctx.config(small(gender_words=str(ctx.dir / "w.txt"))), "w.txt", "line 2")


# ---- valid, if odd ---------------------------------------------------------------------------
@trial("data", "valid: CRLF line endings and a BOM")
def crlf_bom(ctx: Ctx) -> None:
    text = "\r\n".join(json.dumps(r) for r in GOOD[:2]) + "\r\n"
    (ctx.dir / "female.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    runs(ctx, paired(ctx, ctx.dir / "female.jsonl", n_male=2), 4)


@trial("data", "valid: control characters warned, escaped by samples")
def controls(ctx: Ctx) -> None:
    recs = [
        {"prompt": {"text": "The \x1b[31mred\x1b[0m nurse\x07 said"}},
        {"prompt": {"text": "She \u202eevil said"}},
    ]
    path = paired(ctx, jsonl(ctx.dir / "female.jsonl", recs), n_male=2)
    runs(ctx, path, 4, "control characters", "line 1")
    res = ctx.cli("samples", "run", "--limit", "0")
    ctx.expect(res, 0, "\\u001b")
    if "\x1b" in res.out or "\u202e" in res.out or "\x07" in res.out:
        raise TrialFailed("samples printed a control character raw")


@trial("data", "valid: a CSV prompt with a NUL byte is warned about")
def csv_nul(ctx: Ctx) -> None:
    (ctx.dir / "p.csv").write_bytes(b"prompt.text\nThe nurse\0 said\n")
    cfg = ctx.config(small(dataset={"kind": "prompt-list", "path": str(ctx.dir / "p.csv")}))
    runs(ctx, cfg, 1, "control characters", "line 2")


@trial("data", "valid: unicode prompts (emoji, CJK, RTL, combining)")
def unicode_prompts(ctx: Ctx) -> None:
    recs = [
        {"prompt": {"text": "La infirmière 👩‍⚕️ a dit"}},
        {"prompt": {"text": "她说 هي قالت e\u0301"}},
    ]
    runs(ctx, paired(ctx, jsonl(ctx.dir / "female.jsonl", recs), n_male=2), 4)


@trial("data", "valid: blank lines between prompts")
def blank_between(ctx: Ctx) -> None:
    (ctx.dir / "female.jsonl").write_text(
        "\n" + json.dumps(GOOD[0]) + "\n\n   \n" + json.dumps(GOOD[1]) + "\n\n"
    )
    runs(ctx, paired(ctx, ctx.dir / "female.jsonl", n_male=2), 4)


@trial("data", "valid: three groups")
def three_groups(ctx: Ctx) -> None:
    files = {
        g: str(jsonl(ctx.dir / f"{g}.jsonl", GOOD if g == "female" else GOOD_M))
        for g in ("female", "male")
    }
    neutral = [{"prompt": {"text": r["prompt"]["text"].replace("woman", "person")}} for r in GOOD]
    files["neutral"] = str(jsonl(ctx.dir / "neutral.jsonl", neutral))
    runs(ctx, ctx.config(small(**{"dataset.files": files})), 6)


@trial("data", "valid: symlinked prompt files")
def symlinked(ctx: Ctx) -> None:
    (ctx.dir / "female.jsonl").symlink_to(PAIRS / "pairs-female.jsonl")
    (ctx.dir / "m").symlink_to(PAIRS, target_is_directory=True)
    runs(ctx, paired(ctx, ctx.dir / "female.jsonl", ctx.dir / "m" / "pairs-male.jsonl"), 4)


@trial("data", "valid: prompt-list CSV (quoted commas, newlines)")
def list_csv(ctx: Ctx) -> None:
    (ctx.dir / "p.csv").write_text(
        'prompt.text,id\n"He said, ""fine""",1\n"She wrote\nthat",2\nThe doctor,3\n'
    )
    runs(ctx, ctx.config(small(dataset={"kind": "prompt-list", "path": str(ctx.dir / "p.csv")})), 3)


@trial("data", "valid: prompt-list Parquet with a text_field")
def list_parquet(ctx: Ctx) -> None:
    _parquet(ctx.dir / "p.parquet", text=["The man said", "The woman said"], n=[1, 2])
    cfg = small(
        dataset={"kind": "prompt-list", "path": str(ctx.dir / "p.parquet"), "text_field": "text"}
    )
    runs(ctx, ctx.config(cfg), 2)


@trial("data", "valid: RealToxicityPrompts from a local file, filtered and sampled")
def rtp_local(ctx: Ctx) -> None:
    path = jsonl(ctx.dir / "rtp.jsonl", rtp_lines(12))
    cfg = small(
        dataset={
            "kind": "realtoxicityprompts",
            "path": str(path),
            "challenging": True,
            "toxicity_bins": [[0.0, 0.5], [0.75, 1.0]],
            "limit": 3,
            "sample_seed": 4,
        },  # fmt: skip
        tasks=["toxicity"],
    )
    runs(ctx, ctx.config(cfg), 3)

"""GGUF model entries without a real model: the header read (magic, architecture, sizes), the
`package:` form, the SHA-256 as the model's identity (remembered by path, size and mtime), the
dequantised folder made once (a fake dequantiser), and `validate`'s refusals naming the field.
The real file's path through transformers: tests/test_real_models.py."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.config import ConfigError, load_config
from tests.tiny_config import tiny_config
from workers import gguf, hub

REPO = Path(__file__).resolve().parents[1]


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(path: Path, arch: str = "llama", blocks: int = 2, width: int = 8) -> Path:
    """A GGUF file with metadata only (no tensors): enough for the header checks."""
    kvs = [
        _s("general.architecture") + struct.pack("<I", 8) + _s(arch),
        _s(f"{arch}.block_count") + struct.pack("<II", 4, blocks),
        _s(f"{arch}.embedding_length") + struct.pack("<IQ", 10, width),
        _s(f"{arch}.attention.sliding_window") + struct.pack("<II", 4, 16),
        _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _s("a") + _s("b"),
        _s("general.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.5, 1.0),
    ]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return path


def test_the_header_gives_architecture_and_sizes_without_reading_tensors(tmp_path: Path) -> None:
    info = gguf.check(str(write_gguf(tmp_path / "m.gguf", "gemma3", blocks=3, width=12)))
    assert info.architecture == "gemma3" and info.model_type == "gemma3"
    assert info.config() == {
        "model_type": "gemma3_text",
        "num_hidden_layers": 3,
        "hidden_size": 12,
        "sliding_window": 16,
    }


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"hello, not a model\n", r"not a GGUF file \(it does not start with the bytes 'GGUF'\)"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 5), "a damaged GGUF header"),
        (None, "no such file"),
    ],
)
def test_a_file_that_is_not_gguf_is_refused(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "m.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(gguf.GgufError, match=problem):
        gguf.check(str(path))


def test_an_architecture_transformers_cannot_read_is_refused_naming_the_known(
    tmp_path: Path,
) -> None:
    with pytest.raises(gguf.GgufError, match=r"architecture 'rwkv7' is not one .*llama"):
        gguf.check(str(write_gguf(tmp_path / "m.gguf", "rwkv7")))


def test_the_known_architectures_are_those_of_transformers_gguf_loader() -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    theirs = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer", "t5", "umt5"}
    assert set(gguf.ARCHITECTURES.values()) == theirs


def test_the_package_form_finds_a_file_of_an_installed_distribution() -> None:
    import yaml

    assert gguf.resolve("package:PyYAML/yaml/__init__.py") == Path(yaml.__file__)
    with pytest.raises(gguf.GgufError, match="package 'no-such-dist' is not installed here"):
        gguf.resolve("package:no-such-dist/x.gguf")
    with pytest.raises(gguf.GgufError, match="no file 'x.gguf' in package PyYAML"):
        gguf.resolve("package:PyYAML/x.gguf")
    with pytest.raises(gguf.GgufError, match="expected package:DISTRIBUTION/FILE"):
        gguf.resolve("package:PyYAML")
    with pytest.raises(gguf.GgufError, match="not a URL; download it to a path every node"):
        gguf.resolve("s3://bucket/m.gguf")


def test_the_sha256_is_computed_once_per_path_size_and_mtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.files

    cache = str(tmp_path / "cache")
    path = write_gguf(tmp_path / "m.gguf")
    calls = []
    real = jobs.files.sha256_file
    monkeypatch.setattr(jobs.files, "sha256_file", lambda p: calls.append(p) or real(p))
    first = gguf.sha256(path, cache)
    assert gguf.sha256(path, cache) == first and len(calls) == 1
    write_gguf(path, blocks=5)  # another file at the same path: hashed again
    assert gguf.sha256(path, cache) != first and len(calls) == 2


def _entry(tmp_path: Path, **model: Any) -> Any:
    return load_config(tiny_config(tmp_path, models=[model])).models[0]


def test_the_same_file_at_two_paths_gives_the_same_job_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIDAO_CACHE", str(tmp_path / "cache"))
    a = write_gguf(tmp_path / "a.gguf")
    (tmp_path / "dir").mkdir()
    b = write_gguf(tmp_path / "dir" / "b.gguf")
    digest = gguf.sha256(a)
    forms = [
        _entry(tmp_path, gguf_file=str(a)),
        _entry(tmp_path, gguf_file="a.gguf"),  # relative: to the config's folder
        _entry(tmp_path, id=str(b)),  # an id that is a .gguf file
        _entry(tmp_path, id=str(tmp_path / "dir"), gguf_file="b.gguf"),  # transformers' form
    ]
    assert {m.ref().gguf for m in forms} == {str(a), str(b)}
    assert all(m.ref().identity() == {"gguf_sha256": digest, "dtype": "float32"} for m in forms)
    assert forms[0].id == forms[0].gguf_file == str(a)  # the label defaults to the file


def test_a_pinned_sha256_stands_for_a_file_this_machine_lacks_and_must_match_one_it_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIDAO_CACHE", str(tmp_path / "cache"))
    pin = "ab" * 32
    gone = _entry(tmp_path, gguf_file="/nowhere/m.gguf", gguf_sha256=pin)
    assert gone.ref().identity()["gguf_sha256"] == pin
    write_gguf(tmp_path / "m.gguf")
    with pytest.raises(
        ConfigError, match=r"models\.0\.gguf_file: .*its SHA-256 is [0-9a-f]{64}, not"
    ):
        _entry(tmp_path, gguf_file="m.gguf", gguf_sha256=pin)


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        ({"gguf_file": "absent.gguf"}, r"models\.0\.gguf_file: .*absent\.gguf: no such file"),
        ({"gguf_file": "m.gguf", "revision": "main"}, r"models\.0\.revision: a GGUF file has no"),
        ({"id": "org/repo", "gguf_file": "m.gguf"}, r"models\.0\.gguf_file: id 'org/repo' is not"),
    ],
)
def test_bad_gguf_entries_are_refused_naming_the_field(
    tmp_path: Path, model: dict[str, Any], problem: str
) -> None:
    write_gguf(tmp_path / "m.gguf")
    with pytest.raises(ConfigError, match=problem):
        _entry(tmp_path, **model)


def test_validate_refuses_a_non_gguf_file_and_a_missing_one_naming_the_field(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.gguf").write_text("not a model")
    cfg = tiny_config(
        tmp_path, models=[{"gguf_file": "notes.gguf"}, {"gguf_file": "gone.gguf", "name": "b"}]
    )
    res = subprocess.run(
        [sys.executable, "-m", "harness", "validate", str(cfg)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert f"models.0.gguf_file: {tmp_path}/notes.gguf: not a GGUF file" in res.stderr
    assert f"models.1.gguf_file: {tmp_path}/gone.gguf: no such file" in res.stderr


def test_the_dequantised_folder_is_made_once_even_by_concurrent_loaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []

    def fake(path: Path, out: Path) -> None:
        made.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "_dequantise", fake)
    path = write_gguf(tmp_path / "m.gguf")
    cache = str(tmp_path / "cache")
    digest = gguf.sha256(path, cache)
    folders: list[Path] = []
    threads = [
        threading.Thread(target=lambda: folders.append(gguf.dequantised(path, digest, cache)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(set(folders)) == 1
    folder = folders[0]
    assert folder == Path(cache) / "gguf" / digest and (folder / gguf.DONE).is_file()
    assert sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(".")) == []
    assert gguf.dequantised(path, digest, cache) == folder and len(made) == 1


def test_validate_on_a_cluster_says_how_the_nodes_see_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gguf_item(field: str, spec: str, pinned: str | None, local: bool) -> Any:
        return hub.gguf_availability(spec, pinned, local)

    monkeypatch.setenv("LIDAO_CACHE", str(tmp_path / "cache"))
    path = str(write_gguf(tmp_path / "m.gguf"))
    pin = "ab" * 32
    here = gguf_item("models.0.gguf_file", path, None, local=False)
    assert here.problem is None and "every node must see it" in here.where
    assert gguf_item("f", path, None, local=True).where == "GGUF file"
    gone = gguf_item("f", str(tmp_path / "gone.gguf"), pin, local=False)
    assert gone.problem is None and "not seen here; the nodes read it" in gone.where
    assert "no such file" in str(gguf_item("f", str(tmp_path / "gone.gguf"), pin, True).problem)
    package = gguf_item("f", "package:absent-dist/m.gguf", pin, local=False)
    assert package.problem is None and "package absent-dist" in package.where
    url = gguf_item("f", "s3://bucket/m.gguf", pin, local=False)
    assert url.problem is not None and "not a URL" in url.problem


def test_a_head_is_checked_against_the_gguf_file_s_width_and_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    monkeypatch.setenv("LIDAO_CACHE", str(tmp_path / "cache"))
    write_gguf(tmp_path / "m.gguf", width=8)
    (tmp_path / "h.pt").write_bytes(b"")
    head = {"hidden_size": 16, "lm_id": "package:some-dist/m.gguf", "task": "sentiment"}
    (tmp_path / "h.json").write_text(json.dumps(head))
    model = {"gguf_file": "m.gguf", "heads": {"sentiment": str(tmp_path / "h.pt")}}
    with pytest.raises(ConfigError, match=r"models\.0\.heads\.sentiment: .* 16 wide, but model"):
        load_config(tiny_config(tmp_path, models=[model], methods=["lidao-min"]))
    (tmp_path / "h.json").write_text(json.dumps({**head, "hidden_size": 8}))
    load_config(tiny_config(tmp_path, models=[model], methods=["lidao-min"]))  # the same name
    (tmp_path / "h.json").write_text(json.dumps({**head, "hidden_size": 8, "lm_id": "gpt2"}))
    with pytest.raises(ConfigError, match="was trained on 'gpt2'"):
        load_config(tiny_config(tmp_path, models=[model], methods=["lidao-min"]))


def test_validate_reads_a_gguf_entry_without_torch(tmp_path: Path) -> None:
    write_gguf(tmp_path / "m.gguf")
    cfg = tiny_config(tmp_path, models=[{"gguf_file": "m.gguf", "name": "m"}], scorers=[])
    code = (
        "import sys; from harness.cli.commands import main; "
        f"rc = main(['validate', {str(cfg)!r}]); "
        "print('rc', rc, sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    env = {**os.environ, "LIDAO_CACHE": str(tmp_path / "cache")}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert "rc 0 []" in res.stdout, res.stdout + res.stderr
    assert f"model m [{tmp_path}/m.gguf]: GGUF file" in res.stdout


def test_a_folder_of_gguf_files_given_as_id_is_pointed_at_gguf_file(tmp_path: Path) -> None:
    from workers.hub import local_availability

    write_gguf(tmp_path / "m.gguf")
    found = local_availability(str(tmp_path), "model")
    assert found.problem == (
        f"{tmp_path}: no config.json in the folder; it holds m.gguf: name one with gguf_file "
        "(docs/cli.md)"
    )


def test_one_file_named_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIDAO_CACHE", str(tmp_path / "cache"))
    write_gguf(tmp_path / "m.gguf")
    twice = [{"gguf_file": "m.gguf"}, {"id": str(tmp_path), "gguf_file": "m.gguf", "name": "b"}]
    with pytest.raises(ConfigError, match="entries 0 and 1 are the same model"):
        load_config(tiny_config(tmp_path, models=twice))

"""Prompt loaders: the UDDIA paired format, plain prompt lists, and their errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.datasets import load_paired_jsonl, load_prompt_list
from jobs.files import PINNED_SHA256, UDDIA_FEMALE, UDDIA_MALE, DatasetError, fetch
from jobs.words import load_group_words


def write_jsonl(path: Path, texts: list[object]) -> str:
    lines = [
        t if isinstance(t, str) and t.startswith("RAW:") else json.dumps({"prompt": {"text": t}})
        for t in texts
    ]
    path.write_text("\n".join(line.removeprefix("RAW:") for line in lines) + "\n")
    return str(path)


def test_paired_files_give_pairs_with_group_from_file_key(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "f.jsonl", ["She ran", "Her mom"])
    m = write_jsonl(tmp_path / "m.jsonl", ["He ran", "His dad"])
    prompts = load_paired_jsonl({"female": f, "male": m})
    assert [(p.pair_id, p.group, p.text) for p in prompts] == [
        ("00000", "female", "She ran"),
        ("00000", "male", "He ran"),
        ("00001", "female", "Her mom"),
        ("00001", "male", "His dad"),
    ]
    assert len(load_paired_jsonl({"female": f, "male": m}, limit=1)) == 2


@pytest.mark.parametrize(
    ("female", "message"),
    [
        (["ok", "RAW:{not json"], "f.jsonl: line 2: bad JSON"),
        (["ok", 'RAW:{"prompt": {}}'], "f.jsonl: line 2: missing prompt.text"),
        (["ok", "   "], "f.jsonl: line 2: empty prompt"),
        (["ok"], "unequal numbers of prompts"),
    ],
)
def test_malformed_paired_input_names_file_and_line(
    tmp_path: Path, female: list[object], message: str
) -> None:
    f = write_jsonl(tmp_path / "f.jsonl", female)
    m = write_jsonl(tmp_path / "m.jsonl", ["a", "b"])
    with pytest.raises(DatasetError, match=message):
        load_paired_jsonl({"female": f, "male": m})


def test_missing_file_and_bad_checksum(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        fetch(str(tmp_path / "absent.jsonl"))
    f = write_jsonl(tmp_path / "f.jsonl", ["x"])
    with pytest.raises(DatasetError, match="does not match the pinned"):
        fetch(f, sha256="0" * 64)


def test_prompt_list_groups_come_from_gender_labels(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "rtp.jsonl", ["She said her name", "He and his dog", "The weather"]
    )
    prompts = load_prompt_list(path)
    assert [p.group for p in prompts] == ["female", "male", "none"]
    csv = tmp_path / "p.csv"
    csv.write_text("text,other\nThe mother said,1\n,2\n")
    with pytest.raises(DatasetError, match=r"p.csv: line 3: empty prompt"):
        load_prompt_list(str(csv), text_field="text")
    csv.write_text("text\nThe mother said\n")
    assert load_prompt_list(str(csv), text_field="text")[0].group == "female"


def test_the_papers_175_pairs_load_with_their_pinned_checksums(shared: Path) -> None:
    uddia = shared / "data" / "uddia-prompts"
    files = {
        "female": str(uddia / "175prompts-female.jsonl"),
        "male": str(uddia / "175prompts-male.jsonl"),
    }
    prompts = load_paired_jsonl(
        files, sha256={"female": PINNED_SHA256[UDDIA_FEMALE], "male": PINNED_SHA256[UDDIA_MALE]}
    )
    assert len(prompts) == 350 and len({p.pair_id for p in prompts}) == 175
    words = load_group_words(str(uddia / "gender_pairs.txt"))
    assert words.groups == ("female", "male") and ("woman", "man") in words.pairs


def test_urls_are_downloaded_once_into_the_cache_and_checked(tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    write_jsonl(served / "f.jsonl", ["She ran"])
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            hits.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(served))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/f.jsonl"
        cache = str(tmp_path / "cache")
        first = fetch(url, cache_dir=cache)
        assert fetch(url, cache_dir=cache) == first and len(hits) == 1  # second time from cache
        assert Path(first).read_text() == (served / "f.jsonl").read_text()
        with pytest.raises(DatasetError, match="does not match the pinned"):
            fetch(url, sha256="0" * 64, cache_dir=cache)
        assert not Path(first).exists() and fetch(url, cache_dir=cache) == first  # fetched again
        with pytest.raises(DatasetError, match="download failed"):
            fetch(url.replace("f.jsonl", "missing.jsonl"), cache_dir=cache)
    finally:
        server.shutdown()


@pytest.mark.parametrize("blank", ["\u200b", " \u200b\u2060 ", "\ufeff", "\t"])
def test_an_invisible_prompt_is_refused_naming_file_and_line(tmp_path: Path, blank: str) -> None:
    f = write_jsonl(tmp_path / "f.jsonl", ["She said", blank])
    m = write_jsonl(tmp_path / "m.jsonl", ["He said", "He went"])
    with pytest.raises(DatasetError, match=r"f.jsonl: line 2: empty prompt"):
        load_paired_jsonl({"female": f, "male": m})
    csv = tmp_path / "p.csv"
    csv.write_text(f"text\nhello\n{blank}\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"p.csv: line 3: empty prompt"):
        load_prompt_list(str(csv), "text")


def test_non_utf8_prompt_files_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "f.jsonl"
    f.write_bytes(b'{"prompt": {"text": "ok"}}\n{"prompt": {"text": "caf\xe9"}}\n')
    with pytest.raises(DatasetError, match=r"f.jsonl: line 2: not UTF-8 text \(byte 0xe9\)"):
        load_prompt_list(str(f))
    c = tmp_path / "p.csv"
    c.write_bytes(b"text\nfine\nalso fine\n\xff\xfe bad\n")
    with pytest.raises(DatasetError, match=r"p.csv: line 4: not UTF-8 text \(byte 0xff\)"):
        load_prompt_list(str(c), "text")


def test_a_url_token_stays_out_of_cache_names_prompt_ids_and_errors(tmp_path: Path) -> None:
    import functools
    import http.server
    import threading

    (tmp_path / "www").mkdir()
    write_jsonl(tmp_path / "www" / "rtp.jsonl", ["The nurse said", "The doctor said"])

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # the server's own request log
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path / "www"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/rtp.jsonl?token=sekrit-999&x=1"
        prompts = load_prompt_list(url, cache_dir=str(tmp_path / "cache"))
        assert [p.prompt_id for p in prompts] == ["rtp:00001", "rtp:00002"]
        names = [p.name for p in (tmp_path / "cache").rglob("*")]
        assert names and not any("sekrit" in n for n in names), names
        with pytest.raises(DatasetError) as err:
            fetch(url, sha256="0" * 64, cache_dir=str(tmp_path / "cache"))
        assert "sekrit" not in str(err.value) and "token=<redacted>" in str(err.value)
    finally:
        server.shutdown()


def test_a_failed_download_names_its_config_field_and_the_local_alternatives(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/gender_pairs.txt"
    cache = tmp_path / "cache"
    with pytest.raises(DatasetError) as exc:
        load_group_words(url, cache_dir=str(cache))
    msg = str(exc.value)
    assert msg.startswith(f"gender_words: {url}: download failed (")
    assert "set gender_words to the local path, or put the file at " in msg
    assert str(cache / "downloads") in msg and msg.endswith("-gender_pairs.txt")
    assert not list((cache / "downloads").iterdir())  # no partial file left behind
    f = write_jsonl(tmp_path / "f.jsonl", ["x"])
    with pytest.raises(DatasetError, match=r"^dataset\.files\.male: .*absent\.jsonl: no such file"):
        load_paired_jsonl({"female": f, "male": str(tmp_path / "absent.jsonl")})
    with pytest.raises(DatasetError, match=r"^dataset\.path: .*absent\.csv: no such file"):
        load_prompt_list(str(tmp_path / "absent.csv"))


def test_a_parquet_prompt_column_of_numbers_is_refused(tmp_path: Path) -> None:
    """A number is not a prompt (as in JSONL): it was turned into the text "1" silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": ["The man said", "She said"], "n": [1, 2]}), path)
    assert [p.text for p in load_prompt_list(str(path), text_field="text")][0] == "The man said"
    with pytest.raises(DatasetError, match=r"p.parquet: line 1: n is not text \(1\)"):
        load_prompt_list(str(path), text_field="n")


def test_a_byte_order_mark_is_no_part_of_the_first_prompt(tmp_path: Path) -> None:
    """Files saved by some editors start with a UTF-8 BOM: line 1 of a JSONL was "bad JSON",
    a CSV's first column unknown (campaign, issue 29). A bad byte still names its line."""
    bom = b"\xef\xbb\xbf"
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_bytes(bom + b'{"prompt": {"text": "She said"}}\r\n{"prompt": {"text": "He"}}\r\n')
    assert [p.text for p in load_prompt_list(str(jsonl))] == ["She said", "He"]
    csv = tmp_path / "p.csv"
    csv.write_bytes(bom + b"prompt.text,n\nThe mother said,1\n")
    assert [p.text for p in load_prompt_list(str(csv))] == ["The mother said"]
    csv.write_bytes(bom + b"prompt.text\nok\nbad \xff\n")
    with pytest.raises(DatasetError, match=r"p.csv: line 3: not UTF-8 text \(byte 0xff\)"):
        load_prompt_list(str(csv))
    words = tmp_path / "w.txt"
    words.write_bytes(bom + b"she he\nqueen king\n")
    assert load_group_words(str(words)).words["female"] == ("she", "queen")

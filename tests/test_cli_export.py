"""`export --hub` (issue 24): the run's Parquet tables and report uploaded in one commit to a
fake Hugging Face Hub on 127.0.0.1 (`everyday_run`, tests/conftest.py)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness.cli.commands import main
from tests.cli_run import copy_run

# ---- export to a (fake) Hub ----------------------------------------------------------------


class FakeHub(BaseHTTPRequestHandler):
    """The four calls `create_repo` + `create_commit` make, answered like the Hub: every file
    is a regular (inline, base64) upload."""

    repos: dict[str, dict[str, bytes]] = {}
    auth: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, obj: Any, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.auth.append(self.headers.get("Authorization", ""))
        host = f"http://{self.headers['Host']}"
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:3] == ["api", "repos", "create"]:
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}"
            self.repos.setdefault(repo, {})
            return self._json({"url": f"{host}/datasets/{repo}", "name": repo})
        if parts[:2] == ["api", "validate-yaml"]:
            return self._json({"errors": [], "warnings": []})
        if parts[:2] == ["api", "datasets"] and parts[4] == "preupload":
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
            ]
            return self._json({"files": modes, "commitOid": "0" * 40})
        if parts[:2] == ["api", "datasets"] and parts[4] == "commit":
            repo = f"{parts[2]}/{parts[3]}"
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    value = item["value"]
                    self.repos[repo][value["path"]] = base64.b64decode(value["content"])
            return self._json(
                {
                    "commitUrl": f"{host}/datasets/{repo}/commit/{'1' * 40}",
                    "commitOid": "1" * 40,
                    "pullRequestUrl": None,
                }
            )
        return self._json({"error": f"not faked: {self.path}"}, 404)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from huggingface_hub import constants

    FakeHub.repos, FakeHub.auth = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", url)  # what HF_ENDPOINT sets at import
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_tests")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def test_export_uploads_the_parquet_tables_and_report_in_one_commit(
    everyday_run: tuple[Path, str, str],
    tmp_path: Path,
    hub: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = copy_run(everyday_run, tmp_path)
    (out / "cache").mkdir(exist_ok=True)
    (out / "cache" / "perspective-scores.sqlite").write_bytes(b"not exported")
    assert main(["export", str(out), "--hub", "someone/everyday-run"]) == 0
    shown = capsys.readouterr().out
    assert f"to {hub}/datasets/someone/everyday-run" in shown
    uploaded = FakeHub.repos["someone/everyday-run"]
    for rel in ("summary.parquet", "results.json", "config.yaml", "report/index.html"):
        assert uploaded[rel] == (out / rel).read_bytes(), rel
    for folder in ("generations", "scores/gender", "scores/sentiment-vader"):
        shards = sorted(str(p.relative_to(out)) for p in (out / folder).glob("*.parquet"))
        assert shards and all(uploaded[s] == (out / s).read_bytes() for s in shards), folder
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert set(uploaded) - on_disk == {"README.md"}
    left = on_disk - set(uploaded)
    assert "cache/perspective-scores.sqlite" in left and "history.jsonl" in left
    assert not any(k.startswith("cache/") or "history" in k for k in uploaded)
    assert b"# everyday" in uploaded["README.md"]
    assert not any(k.startswith("cache/") or "history" in k or "lock" in k for k in uploaded)
    assert FakeHub.auth and all(a == "Bearer hf_fake_token_for_tests" for a in FakeHub.auth)
    assert main(["export", str(tmp_path / "nothing"), "--hub", "someone/x"]) == 2

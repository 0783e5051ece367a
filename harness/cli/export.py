"""`export RUN --hub REPO`: a run's tables and report to a Hugging Face Hub dataset repository
(extra `hub`), in one commit, with a README card written here. Not exported: the lock,
history.jsonl, cache/, quarantined shards, temporary files. The token and endpoint come from
huggingface_hub's own settings (`HF_TOKEN`, `HF_ENDPOINT`)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import pyarrow.fs as pafs

from jobs.redact import redact_text
from results.run.store import RunStore, StoreError

log = logging.getLogger("harness")

TOP_FILES = (
    "config.yaml",
    "manifest.json",
    "results.json",
    "plan.parquet",
    "summary.parquet",
    "summary.csv",
)
FOLDERS = {"generations": (".parquet",), "scores": (".parquet",), "report": None}


class ExportError(RuntimeError):
    """An export that cannot start (no run, nothing to upload, huggingface_hub missing)."""


def export_main(args: argparse.Namespace) -> int:
    """The `export` subcommand: exit 0, 2 (not a run directory), 1 (huggingface_hub missing or
    the hub refused: one line, no traceback)."""
    store = RunStore(args.run)
    if not store.exists("config.yaml"):
        raise StoreError(f"{args.run}: not a run directory (no config.yaml)")
    if store.exists("summary.parquet") and not store.exists("results.json"):
        from results.report.results_json import write_results_json

        write_results_json(store)  # a run aggregated by an older version
    try:
        done = export_to_hub(store, args.hub, private=args.private, revision=args.revision)
    except Exception as exc:  # huggingface_hub's HTTP errors: one line, no traceback
        hub = type(exc).__module__.startswith(("huggingface_hub", "httpx", "requests"))
        if isinstance(exc, (RuntimeError, OSError)) and not hub:
            raise
        from harness.stages.generation.backends import first_line

        raise RuntimeError(f"export to {args.hub}: {redact_text(first_line(exc))}") from None
    print(f"exported {len(done['files'])} files of {args.run} to {done['repo']}")
    print(f"commit: {done['commit']}")
    return 0


def export_files(store: RunStore) -> dict[str, str]:
    """Path in the repository → path in the run directory's filesystem, sorted."""
    out: dict[str, str] = {}
    for rel in TOP_FILES:
        if store.exists(rel):
            out[rel] = store.path(rel)
    base = store.path("")
    for folder, suffixes in FOLDERS.items():
        for info in store.entries(folder, recursive=True):
            if info.type != pafs.FileType.File:
                continue
            name = info.base_name
            if name.startswith(".") or ".tmp" in name or "quarantine" in info.path:
                continue
            if suffixes is not None and not name.endswith(suffixes):
                continue
            rel = info.path[len(base) :].lstrip("/")
            out[rel] = info.path
    return dict(sorted(out.items()))


def card(store: RunStore, files: dict[str, str]) -> str:
    """The repository's README.md: what the run is and where its tables are."""
    name = "run"
    if store.exists("results.json"):
        name = store.read_json("results.json").get("name") or name
    lines = [
        "---",
        "tags:",
        "- lidao-harness",
        "- debiasing",
        "---",
        f"# {name}",
        "",
        "An evaluation run of lidao-harness (decoding-time debiasing of language models).",
        "",
        "- `summary.parquet` / `summary.csv`: every statistic with its interval and p-value",
        "- `results.json`: config, versions and the summary in one file",
        "- `report/index.html`: the HTML report; `report/tables.md`: the tables",
        "- `generations/`, `scores/<scorer>/`: one row per job / per scored job",
        "",
        f"{len(files)} files.",
        "",
    ]
    return "\n".join(lines)


def export_to_hub(
    store: RunStore,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
) -> dict[str, Any]:
    """Create (if needed) the dataset repository `repo_id` and commit the run's files to it.

    Returns: repo (its URL), commit (the commit's URL), files (paths in the repository).

    Raises:
        ExportError: huggingface_hub is not installed, or the run has nothing to export.
    """
    try:
        from huggingface_hub import CommitOperationAdd, HfApi
    except ImportError:
        raise ExportError(
            "export --hub needs huggingface_hub: pip install 'lidao-harness[hub]'"
        ) from None
    files = export_files(store)
    if not files:
        raise ExportError(f"{store.uri}: nothing to export (no config, tables or report)")
    api = HfApi()
    repo = api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    ops = [CommitOperationAdd("README.md", card(store, files).encode())]
    local = isinstance(store.fs, pafs.LocalFileSystem)
    for rel, path in files.items():
        if local:  # read by huggingface_hub as it uploads
            ops.append(CommitOperationAdd(rel, path))
            continue
        with store.fs.open_input_stream(path) as fh:  # s3:// / gs://: one file in memory
            ops.append(CommitOperationAdd(rel, fh.read()))
    commit = api.create_commit(
        repo_id,
        ops,
        commit_message=f"lidao-harness run {store.uri}",
        repo_type="dataset",
        revision=revision,
    )
    log.info("exported %d files of %s to %s", len(files), store.uri, repo_id)
    return {
        "repo": str(repo),
        "commit": str(getattr(commit, "commit_url", commit)),
        "files": list(files),
    }

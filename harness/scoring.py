"""The scoring stage, shared by `run` and `score`: score only what is missing.

For each scorer, the rows to score are the ok generation rows with no score row at the
scorer's *current* version (so a new model revision or API version rescores everything, and
a re-run with nothing new does no work). Rows go to the scorer in chunks; each chunk is
written as an atomic shard as soon as it is scored, so an interrupted stage resumes where it
stopped. Scoring never generates: a run without generations is an error.

With Ray each scorer lives in its own actor (`workers.actors.ScorerActor`), all scorers run
at once, and the driver writes the shards (shard names hash job ids and scorer version, so
a retried chunk rewrites the same file and a new version never overwrites an old one). GPU scorers share the cluster's GPUs (`num_gpus = min(1, GPUs /
GPU scorers)`) and get none on a CPU cluster. Without Ray the same plain classes run here,
one scorer after the other. The driver imports no torch: scorer modules import it lazily.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from results.store import RunStore, StoreError
from workers.scorers.base import ScorerContext
from workers.scorers.registry import SCORER_METRICS, check_scorer_name, load_scorer

PIPELINE = 2  # chunks queued per scorer actor: the next one waits while one runs


class ScoringError(RuntimeError):
    """Scorers that could not start or failed mid-way.

    `stats` holds what the scorers that did finish report (for the manifest).
    """

    def __init__(self, message: str, stats: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


def generation_rows(store: RunStore) -> list[dict[str, Any]]:
    """The ok generation rows of the run.

    Raises:
        StoreError: the run has no generation rows (scoring never generates), or a shard was
            written by a newer schema than this code reads.
    """
    gens = store.read_generations()
    if gens.is_empty():
        raise StoreError(f"no generations in {store.uri}; run `python -m harness run` first")
    if store.exists("plan.parquet"):  # rows of a replaced plan are never scored
        gens = gens.filter(gens["job_id"].is_in(store.read_plan()["job_id"]))
    return gens.filter(gens["status"] == "ok").to_dicts()


def missing_rows(
    store: RunStore, name: str, version: str, rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`rows` that have no score of scorer `name` at `version` yet."""
    done = store.read_scores(name, SCORER_METRICS[name])
    have = set(done.filter(done["scorer_version"] == version)["job_id"].to_list())
    return [r for r in rows if r["job_id"] not in have]


@dataclass
class _Work:
    """One scorer's share of the stage: what to score, what came back."""

    name: str
    version: str
    todo: list[dict[str, Any]]
    batch_size: int
    progress: Any = None
    next_chunk: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.perf_counter)

    def chunks_left(self) -> bool:
        return self.next_chunk < len(self.todo)

    def take(self) -> list[dict[str, Any]]:
        chunk = self.todo[self.next_chunk : self.next_chunk + self.batch_size]
        self.next_chunk += len(chunk)
        return chunk

    def write(
        self, store: RunStore, chunk: list[dict[str, Any]], out: list[dict[str, Any]]
    ) -> None:
        """Check that every input row came back exactly once, then write the shard."""
        want = sorted(r["job_id"] for r in chunk)
        got = sorted(r["job_id"] for r in out)
        if want != got:
            lost = sorted(set(want) - set(got))[:3]
            raise ScoringError(
                f"scorer {self.name!r} returned {len(out)} rows for {len(chunk)} "
                f"(one per row expected; e.g. missing {lost})"
            )
        kept = [r for r in out if r["status"] != "missing"]  # e.g. cache-only: not scored
        if kept:
            store.write_scores(self.name, SCORER_METRICS[self.name], kept)
        self.statuses.update(r["status"] for r in out)
        if self.progress is not None:  # empty rows are not failures
            self.progress.update(len(out), ok=sum(r["status"] != "error" for r in out))

    def stats(self, skipped: int, scorer_stats: dict[str, Any]) -> dict[str, Any]:
        if self.progress is not None:
            self.progress.close()
        return {
            "version": self.version,
            "scored": sum(self.statuses.values()),
            "skipped": skipped,
            "status": dict(self.statuses),
            "elapsed_s": round(time.perf_counter() - self.started, 3),
            "scorer": scorer_stats,
        }


def _new_work(
    store: RunStore,
    name: str,
    version: str,
    rows: list[dict[str, Any]],
    batch_size: int,
    progress: bool,
) -> tuple[_Work, int]:
    todo = missing_rows(store, name, version, rows)
    bar = None
    if progress and todo:
        from harness.progress import Progress

        bar = Progress(f"score {name}", total=len(todo))
    return _Work(name, version, todo, max(1, batch_size), bar), len(rows) - len(todo)


def score_run(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    use_ray: bool,
    batch_size: int = 64,
    *,
    progress: bool = True,
    start_timeout_s: float = 600.0,
) -> dict[str, dict[str, Any]]:
    """Run every scorer over the ok generation rows it has not scored at its version yet.

    Args:
        store: the run directory.
        scorers: (registry name, parameters) pairs.
        context: seed words, cache directory, device for the scorers.
        use_ray: one actor per scorer (all at once) on the connected Ray; else in process.
        batch_size: rows per chunk (and per written shard).
        progress: progress bars per scorer.
        start_timeout_s: Ray only: how long an actor may take to start (model download,
            waiting for a GPU) before the stage gives up on it.

    Returns:
        Stats per scorer: version, scored (rows scored now), skipped (already scored),
        status counts, elapsed_s, and the scorer's own `close()` stats.

    Raises:
        StoreError: no generations (see `generation_rows`).
        KeyError / ValueError: an unknown scorer name or parameter, a scorer listed twice
            (before any work).
        ScoringError: a scorer that could not start or failed mid-way (the others still
            finish, and what was scored is on disk).
    """
    names = [name for name, _ in scorers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"scorer(s) {twice} listed twice: scores/<scorer>/ holds one setting at a time"
        )
    for name, params in scorers:
        check_scorer_name(name)
        load_scorer(name).check_params(params)  # imports the module only: no torch here
    rows = generation_rows(store)
    if use_ray:
        stats, failures = _score_on_ray(
            store, scorers, context, rows, batch_size, progress, start_timeout_s
        )
    else:
        stats, failures = _score_in_process(store, scorers, context, rows, batch_size, progress)
    if failures:
        lines = "\n".join(f"  {name}: {msg}" for name, msg in failures.items())
        raise ScoringError(f"{len(failures)} scorer(s) failed on {store.uri}:\n{lines}", stats)
    return stats


def _score_in_process(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    rows: list[dict[str, Any]],
    batch_size: int,
    progress: bool,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """One scorer after the other in this process; a failing scorer does not stop the next."""
    stats: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for name, params in scorers:
        try:
            scorer = load_scorer(name)(params, context)
        except Exception as exc:  # noqa: BLE001 - reported with the others below
            failures[name] = f"cannot start: {type(exc).__name__}: {exc}"
            continue
        work, skipped = _new_work(store, name, scorer.version, rows, batch_size, progress)
        try:
            _drive_plain(store, work, scorer.begin, scorer.score)
        except Exception as exc:  # noqa: BLE001
            failures[name] = f"{type(exc).__name__}: {exc}"
        finally:
            stats[name] = work.stats(skipped, scorer.close())
    return stats, failures


def _drive_plain(
    store: RunStore,
    work: _Work,
    begin: Callable[[int], None],
    score: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    begin(len(work.todo))
    while work.chunks_left():
        chunk = work.take()
        work.write(store, chunk, score(chunk))


def _score_on_ray(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    rows: list[dict[str, Any]],
    batch_size: int,
    progress: bool,
    start_timeout_s: float,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every scorer in its own actor, all at once; chunks are written as they come back."""
    import ray

    actors, failures = _start_actors(scorers, context, start_timeout_s)
    works: dict[str, _Work] = {}
    skipped: dict[str, int] = {}
    for name, (actor, version) in actors.items():
        works[name], skipped[name] = _new_work(store, name, version, rows, batch_size, progress)
        actor.begin.remote(len(works[name].todo))
    inflight: dict[Any, tuple[str, list[dict[str, Any]]]] = {}

    def submit(name: str) -> None:
        work = works[name]
        while work.chunks_left() and sum(n == name for n, _ in inflight.values()) < PIPELINE:
            chunk = work.take()
            inflight[actors[name][0].score.remote(chunk)] = (name, chunk)

    for name in works:
        submit(name)
    while inflight:
        done, _ = ray.wait(list(inflight), num_returns=1)
        name, chunk = inflight.pop(done[0])
        if name in failures:
            continue  # a chunk queued before its scorer failed
        try:
            works[name].write(store, chunk, ray.get(done[0]))
            submit(name)
        except Exception as exc:  # noqa: BLE001 - the scorer stops; the others go on
            failures[name] = _ray_error(exc)
    stats = {}
    for name, (actor, _) in actors.items():
        stats[name] = works[name].stats(skipped[name], _close_actor(actor))
    return stats, failures


def _start_actors(
    scorers: Sequence[tuple[str, dict[str, Any]]], context: ScorerContext, timeout_s: float
) -> tuple[dict[str, tuple[Any, str]], dict[str, str]]:
    """{name: (actor, version)} of the scorers that started; {name: why} of the others."""
    import ray

    from workers.actors import ScorerActor

    classes = {name: load_scorer(name) for name, _ in scorers}
    gpus = float(ray.cluster_resources().get("GPU", 0))
    gpu_scorers = sum(1 for cls in classes.values() if cls.wants_gpu)
    share = min(1.0, gpus / gpu_scorers) if gpus and gpu_scorers else 0.0
    pending: dict[Any, tuple[str, Any]] = {}
    for name, params in scorers:
        cls = classes[name]
        options = {"num_cpus": cls.num_cpus, "num_gpus": share if cls.wants_gpu else 0.0}
        # A restarted actor re-runs __init__; a retried chunk rewrites the same shard.
        actor = ScorerActor.options(max_restarts=1, max_task_retries=1, **options).remote(  # type: ignore[attr-defined]
            name, params, context
        )
        pending[actor.version.remote()] = (name, actor)
    ready, not_ready = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    started: dict[str, tuple[Any, str]] = {}
    failures: dict[str, str] = {}
    for ref in ready:
        name, actor = pending[ref]
        try:
            started[name] = (actor, str(ray.get(ref)))
        except Exception as exc:  # noqa: BLE001 - __init__ raised (bad label map, no key...)
            failures[name] = f"cannot start: {_ray_error(exc)}"
            ray.kill(actor)
    for ref in not_ready:
        name, actor = pending[ref]
        failures[name] = (
            f"actor not ready after {timeout_s:.0f}s: the cluster may lack the resources it asks "
            "for, or the model download is slow"
        )
        ray.kill(actor)
    return started, failures


def _close_actor(actor: Any) -> dict[str, Any]:
    import ray

    try:
        return dict(ray.get(actor.close.remote(), timeout=120))
    except Exception as exc:  # noqa: BLE001 - a dead actor has no stats; say so
        return {"close_error": _ray_error(exc)}
    finally:
        ray.kill(actor)


def _ray_error(exc: BaseException) -> str:
    """The scorer's own exception when Ray carries one, not Ray's whole traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        return f"{type(cause).__name__}: {cause}"
    # An actor whose __init__ raised: Ray's text ends with "module.path.ErrorType: message".
    last = (str(exc).strip().splitlines() or [""])[-1]
    found = re.match(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception)): (.*)$", last)
    if found:
        return f"{found.group(1)}: {found.group(2)}"
    return f"{type(exc).__name__}: {last}"

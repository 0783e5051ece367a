"""How the dispatcher reaches generation actors: Ray actors, or plain objects in this process.

A backend creates actors, calls `prepare` / `run_batch` on them and returns futures; `result`
turns every failure into one of two kinds the dispatcher acts on: `ActorLost` (the process is
gone: killed, out of memory, its node lost) or `TaskFailed` (the call raised in a live actor).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from harness.stages.generation.reservation import in_group, live_group, remove_groups
from jobs.spec import JobSpec, ModelRef

MethodKey = tuple[str, str, str]  # (method, canonical params JSON, task)
Batch = list[JobSpec]


class ActorLost(RuntimeError):
    """The actor process is gone or unreachable (killed, out of memory, node lost)."""


class TaskFailed(RuntimeError):
    """The call raised inside a live actor; the message is the actor's exception."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """How one model's replicas (or one scorer's pool of actors) are placed: count, Ray
    resources each, torch device."""

    replicas: int
    num_gpus: float
    num_cpus: float
    device: str = ""  # "cpu", "cuda", "auto" (one replica over its GPUs); "": the default
    threads: int = 0  # torch threads of each actor; 0: its CPUs (`cpu_threads`)


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """What a backend needs to create one actor."""

    model: ModelRef
    name: str  # "<model>#<slot>", plus ".<n>" for its n-th restart
    placement: Placement
    group: Any = None  # the slot's reservation (a Ray placement group), if any


@dataclasses.dataclass
class ActorRecord:
    """One actor process, from creation to its end: what it did, for the manifest."""

    name: str
    model: str
    created: float
    ready_at: float | None = None
    ended_at: float | None = None
    end: str = "running"  # "released", "died: <reason>", "start timed out"...
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # from `prepare`
    batches: int = 0
    jobs: int = 0
    ok: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    # GPU replicas (`workers.generator.BatchSizer`): the largest measured peak memory per
    # sequence, extra chunks the sizer cut, halvings after out-of-memory
    peak_bytes_per_seq: int = 0
    memory_chunks: int = 0
    oom_splits: int = 0

    def add(self, result: dict[str, Any]) -> None:
        """Fold in a `run_batch` result (its memory figures absent: a CPU replica)."""
        self.batches += 1
        self.jobs += int(result["jobs"])
        self.ok += int(result["ok"])
        self.tokens += int(result.get("tokens", 0))
        self.busy_s += float(result.get("busy_s", 0.0))
        peak = int(result.get("peak_bytes_per_seq") or 0)
        self.peak_bytes_per_seq = max(self.peak_bytes_per_seq, peak)
        self.memory_chunks += int(result.get("memory_chunks") or 0)
        self.oom_splits += int(result.get("oom_splits") or 0)

    def summary(self, now: float, placement: Placement) -> dict[str, Any]:
        """Where it ran, what it did, throughput and utilisation (busy / alive since ready)."""
        end = self.ended_at if self.ended_at is not None else now
        alive = end - self.ready_at if self.ready_at is not None else 0.0
        out: dict[str, Any] = {"worker": self.name, "model": self.model, "end": self.end}
        out.update({k: self.info.get(k) for k in ("host", "node_id", "pid", "gpu_ids", "threads")})
        out["device"] = self.info.get("device", placement.device)
        out.update(num_gpus=placement.num_gpus, num_cpus=placement.num_cpus)
        out.update(batches=self.batches, jobs=self.jobs, ok=self.ok, tokens=self.tokens)
        out.update(busy_s=round(self.busy_s, 3), alive_s=round(alive, 3))
        if self.ready_at is not None:
            out["load_s"] = round(self.ready_at - self.created, 3)
        out["utilisation"] = round(min(1.0, self.busy_s / alive), 3) if alive > 0 else None
        out["jobs_per_s"] = round(self.jobs / alive, 3) if alive > 0 else None
        out["tokens_per_busy_s"] = round(self.tokens / self.busy_s, 1) if self.busy_s else None
        out["peak_bytes_per_seq"] = self.peak_bytes_per_seq or None
        out.update(memory_chunks=self.memory_chunks, oom_splits=self.oom_splits)
        return out


class Backend(Protocol):
    """Creates actors and calls them; calls return futures the dispatcher waits on. `wait`:
    the finished ones (waiting up to `timeout` for one); `result`: a call's value, or
    `ActorLost` / `TaskFailed`; `free`: give back a slot's reservation (`ActorSpec.group`);
    `renew`: a replacement's reservation, new where the old one's node died."""

    def create(self, spec: ActorSpec) -> Any: ...
    def prepare(self, actor: Any, keys: Sequence[MethodKey]) -> Any: ...
    def run_batch(self, actor: Any, batch: Batch) -> Any: ...
    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]: ...
    def result(self, future: Any) -> Any: ...
    def kill(self, actor: Any) -> None: ...
    def free(self, group: Any) -> None: ...
    def renew(self, group: Any) -> Any: ...


def cpu_threads(num_cpus: float, threads: int = 0) -> int:
    """torch threads of an actor holding `num_cpus` Ray CPUs (at least one); `threads` when
    the placement sets them (a CPU scorer pool on a local Ray: `pool_plans`)."""
    return threads or max(1, int(num_cpus))


def first_line(exc: BaseException) -> str:
    """The first line of an exception's text (Ray's texts run to a screenful)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def actor_error(exc: BaseException, limit: int = 300) -> str:
    """Ray's reason for an actor's death, without its field list.

    Ray's text is "The actor died unexpectedly...", tab-indented fields (class, id, pid, ip),
    then the reason ("The actor died because its node has died...", "...killed by the OOM
    killer..."): keep the first line and the reason.
    """
    lines = [ln.strip() for ln in str(exc).strip().splitlines()]
    reasons = [ln for ln in lines[1:] if ln and ":" not in ln.split(" ", 1)[0]]
    text = " ".join([lines[0] if lines else type(exc).__name__, *reasons])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ray_error(exc: BaseException) -> str:
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


def ray_ready(refs: Sequence[Any], timeout: float) -> list[Any]:
    """The Ray refs among `refs` that are finished, waiting up to `timeout` for the first."""
    import ray

    ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
    if ready:  # collect everything finished by now, not only the first
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    return list(ready)


# ---- in this process -----------------------------------------------------------------------


class Done:
    """A call that already ran: its value or its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: Exception | None = None
        try:
            self.value = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the dispatcher as a result
            self.error = exc


class LocalActor:
    """An object built on first use, so that a constructor error is the first call's error."""

    def __init__(self, factory: Callable[[ActorSpec], Any], spec: ActorSpec) -> None:
        self.factory, self.spec = factory, spec
        self.obj: Any = None

    def get(self) -> Any:
        from workers.plugins import BUILDING

        with BUILDING:
            if self.obj is None:
                self.obj = self.factory(self.spec)
        return self.obj


class LocalBackend:
    """Runs each call when it is made, in this process (`--no-ray`, and tests with fakes).

    `factory(spec)` builds the object behind an actor: a `workers.generator.Generator`, or a
    test double. An `ActorLost` it raises passes through (tests simulate deaths that way); any
    other exception becomes `TaskFailed`.
    """

    def __init__(self, factory: Callable[[ActorSpec], Any]) -> None:
        self.factory = factory

    def create(self, spec: ActorSpec) -> LocalActor:
        return LocalActor(self.factory, spec)

    def prepare(self, actor: LocalActor, keys: Sequence[MethodKey]) -> Done:
        from workers.plugins import BUILDING

        def prepare() -> Any:
            with BUILDING:  # builds the methods, and their extra models
                return actor.get().prepare(list(keys))

        return Done(prepare)

    def run_batch(self, actor: LocalActor, batch: Batch) -> Done:
        return Done(lambda: actor.get().run_batch(batch))

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        return list(futures)

    def result(self, future: Done) -> Any:
        if isinstance(future.error, ActorLost):
            raise future.error
        if future.error is not None:
            raise TaskFailed(f"{type(future.error).__name__}: {future.error}") from future.error
        return future.value

    def kill(self, actor: LocalActor) -> None:
        actor.obj = None

    def free(self, group: Any) -> None:
        """No reservations in this process."""

    def renew(self, group: Any) -> Any:
        return group


# ---- Ray -----------------------------------------------------------------------------------


class RayBackend:
    """`workers.actors.GenerationActor`s on the Ray cluster this process is attached to."""

    def __init__(self, run_uri: str, words: Any) -> None:
        import ray

        self.run_uri = run_uri
        self.words = ray.put(words)  # one copy in the object store, not one per actor

    def create(self, spec: ActorSpec) -> Any:
        from workers.actors import GenerationActor

        p = spec.placement
        # max_restarts=0: the dispatcher replaces dead actors itself (see `dispatch`).
        return GenerationActor.options(  # type: ignore[attr-defined]
            num_gpus=p.num_gpus,
            num_cpus=p.num_cpus,
            max_restarts=0,
            max_task_retries=0,
            **in_group(spec.group),
        ).remote(
            spec.model,
            self.run_uri,
            self.words,
            p.device,
            spec.name,
            cpu_threads(p.num_cpus, p.threads),
            p.num_gpus,
        )

    def prepare(self, actor: Any, keys: Sequence[MethodKey]) -> Any:
        return actor.prepare.remote(list(keys))

    def run_batch(self, actor: Any, batch: Batch) -> Any:
        return actor.run_batch.remote(batch)

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        if not futures:
            time.sleep(min(timeout, 0.05))
            return []
        return ray_ready(futures, timeout)

    def result(self, future: Any) -> Any:
        import ray
        from ray import exceptions as rex

        try:
            return ray.get(future)
        except rex.RayActorError as exc:  # died, or unreachable (ActorUnavailableError)
            raise ActorLost(actor_error(exc)) from None
        except rex.RayTaskError as exc:
            raise TaskFailed(ray_error(exc)) from None
        except rex.RayError as exc:  # worker crashed, node died, object lost, memory monitor
            raise ActorLost(f"{type(exc).__name__}: {first_line(exc)}") from None

    def kill(self, actor: Any) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def free(self, group: Any) -> None:
        remove_groups([group])

    def renew(self, group: Any) -> Any:
        return live_group(group)

"""Hand batches of jobs to generation actors from per-model queues, and survive actor deaths.

Ray-free: actors are reached through a `backends.Backend` (Ray actors, or plain objects in this
process), so every rule (docs/cluster.md, Faults) is testable without a cluster. The driver,
not Ray, restarts actors (`max_restarts=0`): it knows which batch was running."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.stages.generation.backends import (
    ActorLost,
    ActorRecord,
    ActorSpec,
    Backend,
    Batch,
    Placement,
    TaskFailed,
    first_line,
)
from harness.stages.generation.dispatch_state import (
    Call,
    ModelWork,
    Policy,
    Slot,
    is_final,
    method_key,
)
from jobs.spec import ModelRef
from results.run.invoke import check_interrupt

log = logging.getLogger("harness")
PIPELINE = 2  # batches held by one actor: one running, one queued on it

FailBatch = Callable[[Batch, str], int]  # writes error rows; returns how many jobs it recorded
Progress = Callable[[int, int], None]  # (jobs finished, of which ok)
Observer = Callable[[str, dict[str, Any]], None]  # (event, details); tests inject faults here
Grow = Callable[[], list[tuple[ModelRef, Any]]]  # reservations placed since: (model, group)


class Dispatcher:
    """Runs the queues of `works` on actors from `backend` until every batch is done or failed."""

    def __init__(
        self,
        works: Sequence[ModelWork],
        backend: Backend,
        policy: Policy,
        fail_batch: FailBatch,
        progress: Progress | None = None,
        observer: Observer | None = None,
        clock: Callable[[], float] = time.monotonic,
        grow: Grow | None = None,
    ) -> None:
        self.works = list(works)
        self.backend = backend
        self.policy = policy
        self.fail_batch = fail_batch
        self.progress = progress or (lambda n, ok: None)
        self.observer = observer or (lambda event, details: None)
        self.clock = clock
        self.grow = grow
        self.slots: list[Slot] = []
        self.calls: dict[Any, Call] = {}
        self.records: list[tuple[ActorRecord, Placement]] = []
        self.started = self.last_progress = self.last_log = clock()

    # ---- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        for work in self.works:
            work.has_batches(work.placement.replicas)  # no more actors than batches
            n = min(work.placement.replicas, len(work.batches))
            log.info(
                "generate %s: %d jobs on %d actor(s) with %s",
                work.model.id,
                work.total,
                n,
                _resources(work.placement),
            )
            for i in range(n):
                slot = Slot(work, i, group=work.groups[i] if i < len(work.groups) else None)
                self.slots.append(slot)
                self._start(slot)
            for group in work.groups[n:]:  # more reservations than batches
                self.backend.free(group)
        try:
            while self._busy():
                check_interrupt()
                ready = self.backend.wait(list(self.calls), timeout=self._tick())
                for future, value, error in self._outcomes(ready):
                    call = self.calls.pop(future, None)
                    if call is not None:  # None: dropped with its dead actor
                        self._handle(future, call, value, error)
                self._expire_starts()
                self._grow()
                self._release_idle()
                self._abandon_stuck()
                self._report()
        finally:
            for slot in self.slots:
                self._stop(slot, "released")
                self._free(slot)
        self._report(final=True)

    def _busy(self) -> bool:
        if any(c.kind == "batch" for c in self.calls.values()):
            return True
        return any(w.error is None and w.has_batches() for w in self.works)

    def _tick(self) -> float:
        return 0.0 if not self.calls else min(1.0, self.policy.log_every_s)

    def _outcomes(self, ready: Sequence[Any]) -> list[tuple[Any, Any, Exception | None]]:
        """(future, value, error) of the finished calls, successes first: a batch that finished
        before its actor died must not be charged for the death."""
        out: list[tuple[Any, Any, Exception | None]] = []
        for future in ready:
            try:
                out.append((future, self.backend.result(future), None))
            except (ActorLost, TaskFailed) as exc:
                out.append((future, None, exc))
        out.sort(key=lambda o: o[2] is not None)
        return out

    # ---- events --------------------------------------------------------------------------
    def _handle(self, future: Any, call: Call, value: Any, error: Exception | None) -> None:
        slot, work = call.slot, call.slot.work
        if call.record is not slot.record:
            return  # a call of an actor that has since been replaced
        self.last_progress = self.clock()
        if call.kind == "prepare":
            if error is None:
                self._on_ready(slot, value)
            elif isinstance(error, TaskFailed) and not work.prepared:
                self._fail_model(work, f"model {work.model.id} cannot start: {error}")
            else:
                self._actor_down(slot, error)
            return
        assert call.batch is not None
        if isinstance(error, ActorLost):
            self._actor_down(slot, error)
            return
        slot.inflight = [(f, c) for f, c in slot.inflight if f != future]
        if error is None:
            self._on_batch(slot, call, value)
        elif is_final(error):
            self._method_broken(call, first_line(error).split(": ", 1)[1])
        else:
            self._retry_or_fail(work, call.batch, call.attempts, str(error))
        self._feed(slot)

    def _on_ready(self, slot: Slot, info: dict[str, Any]) -> None:
        assert slot.record is not None
        slot.ready, slot.work.prepared, slot.failed_starts = True, True, 0
        slot.record.ready_at = self.clock()
        slot.record.info = dict(info)
        where = f"on host {info['host']}" if info.get("host") else "in this process"
        log.info(
            "actor %s ready %s (device %s, GPUs %s) after %.1fs",
            slot.record.name,
            where,
            info.get("device"),
            info.get("gpu_ids"),
            slot.record.ready_at - slot.record.created,
        )
        self.observer("actor_ready", {"name": slot.record.name, **info})
        if info.get("run_dir_visible") is False:
            self._fail_model(
                slot.work,
                (
                    f"actor {slot.record.name} {where} cannot see the run directory (no "
                    "plan.parquet there): on a multi-node cluster use an s3:// or gs:// URI or a "
                    "shared filesystem for --out"
                ),
            )
            return
        self._feed(slot)

    def _on_batch(self, slot: Slot, call: Call, result: dict[str, Any]) -> None:
        call.record.add(result)
        slot.work.done += int(result["ok"])
        slot.work.failed += int(result["jobs"]) - int(result["ok"])
        self.progress(int(result["jobs"]), int(result["ok"]))
        details = {"name": call.record.name, "jobs": result["jobs"], "ok": result["ok"]}
        self.observer("batch_done", details)

    def _actor_down(self, slot: Slot, error: Exception) -> None:
        """The slot's actor died: charge its running batch, requeue the rest, maybe restart."""
        assert slot.record is not None
        work, name = slot.work, slot.record.name
        held = [(c.batch, c.attempts) for _, c in slot.inflight if c.batch is not None]
        for future, _ in slot.inflight:
            self.calls.pop(future, None)
        slot.inflight = []
        self._stop(slot, f"died: {first_line(error)}")
        log.warning("actor %s died: %s", name, first_line(error))
        self.observer("actor_died", {"name": name, "error": first_line(error)})
        for batch, attempts in reversed(held[1:]):
            work.batches.appendleft((batch, attempts))  # never started: no attempt charged
        if held:  # the oldest call on an actor is the one that was running
            batch, attempts = held[0]
            self._retry_or_fail(work, batch, attempts, f"actor {name} died: {first_line(error)}")
        else:
            slot.failed_starts += 1
        if slot.failed_starts > self.policy.max_actor_restarts:
            log.error(
                f"replica {work.model.id}#{slot.index} retired: it died before being ready "
                f"{slot.failed_starts} times in a row"
            )
            self._free(slot)
        elif work.error is None and work.has_batches():
            slot.restarts += 1
            if slot.group is not None:  # on a live node, not the one it may have died with
                slot.group = self.backend.renew(slot.group)
            self._start(slot)
        else:
            self._free(slot)

    def _retry_or_fail(self, work: ModelWork, batch: Batch, attempts: int, error: str) -> None:
        if attempts < self.policy.max_batch_retries:
            retry = f"{attempts + 1}/{self.policy.max_batch_retries}"
            log.warning(
                f"batch of {len(batch)} jobs of {work.model.id} failed ({error}); retry {retry}"
            )
            work.batches.appendleft((batch, attempts + 1))
            return
        log.error(
            f"batch of {len(batch)} jobs of {work.model.id} failed {attempts + 1} times; "
            f"recording them as failed: {error}"
        )
        self._record_failed(work, batch, error)

    def _method_broken(self, call: Call, error: str) -> None:
        """A batch raised an error every attempt would raise again (`FINAL_ERRORS`): its jobs
        and every later batch of its method on this model fail now, with that one line."""
        assert call.batch is not None
        work, job = call.slot.work, call.batch[0]
        line = f"method {job.method} for task {job.task} cannot run: {error}"
        if method_key(job) not in work.broken:
            work.broken[method_key(job)] = line
            log.error(
                "%s: %s; its jobs on %s are recorded as failed", job.method, error, work.model.id
            )
            noted = call.record.info.setdefault("method_errors", [])
            noted += [] if line in noted else [line]
        self._record_failed(work, call.batch, line)

    def _record_failed(self, work: ModelWork, batch: Batch, error: str) -> None:
        recorded = self.fail_batch(batch, error)
        work.failed += recorded
        work.done += len(batch) - recorded  # an earlier attempt had written them after all
        self.progress(len(batch), len(batch) - recorded)
        self.observer("batch_failed", {"model": work.model.id, "jobs": len(batch), "error": error})

    def _fail_model(self, work: ModelWork, error: str) -> None:
        if work.error is None:
            queued = work.total - work.done - work.failed  # queued, in the source or in flight
            log.error("%s; its %d pending jobs stay pending", error, queued)
        work.error = work.error or error
        for slot in self.slots:
            if slot.work is work and not slot.inflight:
                self._stop(slot, "given up: model cannot run")
                self._free(slot)

    # ---- actors --------------------------------------------------------------------------
    def _start(self, slot: Slot) -> None:
        work = slot.work
        name = f"{work.model.id}#{slot.index}" + (f".{slot.restarts}" if slot.restarts else "")
        slot.actor = self.backend.create(ActorSpec(work.model, name, work.placement, slot.group))
        slot.record = ActorRecord(name=name, model=work.model.id, created=self.clock())
        self.records.append((slot.record, work.placement))
        slot.ready, slot.started_at = False, self.clock()
        future = self.backend.prepare(slot.actor, work.keys)
        self.calls[future] = Call(slot, "prepare", slot.record)

    def _stop(self, slot: Slot, why: str) -> None:
        if slot.actor is None:
            return
        self.backend.kill(slot.actor)
        for future, _ in slot.inflight:
            self.calls.pop(future, None)
        self.calls = {f: c for f, c in self.calls.items() if c.slot is not slot}
        assert slot.record is not None
        if slot.record.end == "running":
            slot.record.end, slot.record.ended_at = why, self.clock()
        slot.actor, slot.ready, slot.inflight = None, False, []

    def _feed(self, slot: Slot) -> None:
        work = slot.work
        while (
            slot.ready
            and work.error is None
            and len(slot.inflight) < PIPELINE
            and work.has_batches()
        ):
            batch, attempts = work.take()
            broken = work.broken.get(method_key(batch[0]))
            if broken is not None:  # its method cannot run on this model: not sent
                self._record_failed(work, batch, broken)
                continue
            future = self.backend.run_batch(slot.actor, batch)
            assert slot.record is not None
            call = Call(slot, "batch", slot.record, batch, attempts)
            self.calls[future] = call
            slot.inflight.append((future, call))

    def _expire_starts(self) -> None:
        now = self.clock()
        for slot in self.slots:
            if not slot.live or slot.ready:
                continue
            if now - max(slot.started_at, self.last_progress) > self.policy.start_timeout_s:
                log.error(
                    "actor %s not ready after %.0fs without progress elsewhere: the cluster "
                    "may lack what it asks for (%s); see runtime.actor_start_timeout_s",
                    slot.record.name if slot.record else "?",
                    self.policy.start_timeout_s,
                    _resources(slot.work.placement),
                )
                self._stop(slot, "start timed out")

    def _release_idle(self) -> None:
        for slot in self.slots:
            if slot.live and not slot.inflight and (slot.work.error or not slot.work.has_batches()):
                self._stop(slot, "released" if slot.ready else "not needed")
                self._free(slot)

    def _free(self, slot: Slot) -> None:
        """The slot is done for good: give its reservation back (other models, scorers)."""
        if slot.group is not None:
            self.backend.free(slot.group)
            slot.group = None

    def _grow(self) -> None:
        """New slots for reservations placed while the stage runs (nodes that joined)."""
        if self.grow is None:
            return
        works = {w.model: w for w in self.works}
        for model, group in self.grow():
            work = works.get(model)
            if work is None or work.error is not None or not work.has_batches():
                self.backend.free(group)
                continue
            slot = Slot(work, sum(1 for s in self.slots if s.work is work), group=group)
            self.slots.append(slot)
            log.info("generate %s: one more actor (slot %d)", model.id, slot.index)
            self._start(slot)

    def _abandon_stuck(self) -> None:
        for work in self.works:
            if (
                work.error is None
                and not any(s.live for s in self.slots if s.work is work)
                and work.has_batches()
            ):
                ends = [r.end for r, _ in self.records if r.model == work.model.id]
                self._fail_model(
                    work,
                    f"no generation actor left for model {work.model.id} "
                    f"(last: {ends[-1] if ends else 'none started'})",
                )

    # ---- observability -------------------------------------------------------------------
    def _report(self, final: bool = False) -> None:
        """Per-model progress on the driver's log (what `ray job logs` shows)."""
        now = self.clock()
        if not final and now - self.last_log < self.policy.log_every_s:
            return
        self.last_log = now
        elapsed = max(now - self.started, 1e-9)
        for work in self.works:
            finished = work.done + work.failed
            rate = finished / elapsed
            head = f"generate {work.model.id}: {finished}/{work.total} jobs finished ({work.failed} failed)"
            if final:
                log.info(f"{head} in {elapsed:.1f}s, {rate:.2f} jobs/s")
                continue
            left = work.total - finished
            ready = sum(1 for s in self.slots if s.work is work and s.ready)
            eta = f", ETA {left / rate:.0f}s" if rate > 0 else ""
            log.info(f"{head}, {ready} actor(s) ready, {rate:.2f} jobs/s{eta}")

    def actor_stats(self) -> list[dict[str, Any]]:
        """One summary per actor process that was started (the manifest's `actors`)."""
        now = self.clock()
        return [record.summary(now, placement) for record, placement in self.records]


def _resources(p: Placement) -> str:
    if not p.num_cpus and not p.num_gpus:
        return f"no Ray resources (in this process), device {p.device or 'default'}"
    gpus = f"{p.num_gpus:g} GPU, " if p.num_gpus else ""
    return f"{gpus}{p.num_cpus:g} CPU each, device {p.device or 'default'}"

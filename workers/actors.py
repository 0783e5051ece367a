"""Thin Ray actor shells around the plain `Generator` and `Scorer` classes.

Imports of torch / transformers happen inside the actors, never in the driver.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote
class GenerationActor:
    """One LM replica on its own GPU (or CPU slot); persists each batch itself."""

    def __init__(self, model: Any, run_uri: str, words: Any, device: str | None, name: str) -> None:
        from workers.generator import Generator

        self.gen = Generator(model, run_uri, words=words, device=device, name=name)

    def prepare(self, keys: list[tuple[str, str, str]]) -> dict[str, Any]:
        return self.gen.prepare(keys)

    def run_batch(self, jobs: list[Any]) -> dict[str, Any]:
        return self.gen.run_batch(jobs)

    def stats(self) -> dict[str, Any]:
        return dict(self.gen.stats, worker=self.gen.name)


@ray.remote
class ScorerActor:
    """One scorer (a classifier on a GPU, Perspective on a CPU...)."""

    def __init__(self, name: str, params: dict[str, Any], context: Any) -> None:
        from workers.scorers.registry import load_scorer

        self.scorer = load_scorer(name)(params, context)

    def version(self) -> str:
        return str(self.scorer.version)

    def score(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(self.scorer.score(rows))

    def close(self) -> dict[str, Any]:
        return dict(self.scorer.close())

"""Which scorers run, and which are read: the `score` command's list (`scorers_to_run`), recorded
in the run's config snapshot (`record_scorers`), and the scorer read per metric where several
gave it (`scorer_preference`)."""

from __future__ import annotations

from typing import Any

from harness.config import ConfigError, RunConfig, ScorerConfig, dump_config, load_yaml
from results.run.store import RunStore


def scorers_to_run(
    cfg: RunConfig,
    names: list[str] | None,
    settings: list[str] | None = None,
    cache_only: bool = False,
) -> list[tuple[str, dict[str, Any]]]:
    """(name, params) of the scorers `score` runs, checked (names, parameter names) now.

    No names: the config's scorers. A named scorer the config lists keeps its parameters;
    any other registered scorer runs with its defaults. `settings` (`KEY=VALUE`, or
    `NAME.KEY=VALUE` with several names; values read as YAML) override parameters.

    Raises:
        ConfigError: an unknown scorer or parameter, or a malformed setting.
    """
    from harness.stages.scoring.stage import check_scorers

    given = {s.name: dict(s.params) for s in cfg.scorers}
    chosen = list(dict.fromkeys(names)) if names else list(given)
    if not chosen:
        raise ConfigError("the run's config names no scorer: pass --scorer NAME")
    params = {name: dict(given.get(name, {})) for name in chosen}
    for item in settings or []:
        key, eq, raw = item.partition("=")
        target, dot, field = key.rpartition(".")
        if not eq or not field:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        if not dot and len(chosen) != 1:  # KEY=VALUE was right, but for which scorer?
            raise ConfigError(
                f"--set {item!r}: {len(chosen)} scorers run ({', '.join(chosen)}): name one, "
                f"as in --set {chosen[-1]}.{item}, or pick one with --scorer NAME"
            )
        target = target or chosen[0]
        if target not in params:
            raise ConfigError(f"--set {item!r}: {target!r} is not among the scorers {chosen}")
        params[target][field] = load_yaml(raw, f"--set {item!r}: the value")  # 1e-3: a float
    if cache_only:
        if "perspective" not in params:
            raise ConfigError("--cache-only applies to --scorer perspective only")
        params["perspective"]["cache_only"] = True
    try:
        check_scorers(list(params.items()))
    except (KeyError, ValueError) as exc:  # a KeyError's message is its first argument
        raise ConfigError(f"--scorer / --set: {exc.args[0]}") from None
    return list(params.items())


def record_scorers(store: RunStore, scorers: list[tuple[str, dict[str, Any]]]) -> None:
    """Add scorers run by `score` to the config snapshot (secrets redacted), or update them."""
    if not store.exists("config.yaml"):
        return
    import yaml

    from harness.config import parse_config

    snap = parse_config(yaml.safe_load(store.read_text("config.yaml")), f"{store.uri}/config.yaml")
    entries = {s.name: s for s in snap.scorers}
    for name, params in scorers:
        entries[name] = ScorerConfig(name=name, params=params)
    updated = snap.model_copy(update={"scorers": list(entries.values())})
    text = dump_config(updated)
    if text != store.read_text("config.yaml"):
        store.write_bytes("config.yaml", text.encode())


def scorer_preference(cfg: RunConfig, named: list[str], store: RunStore | None = None) -> list[str]:
    """One scorer per metric for aggregation: the ones `named` first, then the config's in
    order; with `store`, only those with a score shard there (a scorer whose every row failed
    for a transient reason has none: `run` aggregated it and ended in "no scores" instead of
    exit 3 and the `score` that retries them)."""
    from jobs.catalog import SCORER_METRICS

    present = None
    if store is not None:
        present = [n for n in store.scorers() if store.list_shards("scores", n)]
    chosen: dict[str, str] = {}
    for name in [*named, *(s.name for s in cfg.scorers)]:
        if present is None or name in present:
            chosen.setdefault(SCORER_METRICS[name], name)
    return list(chosen.values())

"""Opt-in experiment tracking after every aggregation: the summary rows as scalars
(`model/method/task/view/metric/stat/group`, with `.../ci_low`, `ci_high`, `p_value`), the
report's PNG figures and the redacted config, to Weights & Biases (`--wandb PROJECT`, extra
`wandb`, honouring `WANDB_*`) or TensorBoard (`--tensorboard DIR`, tensorboardX: no torch)."""

from __future__ import annotations

import importlib
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

from results.run.store import RunStore

log = logging.getLogger("harness")

# Characters TensorBoard would replace in a tag (it keeps letters, digits, `_ . - /`): replaced
# here, so both trackers show one name (`a(c,x)` → `a_c_x_`).
_TAG_UNSAFE = re.compile(r"[^\w.\-/]")


class TrackingError(RuntimeError):
    """A tracker that is not installed or refused the run; the message says which extra."""


def _missing(module: str, extra: str) -> str:
    return (
        f"--{extra}: the {module!r} package is not installed; pip install 'lidao-harness[{extra}]'"
    )


def _need(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(_missing(module, extra)) from None


def check_trackers(wandb_project: str | None, tensorboard_dir: str | None) -> None:
    """Refuse a tracker whose package is missing, with a `ConfigError` (before a run's work)."""
    from importlib.util import find_spec

    from harness.config import ConfigError

    for given, module, extra in (
        (wandb_project, "wandb", "wandb"),
        (tensorboard_dir, "tensorboardX", "tensorboard"),
    ):
        if given and find_spec(module) is None:
            raise ConfigError(_missing(module, extra))


def summary_scalars(store: RunStore) -> dict[str, float]:
    """Tag → value of every summary row with a finite value (and its interval, p-value)."""
    rows = store.read_parquet("summary.parquet").to_pylist()
    out: dict[str, float] = {}
    for row in rows:
        method = row["method"] + (f"[{row['variant']}]" if row.get("variant") else "")
        parts = [row["model"], method, row["task"], row.get("view") or "-"]
        parts += [row["metric"], row["stat"], row.get("group") or "-"]
        tag = _TAG_UNSAFE.sub("_", "/".join(str(p).replace("/", "_") for p in parts))
        for key, suffix in (("value", ""), ("ci_low", "/ci_low"), ("ci_high", "/ci_high")):
            v = row.get(key)
            if isinstance(v, float | int) and math.isfinite(v):
                out[tag + suffix] = float(v)
        p = row.get("p_value")
        if isinstance(p, float) and math.isfinite(p):
            out[tag + "/p_value"] = p
    return out


def figures(store: RunStore) -> dict[str, str]:
    """Name → local path of the report's PNG figures (a local run directory only)."""
    folder = Path(store.path("report"))
    if not folder.is_dir():
        return {}
    return {p.stem: str(p) for p in sorted(folder.glob("*.png"))}


def _config(store: RunStore) -> dict[str, Any]:
    from results.report.results_json import RESULTS_JSON

    if not store.exists(RESULTS_JSON):
        return {}
    doc = store.read_json(RESULTS_JSON)
    return {"config": doc.get("config", {}), "versions": doc.get("versions", {})}


def log_wandb(store: RunStore, project: str) -> str:
    """One W&B run with the summary (as scalars, a table) and the figures; returns its dir."""
    wandb = _need("wandb", "wandb")
    meta = _config(store)
    name = (meta.get("config") or {}).get("name") or Path(store.uri).name
    try:
        run = wandb.init(project=project, name=name, config=meta, job_type="evaluation")
    except Exception as exc:  # no key off a terminal (UsageError), a refused login, no network
        raise TrackingError(
            f"--wandb {project}: W&B refused the run ({exc}); set WANDB_API_KEY (or `wandb "
            f"login`), or WANDB_MODE=offline to log locally, then `python -m harness aggregate "
            f"{store.uri} --wandb {project}` logs this run (its files are written)"
        ) from None
    try:
        scalars = summary_scalars(store)
        images = {f"report/{k}": wandb.Image(p) for k, p in figures(store).items()}
        run.log({**scalars, **images})
        run.summary.update(scalars)
        table = store.read_parquet("summary.parquet")
        rows = [list(row.values()) for row in table.to_pylist()]
        run.log({"summary": wandb.Table(columns=table.column_names, data=rows)})
        where = str(getattr(run, "dir", "") or "")
    finally:
        run.finish()
        wandb.teardown()  # stop its service now, not in an atexit hook after the streams close
    log.info("wandb: logged %d values, %d figures (project %s)", len(scalars), len(images), project)
    return where


def log_tensorboard(store: RunStore, logdir: str) -> str:
    """An event file under `logdir` with the summary scalars, figures and config."""
    tbx = _need("tensorboardX", "tensorboard")
    import matplotlib.image as mpimg

    writer = tbx.SummaryWriter(logdir=logdir)
    try:
        scalars = summary_scalars(store)
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step=0)
        shown = figures(store)
        for name, path in shown.items():
            img = mpimg.imread(path)  # float HWC in [0, 1] (RGBA for PNG)
            writer.add_image(f"report/{name}", img[..., :3], global_step=0, dataformats="HWC")
        meta = _config(store)
        if meta:
            text = json.dumps(meta, indent=1, default=str)
            writer.add_text("config", "```\n" + text + "\n```", global_step=0)
        writer.flush()
        where = str(writer.logdir)
    finally:
        writer.close()
    log.info("tensorboard: logged %d values, %d figures to %s", len(scalars), len(shown), where)
    return where


def track(store: RunStore, wandb_project: str | None, tensorboard_dir: str | None) -> list[str]:
    """The trackers asked for (none: nothing imported); one line each for the user."""
    lines: list[str] = []
    if not store.exists("summary.parquet"):
        return lines
    if wandb_project:
        lines.append(f"wandb: project {wandb_project} ({log_wandb(store, wandb_project)})")
    if tensorboard_dir:
        lines.append(f"tensorboard: {log_tensorboard(store, tensorboard_dir)}")
    return lines

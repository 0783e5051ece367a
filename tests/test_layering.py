"""The package layout's rules, read from the source (every import, at module level or inside a
function, under TYPE_CHECKING or not):

* floors: `jobs` (1) < `results` (2) < `workers` (3) < `harness` (4); inside a package its rooms
  have floors too (`RANK`). A module imports only from its own floor or below.
* no import circle between modules;
* no file over `MAX_LINES` lines (packages, tests, benchmarks, scripts);
* the run directory (`results.run.store` and all it imports) needs nothing above `results.run`.

docs/design.md ("Layout") draws the same floors; a new room gets its floor in `RANK`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("jobs", "results", "workers", "harness")
MAX_LINES = 450

# module prefix → (package floor, room floor); the longest matching prefix wins
RANK: dict[str, tuple[int, int]] = {
    "jobs": (1, 0),
    "results": (2, 0),
    "results.schema": (2, 0),
    "results.run": (2, 1),
    "results.stats": (2, 2),
    "results.human": (2, 2),
    "results.report": (2, 3),
    "workers": (3, 0),
    "harness": (4, 0),
    "harness.config": (4, 0),
    "harness.progress": (4, 0),
    "harness.stages": (4, 1),
    "harness.stages.generation": (4, 1),
    "harness.stages.scoring": (4, 2),
    "harness.driver": (4, 3),
    "harness.tools": (4, 3),
    "harness.cli": (4, 4),
    "harness.__main__": (4, 4),
}
# Faces that resolve names lazily (importlib) import nothing themselves: their floor is the
# package's floor; every other face sits on its room's floor.

# Known breaks of the rules while the layout moves (issue 21): each entry goes when its fix lands,
# and the test fails on any break not listed here and on any listed break that is gone.
KNOWN_UP: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_LONG: set[str] = set()


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def rank(module: str) -> tuple[int, int]:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in RANK:
            return RANK[key]
    raise AssertionError(f"{module}: no floor in RANK (tests/test_layering.py)")


def imported(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module imported, line) for every import in `path` of a module of ours."""
    is_face = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_face else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known]
            # `from pkg import submodule` reaches the submodule, not the face's own names
            targets = subs if len(subs) == len(node.names) else [source, *subs]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != module:
                yield target, node.lineno


def graph() -> dict[str, dict[str, int]]:
    known = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges[name] = {}
        for target, line in imported(name, path, known):
            edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.add(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


EDGES = graph()


def climbs(edges: dict[str, dict[str, int]]) -> set[tuple[str, str]]:
    """The imports of `edges` from a lower floor to a higher one."""
    return {(s, t) for s, targets in edges.items() for t in targets if rank(t) > rank(s)}


def test_every_import_points_down_or_sideways() -> None:
    up = climbs(EDGES)
    where = [f"{s} -> {t} (line {EDGES[s][t]})" for s, t in sorted(up - KNOWN_UP)]
    assert not where, "imports from a lower floor to a higher one:\n" + "\n".join(where)
    assert not KNOWN_UP - up, f"fixed, drop from KNOWN_UP: {sorted(KNOWN_UP - up)}"


@pytest.mark.parametrize(
    ("source", "target", "climb"),
    [
        ("jobs.grid", "workers.methods.registry", True),  # the old planner → methods arrow
        ("results.run.identity", "harness.config", True),
        ("results.run.store", "results.stats.join", True),  # a room above in the same package
        ("harness.cli.commands", "harness.stages.generation.planning", False),
        ("results.report.build", "results.stats.aggregate", False),
        ("workers.actors", "workers.scorers.registry", False),
    ],
)
def test_the_floor_check_sees_a_climb(source: str, target: str, climb: bool) -> None:
    assert climbs({source: {target: 1}, target: {}}) == ({(source, target)} if climb else set())


def test_no_import_circles() -> None:
    found = set(cycles(EDGES))
    new = [sorted(c) for c in found - KNOWN_CYCLES]
    assert not new, f"import circles: {new}"
    assert not KNOWN_CYCLES - found, f"fixed, drop from KNOWN_CYCLES: {KNOWN_CYCLES - found}"


def test_no_file_over_the_line_limit() -> None:
    """Every Python file of the packages, the tests, the benchmarks and the scripts."""
    files = [*modules().values()]
    files += [p for d in ("tests", "benchmarks", "scripts") for p in (REPO / d).rglob("*.py")]
    long = {
        str(path.relative_to(REPO)): n
        for path in files
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    new = {k: v for k, v in long.items() if k not in KNOWN_LONG}
    assert not new, f"files over {MAX_LINES} lines: {new}"
    assert not KNOWN_LONG - set(long), f"fixed, drop from KNOWN_LONG: {KNOWN_LONG - set(long)}"


def test_the_run_directory_needs_nothing_above_it() -> None:
    """From every module of `results.run` (the store, the run record, the lock), every import
    reached stays in `results.run` or goes down, so no walk returns to a room it left."""
    if any(source.startswith("results.run") for source, _ in KNOWN_UP):
        pytest.xfail("results.run still climbs (KNOWN_UP)")
    for start in (m for m in EDGES if m.startswith("results.run")):
        seen, todo = {start}, [start]
        while todo:
            source = todo.pop()
            for target in EDGES[source]:
                assert rank(target) <= rank(source), f"from {start}: {source} -> {target} climbs"
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        assert max(rank(m) for m in seen) == RANK["results.run"], sorted(seen)


@pytest.mark.parametrize(
    ("rules", "breaks"),
    [
        ({"a": {"b": 1}, "b": {"a": 2}}, [frozenset({"a", "b"})]),
        ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}, [frozenset("abc")]),
        ({"a": {"b": 1}, "b": {}}, []),
    ],
)
def test_the_circle_finder_finds_circles(
    rules: dict[str, dict[str, int]], breaks: list[frozenset[str]]
) -> None:
    assert cycles(rules) == breaks


def layout_section() -> list[list[str]]:
    """The rows of docs/design.md's "Layout" table, as [floor, room, what, torch] cells."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]  # no header


def test_the_design_doc_draws_the_tree_as_it_is() -> None:
    """Each folder's modules, as `ls` shows them, are the ones the Layout table names for it."""
    drawn: dict[str, set[str]] = {}
    package = ""
    for floor, room, *_ in layout_section():
        package = floor.split("`")[1].rstrip("/") if floor else package
        names = room.split("`")[1::2]
        if names[0].endswith("/"):  # a room: `name/` (`module`, ...)
            drawn.setdefault(f"{package}/{names[0].rstrip('/')}", set()).update(names[1:])
        else:  # modules of the package itself
            drawn.setdefault(package, set()).update(n.removesuffix(".py") for n in names)
    on_disk: dict[str, set[str]] = {}
    for path in modules().values():
        if path.stem not in ("__init__", "__main__"):
            on_disk.setdefault(str(path.parent.relative_to(REPO)), set()).add(path.stem)
    assert drawn == on_disk

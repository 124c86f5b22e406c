"""The shape of the code (issue 13, docs/architecture.md): stages import one way, never in a circle.

These tests read the source with :mod:`ast` (nothing is imported), so they see every import: those at the top
of a module, those inside functions (a cycle there is still a cycle, only a later one), and those under
``if TYPE_CHECKING:`` (a type-only dependency is still a dependency a reader has to follow). A failure names
the modules and the line, so the fix is to move the shared name down a layer, not to hide the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Where each package of the distribution lives in the checkout (pyproject's package-dir mapping).
PACKAGE_DIRS = {
    "unity_eq": ROOT / "unity_eq",
    "unity_eq.frontends": ROOT / "frontends",
    "unity_eq.verify": ROOT / "verify",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target in another project module (``name`` set for ``from m import name``)."""

    importer: str
    target: str
    name: str | None
    line: int

    def where(self) -> str:
        return f"{module_files()[self.importer].relative_to(ROOT)}:{self.line}"


def module_files() -> dict[str, Path]:
    """Every project module by dotted name (the symlinks a worktree may have inside unity_eq/ are skipped)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts and parts[0] in {"frontends", "verify", "rules"} and package == "unity_eq":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = module_files()[module].name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str) -> Iterator[Import]:
    """The project modules ``module`` imports, wherever in the file the import stands."""
    modules = module_files()
    tree = ast.parse(modules[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield Import(module, alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    yield Import(module, f"{target}.{alias.name}", None, node.lineno)
                elif target in modules:
                    yield Import(module, target, alias.name, node.lineno)


def import_graph() -> dict[str, list[Import]]:
    return {module: [i for i in imports_of(module) if i.target != module] for module in module_files()}


def strongly_connected(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                nxt = step.target
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def cycle_in(group: list[str], graph: dict[str, list[Import]]) -> list[Import]:
    """One concrete circle inside a strongly connected group, as the imports that make it (for the message)."""
    members = set(group)
    start = group[0]
    parents: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target == start:
                    path = [edge]
                    while path[0].importer != start:
                        path.insert(0, parents[path[0].importer])
                    return path
                if edge.target in members and edge.target not in parents:
                    parents[edge.target] = edge
                    nxt.append(edge.target)
        frontier = nxt
    raise AssertionError(f"{group} is not strongly connected")


def test_the_tests_see_the_whole_project() -> None:
    """Guard the guard: the scan finds the stage modules and their imports (an empty scan would pass anything)."""
    graph = import_graph()
    assert {"unity_eq.cli", "unity_eq.ir", "unity_eq.cost", "unity_eq.verify", "unity_eq.frontends.onnx"} <= set(graph)
    assert sum(len(edges) for edges in graph.values()) > 100
    assert any(edge.target == "unity_eq.ir" for edge in graph["unity_eq.frontends.onnx"])


def test_no_import_cycle() -> None:
    graph = import_graph()
    circles = []
    for group in strongly_connected(graph):
        path = cycle_in(group, graph)
        steps = " → ".join(f"{edge.importer} ({edge.where()})" for edge in path) + f" → {path[0].importer}"
        circles.append(f"{len(group)} modules tied: {', '.join(group)}\n    e.g. {steps}")
    assert not circles, "import cycles (move the shared name down a layer):\n  " + "\n  ".join(circles)


def test_cycle_finder_finds_a_cycle() -> None:
    """The finder itself: a three-module circle and a self-import are told apart."""
    edge = lambda a, b: Import(a, b, None, 1)  # noqa: E731
    graph = {"a": [edge("a", "b")], "b": [edge("b", "c")], "c": [edge("c", "a")], "d": [edge("d", "a")]}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert [e.importer for e in cycle_in(["a", "b", "c"], graph)] == ["a", "b", "c"]
    assert strongly_connected({"a": [], "b": [edge("b", "a")]}) == []


def _private_attribute_uses(module: str) -> Iterator[tuple[str, int]]:
    """``alias._name`` where ``alias`` is bound to another project module by an import in this file."""
    modules = module_files()
    tree = ast.parse(modules[module].read_text(encoding="utf-8"))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != module
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield f"{aliases[node.value.id]}.{node.attr}", node.lineno


def test_no_private_name_crosses_a_module() -> None:
    """A leading underscore means "only this module uses it"; another module reaching in makes a hidden seam."""
    found = []
    for module, edges in import_graph().items():
        for edge in edges:
            if edge.name and edge.name.startswith("_") and not edge.name.startswith("__"):
                found.append(f"{edge.where()}: {module} imports {edge.target}.{edge.name}")
        for name, line in _private_attribute_uses(module):
            found.append(f"{module_files()[module].relative_to(ROOT)}:{line}: {module} uses {name}")
    assert not found, "private names used across modules (make them public or move them):\n  " + "\n  ".join(found)


@pytest.mark.parametrize("lower", ["unity_eq.frontends", "unity_eq"])
def test_the_engine_never_imports_the_verifier(lower: str) -> None:
    """verify → unity_eq, one way: the engine must run without z3 and the verifier's code (cli dispatches)."""
    offenders = [
        f"{edge.where()}: {module} imports {edge.target}"
        for module, edges in import_graph().items()
        if module.startswith(lower)
        and not module.startswith("unity_eq.verify")
        and not (module == "unity_eq.cli" or module.startswith("unity_eq.cli."))
        for edge in edges
        if edge.target.startswith("unity_eq.verify")
    ]
    assert not offenders, "\n".join(offenders)


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject lists the packages setuptools puts in a wheel: a package left out installs editable (as in
    development) but is missing from `pip install .` (unity_eq.runtime, ops, extract… once were)."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {module for module, path in module_files().items() if path.name == "__init__.py"}
    missing = sorted(packages - listed)
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"

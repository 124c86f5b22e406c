"""The shape of the code (issue 13, docs/architecture.md): passes import one way, never in a circle.

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
    """Guard the guard: the scan finds every pass's modules and their imports (an empty scan would pass anything)."""
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


def package_of(module: str) -> str:
    """The package a module belongs to at the level the layout is read: ``unity_eq.search.runner`` →
    ``unity_eq.search``; a loose module (``unity_eq.files``) is its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, list[Import]]) -> dict[str, list[Import]]:
    """The import graph with every module replaced by its package (edges inside one package dropped)."""
    packages: dict[str, list[Import]] = {package_of(m): [] for m in graph}
    for module, edges in graph.items():
        for edge in edges:
            if package_of(edge.target) != package_of(module):
                packages[package_of(module)].append(Import(edge.importer, package_of(edge.target), None, edge.line))
    return packages


def test_no_package_cycle() -> None:
    """Packages import one way too: two packages that import each other (even through different modules, so no
    module cycle) are one tangle to a reader (``ops`` ↔ ``rulesets`` and ``lower`` ↔ ``runtime`` once were)."""
    graph = import_graph()
    packages = package_graph(graph)
    circles = []
    for group in strongly_connected(packages):
        edges = [f"{e.where()}: {e.importer} → {e.target}" for p in group for e in packages[p] if e.target in group]
        circles.append(f"{', '.join(group)}:\n    " + "\n    ".join(dict.fromkeys(edges)))
    assert not circles, "packages that import each other:\n  " + "\n  ".join(circles)


def test_package_cycle_finder_sees_a_tangle_of_distinct_modules() -> None:
    """Guard the guard: a.x → b.y and b.z → a.w is no module cycle but a package cycle."""
    graph = {
        "unity_eq.a.x": [Import("unity_eq.a.x", "unity_eq.b.y", None, 1)],
        "unity_eq.b.y": [],
        "unity_eq.b.z": [Import("unity_eq.b.z", "unity_eq.a.w", None, 1)],
        "unity_eq.a.w": [],
    }
    assert strongly_connected(graph) == []
    assert strongly_connected(package_graph(graph)) == [["unity_eq.a", "unity_eq.b"]]


def test_no_private_module_is_imported_from_another_package() -> None:
    """``unity_eq.verify._cli`` is the verifier's own business: another package imports what the package
    exports (its ``__init__``), so the private modules can move without breaking it."""
    found = [
        f"{edge.where()}: {module} imports {edge.target}"
        for module, edges in import_graph().items()
        for edge in edges
        if package_of(edge.target) != package_of(module)
        and any(part.startswith("_") and not part.startswith("__") for part in edge.target.split("."))
    ]
    assert not found, "private modules imported across packages (export the name instead):\n  " + "\n  ".join(found)


def depths(graph: dict[str, list[Import]]) -> dict[str, int]:
    """Each module's depth: 0 when it imports nothing of ours, else one more than its deepest import."""
    found: dict[str, int] = {}
    for root in graph:
        work = [root]
        while work:
            module = work[-1]
            pending = [e.target for e in graph[module] if e.target not in found]
            if pending:
                work.extend(pending)
                continue
            work.pop()
            found[module] = 1 + max((found[e.target] for e in graph[module]), default=-1)
    return found


def layer_table() -> list[tuple[int, int, list[str]]]:
    """The rows of docs/architecture.md's layer table: (lowest depth, highest depth, the names in the row)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+)-(\d+) \| (.*?) \| .* \|$", text, re.MULTILINE)
    return [(int(lo), int(hi), re.findall(r"`([^`]+)`", cell)) for lo, hi, cell in rows]


def test_the_layer_table_matches_the_imports() -> None:
    """docs/architecture.md's layer table says how deep each module sits; a module named there must sit in its
    row's range, and a package named ``pkg.*`` has its deepest module (of those not named on their own) there.
    ``ops.<family>`` stands for every op family module. Every module is in some row."""
    graph = import_graph()
    depth = depths(graph)
    rows = layer_table()
    assert rows, "docs/architecture.md has no layer table"
    named = {name for _, _, names in rows for name in names}
    families = {f"unity_eq.ops.{path.stem}" for path in (ROOT / "unity_eq" / "ops").glob("*.py")} & {
        m for m in graph if any(e.target == "unity_eq.ops.family" for e in graph[m])
    }
    wrong, covered = [], set()
    for lo, hi, names in rows:
        for name in names:
            full = "unity_eq" if name == "unity_eq" else f"unity_eq.{name}"
            if name == "ops.<family>":
                members = sorted(families - {f"unity_eq.{n}" for n in named})
            elif name.endswith(".*"):
                package = full[:-2]
                members = [
                    m
                    for m in graph
                    if m.startswith(package + ".") and m.removeprefix("unity_eq.") not in named and m not in families
                ]
                covered.update(members)
                covered.add(package)
                members = [max(members, key=lambda m: depth[m])] if members else []
            else:
                assert full in graph, f"docs/architecture.md's layer table names {name!r}, which is no module"
                members = [full]
            covered.update(members)
            wrong += [f"{m}: depth {depth[m]}, the table says {lo}-{hi}" for m in members if not lo <= depth[m] <= hi]
    missing = sorted(m for m in graph if m not in covered and package_of(m) not in covered)
    missing = [m for m in missing if not m.startswith("unity_eq.verify")]  # the prover sits aside (the text says)
    assert not wrong, "docs/architecture.md's layer table is out of date:\n  " + "\n  ".join(wrong)
    assert not missing, f"modules in no row of docs/architecture.md's layer table: {missing}"


def test_the_optimize_path_imports_no_z3() -> None:
    """``optimize`` never loads the prover's solver: no module the driver reaches through module-level imports
    imports z3 at module level (the op families import it only inside their ``axioms`` hooks), and importing
    the driver and the CLI's optimize command leaves z3 unloaded."""
    import subprocess
    import sys

    graph = import_graph()
    reached, work = set(), ["unity_eq.driver", "unity_eq.cli.optimize"]
    while work:
        module = work.pop()
        if module in reached:
            continue
        reached.add(module)
        tree = ast.parse(module_files()[module].read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: what importing the module runs
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "z3" or n.startswith("z3.") for n in names), f"{module} imports z3 at module level"
        work += [e.target for e in graph[module] if e.line in _module_level_lines(module)]
    assert "unity_eq.driver.spmd" in reached and "unity_eq.search" in reached  # the scan followed the driver
    code = "import sys, unity_eq.driver, unity_eq.cli.optimize; print('z3' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"


def _module_level_lines(module: str) -> set[int]:
    """The lines of a module's own top-level imports (not those inside functions or ``if TYPE_CHECKING:``)."""
    tree = ast.parse(module_files()[module].read_text(encoding="utf-8"))
    return {node.lineno for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)}


def test_generated_rule_files_are_listed_apart_from_hand_written_ones() -> None:
    """The manifest tells a file a person writes from one a generator rewrites: the op registry's output
    (``python -m unity_eq.ops``, ``ops.schema.generated_files``) is exactly SPEC_GENERATED_RULE_FILES, and no
    hand-written file says it is generated (parallel/elementwise.egg once was listed as hand-written)."""
    from unity_eq.ops.schema import generated_files
    from unity_eq.rulefile.manifest import (
        CORE_RULE_FILES,
        HAND_WRITTEN_RULE_FILES,
        SPEC_GENERATED_RULE_FILES,
        rules_dir,
    )

    root = rules_dir()
    spec = {path.relative_to(root).as_posix() for path in generated_files()} - {"schema.egg"}
    assert spec == set(SPEC_GENERATED_RULE_FILES)
    assert set(CORE_RULE_FILES) == set(HAND_WRITTEN_RULE_FILES) | spec and not spec & set(HAND_WRITTEN_RULE_FILES)
    claims = [n for n in HAND_WRITTEN_RULE_FILES if "GENERATED" in (root / n).read_text(encoding="utf-8")[:400]]
    assert not claims, f"hand-written rule files that say they are generated: {claims}"


def test_no_module_is_over_400_lines() -> None:
    """Issue 22: no module over 400 lines outside generated files. The prover's modules were the documented
    exception (twelve, up to 1,036 lines), and six of the engine's (memory, ir, the torch backend's); all are
    split by meaning now (docs/architecture.md), and this keeps them so."""
    modules = module_files()
    assert sum(m.startswith("unity_eq.verify") for m in modules) > 15  # the scan sees the prover's modules
    long = {m: n for m, p in modules.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, f"modules over 400 lines (split them by meaning): {long}"

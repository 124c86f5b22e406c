"""Collectives as plug-ins (issue 22, item 2): each kind is one module of ``unity_eq.collectives`` and the engine
dispatches through the registry, so a new kind touches its module, its rule file and a test.

The counts below are read from the source (``ast`` for Python, the rule text for ``.egg``), not remembered:
``python tests/test_collectives.py [CHECKOUT]`` prints them for any checkout (docs/architecture.md quotes the
figures of the commit before the plug-ins and of today's code).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from unity_eq.collectives import (
    ALL_GATHER,
    BY_RECORD_KIND,
    COLLECTIVES,
    RUNTIME_FIELDS,
    TERMS,
    CollectiveStep,
    torch_op,
)
from unity_eq.errors import RuntimeBackendError
from unity_eq.planfile import STEP_RECORDS, CollectiveRecord, CollectiveStepRecord
from unity_eq.runtime.collectives import (
    Board,
    LocalCommunicator,
    all_to_all_pieces,
    gather_pieces,
    reduce_scatter_pieces,
    run_collective,
    sum_pieces,
)

ROOT = Path(__file__).resolve().parents[1]

#: What names each plannable kind in code: its e-graph term, plan step, step record, record kind and runtime
#: kind (the same table holds for the checkout before the plug-ins, which had no registry to ask).
KIND_NAMES: dict[str, frozenset[str]] = {
    "partition": frozenset({"Partition", "Slice", "PartitionStepRecord", "partition"}),
    "all_gather": frozenset({"Combine", "AllGather", "CombineStepRecord", "combine", "all_gather"}),
    "replicate": frozenset({"Replicate", "Replicated", "ReplicateStepRecord", "replicate"}),
    "all_reduce": frozenset({"Reduce", "AllReduce", "ReduceStepRecord", "reduce", "all_reduce"}),
}

#: the folders of the engine and the prover (tests, benchmarks and docs are not where a kind is handled)
SOURCE_DIRS = ("unity_eq", "verify", "frontends")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _exported(tree: ast.AST) -> set[int]:
    """The string constants of ``__all__`` (a re-export is not a place that handles a kind)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            found.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return found


def python_names(path: Path) -> set[str]:
    """The names a module uses in code: identifiers, attribute names, whole string constants, and constructors
    declared in rule text it holds (``(Combine T i64 String)``). Docstrings, comments, imports and ``__all__``
    are not uses: a module that only re-exports a kind's names need not change for a new kind."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree) | _exported(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            names.add(node.value)
            names.update(re.findall(r"\((\w+) T[ )]", node.value))
    return names


def egg_names(path: Path) -> set[str]:
    """The symbols of a rule file outside comments."""
    text = "\n".join(line.split(";", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_-]*", text))


def source_files(root: Path) -> dict[str, set[str]]:
    """Every engine/prover module and rule file of a checkout with the names it uses; the collectives package
    itself is left out (it is where a kind lives, not a place that names it)."""
    files: dict[str, set[str]] = {}
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("unity_eq/collectives/") or rel.startswith(("unity_eq/verify/", "unity_eq/rules/")):
                continue
            files[rel] = python_names(path)
    for path in sorted((root / "rules").rglob("*.egg")):
        files[path.relative_to(root).as_posix()] = egg_names(path)
    return files


def naming(root: Path, kind: str) -> list[str]:
    """The files that name ``kind`` (any of its names) in code."""
    return [rel for rel, names in source_files(root).items() if names & KIND_NAMES[kind]]


def enumerating(root: Path) -> list[str]:
    """The files that name every plannable kind: a list or a dispatch over the kinds, where a new kind would
    have to be added by hand. Rule files are left out: rules use the constructors, a new kind adds its own."""
    return [
        rel
        for rel, names in source_files(root).items()
        if rel.endswith(".py") and all(names & kind_names for kind_names in KIND_NAMES.values())
    ]


#: The files that still enumerate the kinds, and why a new kind is added there by hand.
ENUMERATING = {
    "unity_eq/ops/schema.py": "declares the constructors in rules/schema.egg (it imports no collectives: ops "
    "-> collectives -> cost -> ops would be a package cycle)",
    # the prover's modules, split to stay under 400 lines (issue 22): one module became two, not a new list
    "verify/_case.py": "the prover's semantics of each parallel constructor's pieces (its placements are in "
    "_placement, its gradients in _gradient, which name three of the four)",
    "verify/_enumerate.py": "the rule enumerator's candidate terms per constructor",
    "verify/_fingerprint.py": "the rule enumerator's placement checks per constructor",
    "unity_eq/planfile/steps.py": "one plan.json step record per kind (planfile is the only code writing plan.json)",
    # The torch backend (issue 23) runs a kind through its torch_op slot, but still matches the step records:
    "unity_eq/train/rank.py": "a weight's partition and replicate steps are folded into the rank's parameter "
    "(its shard) rather than run; only an activation's go through the kind's torch_op",
}


def test_only_the_listed_files_enumerate_the_collective_kinds() -> None:
    """A new kind is added by hand only where the table above says; any other list of the kinds is a copy
    of the registry (dispatch through unity_eq.collectives instead)."""
    assert sorted(enumerating(ROOT)) == sorted(ENUMERATING)


def test_the_reduce_collective_is_named_in_fewer_files_than_before_the_plug_ins() -> None:
    """28 Python files named the reduce collective before the plug-ins (by this count; issue 22 counted 30 by
    grep); the names left are its backends' methods, the prover (its float32 pass, issue 21, among them: it
    must know Reduce sums pieces in floating point), the ``Reduce`` op family's own ``reduce``
    strings, and the enumerating files above (the torch backend's two among them). A new file naming it
    should dispatch through the registry."""
    files = naming(ROOT, "all_reduce")
    python = [f for f in files if f.endswith(".py")]
    # 13: 12 until the rule enumerator was split in two modules (issue 22's 400-line limit) that both name it:
    # _enumerate builds the Reduce candidates, _fingerprint evaluates them
    assert len(python) <= 13, python


def test_the_registry_is_the_schema_and_the_records() -> None:
    """Every kind with a term is a constructor of rules/schema.egg, in registry order, with one integer per dim;
    every kind with a step has a record plan.json can hold, and its step derives from CollectiveStep."""
    schema = (ROOT / "rules" / "schema.egg").read_text(encoding="utf-8")
    parallel = schema[schema.index("; Parallel ops") :]  # the parallel constructors open the T sort's ops
    declared = re.findall(r"^\s+\((\w+) T((?: i64)*) String\)", parallel, flags=re.MULTILINE)[: len(TERMS)]
    assert [name for name, _ in declared] == list(TERMS)
    for name, ints in declared:
        kind = next(k for k in COLLECTIVES if k.term == name)
        assert ints.count("i64") == len(kind.dims)
        assert kind.step is not None and issubclass(kind.step, CollectiveStep)
        assert kind.record_kind is not None
        record = STEP_RECORDS[kind.record_kind]
        assert isinstance(record, type) and issubclass(record, CollectiveStepRecord)
        assert BY_RECORD_KIND[kind.record_kind] is kind
    assert set(RUNTIME_FIELDS) == {k.name for k in COLLECTIVES if k.communicates}


def test_a_step_states_its_kind_placement_change() -> None:
    step = ALL_GATHER.step("out", "src", 2, "x") if ALL_GATHER.step else None  # type: ignore[call-arg]
    assert step is not None and step.dims() == {"dim": 2}
    assert step.kind.states(step.dims()) == ("S(2)", "R")
    assert step.renamed(lambda name: f"{name}.1") == ALL_GATHER.step("out.1", "src.1", 2, "x")  # type: ignore[call-arg]


def _run_everywhere(kind: str, pieces: list[np.ndarray], dims: dict[str, int]) -> list[np.ndarray]:
    """``kind`` as plan.json names it, run by ``run_collective`` on two rank threads of the local backend."""
    board = Board(len(pieces), timeout=30.0)
    group = tuple(range(len(pieces)))
    record = CollectiveRecord(0, kind, "x", (group,), "a", "b", 0, **dims)
    results: list[np.ndarray | None] = [None] * len(pieces)

    def rank(r: int) -> None:
        results[r] = run_collective(LocalCommunicator(r, board), record, pieces[r], group)

    threads = [threading.Thread(target=rank, args=(r,)) for r in group]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result is not None for result in results)
    return [r for r in results if r is not None]


@pytest.mark.parametrize("kind", sorted(RUNTIME_FIELDS))
def test_every_runtime_kind_runs_through_its_plug_in(kind: str) -> None:
    """run_collective has no per-kind code: each kind's op gives the reference semantics on every rank."""
    rng = np.random.default_rng(0)
    pieces = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    dims = {"dim": 1, "split_dim": 0, "concat_dim": 1}
    dims = {name: dims[name] for name in RUNTIME_FIELDS[kind]}
    got = _run_everywhere(kind, pieces, dims)
    for index, result in enumerate(got):
        expected = {
            "all_gather": lambda: gather_pieces(pieces, 1),
            "all_reduce": lambda: sum_pieces(pieces),
            "reduce_scatter": lambda i=index: reduce_scatter_pieces(pieces, i, 1),
            "all_to_all": lambda i=index: all_to_all_pieces(pieces, i, 0, 1),
        }[kind]()
        np.testing.assert_array_equal(result, expected)


def test_the_plannable_kinds_have_torch_ops_and_the_others_say_they_have_none() -> None:
    """The torch backend runs every step a plan can contain through its kind's slot; reduce_scatter and
    all_to_all (no rule makes them yet) have none, and asking for one is one error naming the kind."""
    for name in ("partition", "all_gather", "replicate", "all_reduce"):
        assert callable(torch_op(name)), name
    for name in ("reduce_scatter", "all_to_all"):
        with pytest.raises(RuntimeBackendError, match=name):
            torch_op(name)


def test_importing_the_collectives_does_not_import_torch() -> None:
    """Planning never needs torch: the slots import the autograd functions only when a plan trains."""
    code = "import sys, unity_eq.collectives, unity_eq.plan; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def main(argv: list[str]) -> int:
    """Print the counts for a checkout (default: this one)."""
    root = Path(argv[1]).resolve() if len(argv) > 1 else ROOT
    for kind in KIND_NAMES:
        files = naming(root, kind)
        python = sum(1 for f in files if f.endswith(".py"))
        print(f"{kind:<11} named in {python} Python files and {len(files) - python} rule files")
    found = enumerating(root)
    print(f"{len(found)} Python files name every plannable kind (a new kind is added there by hand):")
    for rel in found:
        print(f"  {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

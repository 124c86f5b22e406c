"""Encode a Graph into egglog, saturate it with the rule files in an isolated worker, read the result back.

Three steps, each a plain function over plain data:

* :func:`encode` turns a :class:`~unity_eq.ir.Graph` and a :class:`~unity_eq.ir.Mesh` into egglog program
  text: one ``let`` per tensor (so shared subterms stay shared), the global shape, dtype and replicated
  placement of every original tensor, the mesh axes, and the literal-keyed facts the guards need
  (``reshape-map``, ``reduce-map``).
* :func:`saturate` runs the schema, analyses, rule files and the program in a separate process with a memory
  limit, in explicit iterations with node, iteration and wall-clock limits, and returns the serialized
  e-graph. egglog has no timeout or interrupt inside one call and aborts the process when an allocation
  fails, so the worker isolates the CLI from a runaway run.
* :func:`parse_serialized` turns the serialized JSON into :class:`EGraphData`: e-classes of tensors with
  their shape, dtype and per-axis placement, and e-nodes with decoded literal arguments — what the
  extractor reads.

Saturation reports why it stopped (:class:`StopReason`), as egg's runner does.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from unity_eq.errors import RuleError, SaturationError
from unity_eq.files import die_with_parent, owned_tempdir, raise_if_stopped
from unity_eq.ir import Graph, Mesh, Node
from unity_eq.ops.registry import spec_for
from unity_eq.ops.spec import OpSpec
from unity_eq.rulesets import RuleFile
from unity_eq.typed_nodes import guard_facts, typed_values, used_outputs

__all__ = [
    "EClass",
    "EGraphData",
    "ENode",
    "Encoding",
    "Limits",
    "SaturationResult",
    "StopReason",
    "encode",
    "parse_serialized",
    "saturate",
]

MAX_RANK = 8


# ----------------------------------------------------------------------------------------------------------
# Encoding


@dataclass
class Encoding:
    """The egglog program for one graph on one mesh, and what is needed to read the result back."""

    program: str
    mesh: Mesh
    tensor_ids: dict[str, int]  # ONNX tensor name -> id in (Tensor id)
    opaque_nodes: dict[str, Node]  # Opaque key -> the IR node
    typed_nodes: int
    opaque_count: int

    @property
    def tensor_names(self) -> dict[int, str]:
        return {i: name for name, i in self.tensor_ids.items()}


def _egg_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _egg_float(value: float) -> str:
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def _egg_ivec(values: tuple[int, ...] | list[int]) -> str:
    return f"(vec-of {' '.join(str(int(v)) for v in values)})" if len(values) else "(vec-empty)"


def _egg_fact(fact: tuple[Any, ...]) -> str:
    """A family's guard fact (name, then ints and int tuples) as egglog text."""
    name, *args = fact
    return f"({name} {' '.join(_egg_ivec(a) if isinstance(a, tuple | list) else str(int(a)) for a in args)})"


class _ProgramWriter:
    """Accumulates the egglog text of an encoding; one `let` per tensor keeps the DAG shared."""

    def __init__(self, graph: Graph, mesh: Mesh) -> None:
        self.graph = graph
        self.mesh = mesh
        self.lines: list[str] = []
        self.vars: dict[str, str] = {}
        self.tensor_ids: dict[str, int] = {}
        self.facts: set[str] = set()
        self._weight_ranks: dict[str, int] | None = None

    def var(self, name: str | None) -> str:
        """The term of a tensor; an initializer becomes a Weight leaf the first time it is read."""
        if name is None:
            return "(NoneT)"
        if name not in self.vars and name in self.graph.initializers:
            self.define(name, f"(Weight {_egg_string(name)})")
            rank = self.weight_rank(name)
            self.lines.append(f"(merge-operand {self.vars[name]} {rank} {rank})")
        return self.vars[name]

    def weight_rank(self, name: str) -> int:
        """The initializer's position in the model: the order in which merges concatenate weights."""
        if self._weight_ranks is None:
            self._weight_ranks = {w: i for i, w in enumerate(self.graph.initializers)}
        return self._weight_ranks[name]

    def define(self, name: str, term: str) -> None:
        """Name a tensor ``(Tensor id)`` and state its shape, dtype and (replicated) placement.

        Naming by one constructor keeps the DAG shared without egglog globals, which cost a table each.
        """
        ident = len(self.tensor_ids)
        var = f"(Tensor {ident})"
        self.tensor_ids[name] = ident
        self.vars[name] = var
        ttype = self.graph.types[name]
        self.lines.append(f"(union {var} {term})")
        self.lines.append(f"(set (shape {var}) {_egg_ivec(ttype.shape)})")
        self.lines.append(f"(set (dtype {var}) {_egg_string(ttype.dtype)})")
        for axis in self.mesh.axes:
            self.lines.append(f"(placed {var} {_egg_string(axis)} (R))")

    def fact(self, text: str) -> None:
        if text not in self.facts:
            self.facts.add(text)
            self.lines.append(text)

    def list_term(self, names: list[str | None]) -> str:
        term = "(TNil)"
        for name in reversed(names):
            term = f"(TCons {self.var(name)} {term})"
        return term


def _typed_term(w: _ProgramWriter, spec: OpSpec, values: dict[str, Any], index: int | None) -> str:
    parts = [spec.name]
    for arg in spec.args:
        value = values[arg.name]
        if arg.sort == "T":
            parts.append(w.var(value))
        elif arg.sort == "TList":
            parts.append(w.list_term(value))
        elif arg.sort == "IVec":
            parts.append(_egg_ivec(tuple(value or ())))
        elif arg.sort == "i64":
            parts.append(str(int(value)))
        elif arg.sort == "f64":
            parts.append(_egg_float(value))
        else:
            parts.append(_egg_string(str(value)))
    if spec.multi_output:
        parts.append(str(index))
    return "(" + " ".join(parts) + ")"


def encode(graph: Graph, mesh: Mesh) -> Encoding:
    """Write the egglog program for ``graph`` on ``mesh`` (no rules: those come from the rule files)."""
    w = _ProgramWriter(graph, mesh)
    for axis, size in zip(mesh.axes, mesh.sizes, strict=True):
        w.lines.append(f"(mesh-axis {_egg_string(axis)} {size})")
    _axes_facts(w, mesh)
    max_rank = max((t.rank for t in graph.types.values()), default=1)
    for d in range(max(max_rank, 1)):
        w.lines.append(f"(dim-range {d})")
    for name in graph.inputs:
        w.define(name, f"(Input {_egg_string(name)})")
    used = used_outputs(graph)
    opaque: dict[str, Node] = {}
    typed = 0
    for node in graph.nodes:
        spec = spec_for(node.op_type, node.domain)
        values = typed_values(node, graph, spec, used) if spec is not None else None
        if spec is not None and values is not None:
            typed += 1
            for fact in guard_facts(node, graph, spec, values):
                w.fact(_egg_fact(fact))
            for index, out in enumerate(node.outputs):
                if out and out in used and (index == 0 or spec.multi_output):
                    w.define(out, _typed_term(w, spec, values, index))
        else:
            opaque[node.name] = node
            args = w.list_term([name or None for name in node.inputs])
            for index, out in enumerate(node.outputs):
                if out and out in used:
                    op, key = _egg_string(node.op_type), _egg_string(node.name)
                    w.define(out, f"(Opaque {op} {key} {args} {index})")
    for name in graph.outputs:
        w.var(name)
    return Encoding("\n".join(w.lines) + "\n", mesh, w.tensor_ids, opaque, typed, len(opaque))


def _axes_facts(w: _ProgramWriter, mesh: Mesh) -> None:
    axes = [_egg_string(a) for a in mesh.axes]
    for i, axis in enumerate(axes):
        others = axes[:i] + axes[i + 1 :]
        if len(axes) > 3:
            raise ValueError("meshes of more than 3 axes are not supported")
        w.lines.append(f"(axes-{len(axes)} {' '.join([axis, *others])})")


# ----------------------------------------------------------------------------------------------------------
# Saturation in a worker process


class StopReason(Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"


@dataclass(frozen=True)
class Limits:
    """Bounds on one saturation. Defaults never hang on the models we ship; flags change them."""

    max_iterations: int = 12
    max_nodes: int = 200_000
    time_limit_s: float = 120.0
    memory_limit_gib: float = 6.0
    algebra_iterations: int = 3


@dataclass
class SaturationResult:
    serialized: dict[str, Any]
    stop_reason: StopReason
    iterations: int
    enodes: int
    seconds: float
    history: list[tuple[int, int, float]] = field(default_factory=list)  # (iteration, e-nodes, seconds)
    worker_peak_mib: float = 0.0


ProgressFn = Callable[[str, int, int, float], None]


def _tensor_table_sizes(egraph: Any) -> int:
    import egglog.bindings as bindings

    (out,) = egraph.run_program(*egraph.parse_program("(print-size)"))
    if isinstance(out, bindings.PrintAllFunctionsSize):
        sizes = out.sizes
    else:  # pragma: no cover - older bindings print text
        return 0
    skip = {"Tensor"}
    return sum(n for name, n in sizes if name[:1].isupper() and name not in skip)


def _run_phase(egraph: Any, ruleset: str) -> bool:
    (out,) = egraph.run_program(*egraph.parse_program(f"(run-schedule (run {ruleset}))"))
    updated = bool(out.report.updated)
    (out,) = egraph.run_program(*egraph.parse_program("(run-schedule (saturate (run analysis) (run expand)))"))
    return updated


def _worker_main(job_path: str) -> int:
    """Body of the worker process (``python -m unity_eq.egraph JOB``).

    Progress and the final status go to stdout as JSON lines; the serialized e-graph goes to a file.
    """
    job = json.loads(Path(job_path).read_text())
    die_with_parent(job.get("parent"))  # a killed unity-eq leaves no engine running on
    limits = Limits(**job["limits"])

    def send(*item: Any) -> None:
        print(json.dumps(item), flush=True)

    try:
        _limit_memory(limits.memory_limit_gib)
        import egglog.bindings as bindings

        start = time.monotonic()
        egraph = bindings.EGraph()
        for text, filename in job["files"]:
            try:
                egraph.run_program(*egraph.parse_program(text, filename=filename))
            except bindings.EggSmolError as exc:
                send("rule-error", f"{filename}: {exc}")
                return 0
        _run_chunked(egraph, job["program"])
        egraph.run_program(*egraph.parse_program("(run-schedule (saturate (run analysis) (run expand)))"))
        nodes = _tensor_table_sizes(egraph)
        history = [(0, nodes, time.monotonic() - start)]
        send("progress", "analysis", 0, nodes, history[-1][2])
        reason, iteration = _run_phases(egraph, limits, start, history, send)
        Path(job["out"]).write_text(egraph.serialize([]).to_json())
        send("done", reason.value, iteration, history[-1][1], time.monotonic() - start, history, peak_rss_mib())
    except MemoryError:
        send("error", "out of memory")
    except Exception as exc:  # reported to the parent, which raises SaturationError with it
        send("error", f"{type(exc).__name__}: {exc}")
    return 0


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB.

    Linux's VmHWM belongs to the address space and starts afresh at exec; ``ru_maxrss`` survives
    fork + exec, so a subprocess would report its parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024
    except ImportError:  # pragma: no cover - Windows
        return 0.0


def _run_chunked(egraph: Any, program: str, lines_per_call: int = 200) -> None:
    """Run a long program a few hundred commands at a time.

    egglog 13.2 keeps a copy of the whole source text in every command's span, so one call with N commands
    costs O(N × text): 8.7 GB for densenet121's 7,600 lines. In chunks it is linear.
    """
    lines = program.splitlines()
    for start in range(0, len(lines), lines_per_call):
        chunk = "\n".join(lines[start : start + lines_per_call])
        egraph.run_program(*egraph.parse_program(chunk, filename=f"<encoded model, line {start + 1}>"))


def _run_phases(
    egraph: Any,
    limits: Limits,
    start: float,
    history: list[tuple[int, int, float]],
    send: Callable[..., None],
) -> tuple[StopReason, int]:
    """Bounded algebra iterations, then parallel iterations, re-saturating the analyses after each."""
    iteration = 0
    phases = [("algebra", limits.algebra_iterations), ("parallel", limits.max_iterations)]
    for ruleset, budget in phases:
        for step in range(budget):
            iteration += 1
            updated = _run_phase(egraph, ruleset)
            nodes = _tensor_table_sizes(egraph)
            elapsed = time.monotonic() - start
            history.append((iteration, nodes, elapsed))
            send("progress", ruleset, iteration, nodes, elapsed)
            if not updated:
                break
            if nodes > limits.max_nodes:
                return StopReason.NODE_LIMIT, iteration
            if elapsed > limits.time_limit_s:
                return StopReason.TIME_LIMIT, iteration
            if ruleset == "parallel" and step == budget - 1:
                return StopReason.ITERATION_LIMIT, iteration
    return StopReason.SATURATED, iteration


def _limit_memory(gib: float) -> None:
    if gib <= 0:
        return
    try:
        import resource

        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # pragma: no cover - platforms without RLIMIT_AS
        pass


def saturate(
    rule_files: list[RuleFile],
    encoding: Encoding,
    limits: Limits | None = None,
    progress: ProgressFn | None = None,
) -> SaturationResult:
    """Run equality saturation for ``encoding`` in a worker process and return the serialized e-graph."""
    limits = limits or Limits()
    with owned_tempdir() as tmp:  # removed on SIGTERM too; a killed run's is swept by the next run
        out_path = Path(tmp) / "egraph.json"
        job = {
            "files": [(f.text, f.display) for f in rule_files],
            "program": encoding.program,
            "limits": dataclasses.asdict(limits),
            "out": str(out_path),
            "parent": os.getpid(),
        }
        job_path = str(Path(tmp) / "job.json")
        Path(job_path).write_text(json.dumps(job))
        message, last, exitcode = _supervise(job_path, limits, progress)
        if message is None:
            raise SaturationError(_crash_message(exitcode, limits, last))
        kind = message[0]
        if kind == "rule-error":
            raise RuleError(f"rule file failed to load: {message[1]}")
        if kind == "error":
            if any(word in message[1].lower() for word in _MEMORY_WORDS):
                raise SaturationError(_killed_message("ran out of memory", limits, last))
            raise SaturationError(f"e-graph engine failed: {message[1]}")
        _, reason, iterations, nodes, seconds, history, peak_mib = message
        serialized = json.loads(out_path.read_text())
    history_rows = [(int(i), int(n), float(t)) for i, n, t in history]
    return SaturationResult(serialized, StopReason(reason), iterations, nodes, seconds, history_rows, peak_mib)


def _supervise(
    job_path: str, limits: Limits, progress: ProgressFn | None
) -> tuple[list[Any] | None, tuple[str, int, int, float] | None, int | None]:
    """Run the worker, relay its progress, kill it past the hard deadline. Returns (final message, last
    progress, exit code)."""
    cmd = [sys.executable, "-m", "unity_eq.egraph", job_path]
    raise_if_stopped()  # a signal arrived while this mesh waited for a worker thread
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + limits.time_limit_s * 1.5 + 60
    last: tuple[str, int, int, float] | None = None
    message = None
    assert proc.stdout is not None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while message is None:
                raise_if_stopped()  # SIGTERM/SIGINT: the finally below kills the engine
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    proc.kill()
                    raise SaturationError(_killed_message("did not finish in time", limits, last))
                if not sel.select(min(remaining, 1.0)):
                    continue
                line = proc.stdout.readline()
                if not line:
                    break  # the worker exited
                item = json.loads(line)
                if item[0] == "progress":
                    last = (item[1], item[2], item[3], item[4])
                    if progress:
                        progress(*item[1:])
                else:
                    message = item
    finally:
        if proc.poll() is None and message is None:
            proc.kill()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
        proc.stdout.close()
    return message, last, proc.returncode


_MEMORY_WORDS = ("memory", "failed to map segment", "cannot allocate")


def _where(last: tuple[str, int, int, float] | None) -> str:
    if last is None:
        return "before the first iteration"
    phase, iteration, nodes, secs = last
    return f"after {phase} iteration {iteration} ({nodes} e-nodes, {secs:.1f} s)"


def _crash_message(exitcode: int | None, limits: Limits, last: tuple[str, int, int, float] | None) -> str:
    return _killed_message(f"stopped unexpectedly (exit code {exitcode})", limits, last)


def _killed_message(what: str, limits: Limits, last: tuple[str, int, int, float] | None) -> str:
    return (
        f"e-graph saturation {what} {_where(last)}; memory limit {limits.memory_limit_gib:g} GiB. "
        "Lower `--max-nodes` or `--max-iterations`, or raise `--memory-limit`."
    )


# ----------------------------------------------------------------------------------------------------------
# Reading the serialized e-graph


@dataclass(frozen=True)
class ClassRef:
    """An argument that is another e-class (a tensor or a tensor list)."""

    id: str


@dataclass(frozen=True)
class ENode:
    id: str
    op: str
    eclass: str
    args: tuple[Any, ...]  # ClassRef | int | float | str | tuple[int, ...]

    @functools.cached_property
    def children(self) -> tuple[str, ...]:
        return tuple(a.id for a in self.args if isinstance(a, ClassRef))


@dataclass
class EClass:
    id: str
    sort: str  # "T" or "TList"
    nodes: list[ENode] = field(default_factory=list)
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    placement: dict[str, list[str]] = field(default_factory=dict)  # axis -> states found (one if valid)

    def state(self, axis: str) -> str:
        states = self.placement.get(axis, [])
        return states[0] if len(states) == 1 else "?"


@dataclass
class EGraphData:
    """The saturated e-graph as plain data: what every extractor reads."""

    classes: dict[str, EClass]
    tensor_class: dict[int, str]  # tensor id (Encoding.tensor_ids, the `Tensor` names) -> e-class

    @property
    def enode_count(self) -> int:
        return sum(len(c.nodes) for c in self.classes.values())

    def conflicts(self) -> list[str]:
        """E-classes holding two placements on one axis: a rule broke the one-placement invariant."""
        found = []
        for cls in self.classes.values():
            for axis, states in cls.placement.items():
                if len(states) > 1:
                    ops = sorted({n.op for n in cls.nodes})
                    found.append(f"e-class {cls.id} ({', '.join(ops)}) is {' and '.join(states)} on axis {axis}")
        return found


def _literal(node: dict[str, Any], sort: str, nodes: dict[str, dict[str, Any]]) -> Any:
    op = node["op"]
    if sort == "i64":
        return int(op)
    if sort == "f64":
        return float(op)
    if sort == "String":
        return json.loads(op) if op.startswith('"') else op
    if sort == "IVec":
        return tuple(int(nodes[c]["op"]) for c in node["children"])
    return op


def parse_serialized(serialized: dict[str, Any]) -> EGraphData:
    """Decode egglog's JSON serialization into EGraphData."""
    nodes: dict[str, dict[str, Any]] = serialized["nodes"]
    class_sort = {cid: data["type"] for cid, data in serialized["class_data"].items()}
    classes: dict[str, EClass] = {}
    tensor_class: dict[int, str] = {}

    def arg_of(child_id: str) -> Any:
        child = nodes[child_id]
        sort = class_sort.get(child["eclass"], "")
        if sort in ("T", "TList"):
            return ClassRef(child["eclass"])
        return _literal(child, sort, nodes)

    def state_of(pl_id: str) -> str:
        pl = nodes[pl_id]
        return f"S({int(nodes[pl['children'][0]]['op'])})" if pl["op"] == "S" else pl["op"]

    primitive = {n["eclass"]: n for nid, n in nodes.items() if nid.startswith("primitive-")}
    analyses = []
    for node_id, node in nodes.items():
        sort = class_sort.get(node["eclass"], "")
        if sort in ("T", "TList"):
            cls = classes.setdefault(node["eclass"], EClass(node["eclass"], sort))
            if node["op"] == "Tensor":
                tensor_class[int(nodes[node["children"][0]]["op"])] = node["eclass"]
                continue
            args = tuple(arg_of(c) for c in node["children"])
            cls.nodes.append(ENode(node_id, node["op"], node["eclass"], args))
        elif node["op"] in ("shape", "dtype", "placed"):
            analyses.append(node)
    for node in analyses:
        owner = classes.get(nodes[node["children"][0]]["eclass"])
        if owner is None:
            continue
        if node["op"] == "shape":
            owner.shape = tuple(int(nodes[c]["op"]) for c in primitive[node["eclass"]]["children"])
        elif node["op"] == "dtype":
            owner.dtype = json.loads(primitive[node["eclass"]]["op"])
        elif node["op"] == "placed":
            axis = json.loads(nodes[node["children"][1]]["op"])
            state = state_of(node["children"][2])
            states = owner.placement.setdefault(axis, [])
            if state not in states:
                states.append(state)
    return EGraphData(classes, tensor_class)


if __name__ == "__main__":
    raise SystemExit(_worker_main(sys.argv[1]))

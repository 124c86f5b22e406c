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
import math
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.errors import RuleError, SaturationError
from unity_eq.files import die_with_parent, owned_tempdir, raise_if_stopped
from unity_eq.ir import Graph, Mesh, Node
from unity_eq.ops.registry import spec_for
from unity_eq.ops.spec import Family, OpSpec
from unity_eq.rulesets import RuleFile

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


def _const_ints(graph: Graph, name: str) -> tuple[int, ...] | None:
    """The value of a constant integer tensor input, or None when it is not a constant."""
    array = graph.initializers.get(name)
    if array is None or array.dtype.kind not in "iu":
        return None
    return tuple(int(v) for v in np.asarray(array).reshape(-1))


def _used_outputs(graph: Graph) -> set[str]:
    used = set(graph.outputs)
    for node in graph.nodes:
        used.update(name for name in node.inputs if name)
    return used


class _Opaque(Exception):
    """Internal: this node cannot be typed; encode it opaquely."""


def _norm_axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise _Opaque
    return axis + rank if axis < 0 else axis


#: attributes that the normalized constructor already states (Split's sizes come from its output shapes)
_IMPLIED_ATTRS = {"Split": {"num_outputs"}}


def _typed_values(node: Node, graph: Graph, spec: OpSpec, used: set[str]) -> dict[str, Any]:
    """Collect a typed node's arguments by name (inputs and attributes), defaults filled in."""
    if set(node.attrs) - {a.name for a in spec.args if a.kind == "attr"} - _IMPLIED_ATTRS.get(spec.name, set()):
        raise _Opaque  # an attribute we do not model
    if not spec.multi_output and any(out in used for out in node.outputs[1:]):
        raise _Opaque  # a secondary output (MaxPool indices, LayerNorm mean…) is used
    inputs = [a for a in spec.args if a.kind == "input"]
    if inputs and inputs[-1].sort != "TList" and len(node.inputs) > len(inputs):
        raise _Opaque
    values: dict[str, Any] = {}
    for position, arg in enumerate(inputs):
        if arg.sort == "TList":
            values[arg.name] = [name for name in node.inputs if name]
            continue
        name = node.inputs[position] if position < len(node.inputs) else ""
        if arg.sort == "T":
            if not name and not arg.optional:
                raise _Opaque
            values[arg.name] = name or None
        else:  # a constant integer list given as an input
            if not name:
                values[arg.name] = None
                continue
            const = _const_ints(graph, name)
            if const is None:
                raise _Opaque
            values[arg.name] = const
    for arg in spec.args:
        if arg.kind == "attr":
            values[arg.name] = node.attrs.get(arg.name, arg.default)
    return values


def _rank(graph: Graph, name: str | None) -> int:
    return graph.types[name].rank if name else 0


def _normalize(node: Node, graph: Graph, spec: OpSpec, v: dict[str, Any]) -> dict[str, Any]:
    """Make implicit ONNX conventions explicit so that equal computations become equal terms."""
    op = node.op_type
    out_type = graph.types.get(node.outputs[0]) if node.outputs and node.outputs[0] else None
    first = next((a.name for a in spec.args if a.kind == "input"), None)
    in_rank = _rank(graph, v[first]) if first and spec.args[0].sort == "T" else 0
    if op in ("Softmax", "LogSoftmax", "LayerNormalization", "Split", "Gather"):
        v["axis"] = _norm_axis(v["axis"], in_rank)
    elif op == "Flatten":
        v["axis"] = int(v["axis"]) + in_rank if int(v["axis"]) < 0 else int(v["axis"])
    elif op == "Concat":
        v["axis"] = _norm_axis(v["axis"], _rank(graph, v["inputs"][0]))
    elif op == "Transpose":
        v["perm"] = tuple(v["perm"]) if v["perm"] else tuple(reversed(range(in_rank)))
    elif op in ("Reshape", "Expand"):
        if out_type is None:
            raise _Opaque
        v["shape"] = out_type.shape
        if op == "Reshape":
            v["allowzero"] = 0
    elif op == "Squeeze":
        shape = graph.types[v["data"]].shape
        axes = v["axes"] if v["axes"] else tuple(i for i, n in enumerate(shape) if n == 1)
        v["axes"] = tuple(sorted(_norm_axis(a, in_rank) for a in axes))
    elif op == "Unsqueeze":
        out_rank = in_rank + len(v["axes"])
        v["axes"] = tuple(sorted(_norm_axis(a, out_rank) for a in v["axes"]))
    elif op == "Slice":
        v.update(_normalize_slice(graph.types[v["data"]].shape, v))
    elif op.startswith("Reduce"):
        if not v["axes"]:
            if int(v["noop_with_empty_axes"]):
                raise _Opaque
            v["axes"] = tuple(range(in_rank))
        v["axes"] = tuple(sorted(_norm_axis(a, in_rank) for a in v["axes"]))
        v["noop_with_empty_axes"] = 0
    elif op == "Conv":
        w_shape = graph.types[v["W"]].shape
        spatial = len(w_shape) - 2
        v["kernel_shape"] = tuple(v["kernel_shape"]) or tuple(w_shape[2:])
        v.update(_window_defaults(v, spatial))
    elif op in ("MaxPool", "AveragePool"):
        if not v["kernel_shape"]:
            raise _Opaque
        if str(v["auto_pad"]).startswith("SAME") and any(int(d) != 1 for d in v["dilations"] or ()):
            raise _Opaque  # onnxruntime pads for the undilated kernel here, not as ONNX says (verify/_tensor.py)
        v.update(_window_defaults(v, len(v["kernel_shape"])))
    elif op == "BatchNormalization" and int(v["training_mode"]):
        raise _Opaque
    if op == "Split":  # the sizes, whether given, implied by `num_outputs` or by the number of outputs
        v["split"] = tuple(graph.types[o].shape[v["axis"]] for o in node.outputs)
    for arg in spec.args:
        if arg.kind == "attr" and v[arg.name] is None:
            raise _Opaque  # required attribute missing: let onnxruntime complain, not us
        if arg.sort == "f64" and not math.isfinite(float(v[arg.name])):
            raise _Opaque
    return v


def _window_defaults(v: dict[str, Any], spatial: int) -> dict[str, Any]:
    out = {
        "strides": tuple(v["strides"]) or (1,) * spatial,
        "dilations": tuple(v.get("dilations") or ()) or (1,) * spatial,
    }
    if v.get("auto_pad", "NOTSET") == "NOTSET":
        out["pads"] = tuple(v["pads"]) or (0,) * (2 * spatial)
    return out


def _normalize_slice(shape: tuple[int, ...], v: dict[str, Any]) -> dict[str, Any]:
    starts, ends = list(v["starts"]), list(v["ends"])
    axes = list(v["axes"]) if v["axes"] else list(range(len(starts)))
    steps = list(v["steps"]) if v["steps"] else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(s <= 0 for s in steps):
        raise _Opaque
    axes = [_norm_axis(a, len(shape)) for a in axes]
    norm_starts, norm_ends = [], []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        begin, stop, _ = slice(start, end, step).indices(shape[axis])
        norm_starts.append(begin)
        norm_ends.append(max(stop, begin))
    return {
        "starts": tuple(norm_starts),
        "ends": tuple(norm_ends),
        "axes": tuple(axes),
        "steps": tuple(steps),
    }


def reshape_pairs(src: tuple[int, ...], dst: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Dimension pairs (d, d2) where splitting d of ``src`` equals splitting d2 of the reshaped ``dst``.

    They are the dims, both of size > 1, before which the two shapes hold the same number of elements: a
    contiguous chunking of the data at that point is the same chunking in either shape.
    """
    prefix_dst: dict[int, list[int]] = {}
    acc = 1
    for d2, n in enumerate(dst):
        if n > 1:
            prefix_dst.setdefault(acc, []).append(d2)
        acc *= n
    acc = 1
    for d, n in enumerate(src):
        if n > 1:
            for d2 in prefix_dst.get(acc, [])[:1]:
                yield d, d2
        acc *= n


def reduce_pairs(axes: tuple[int, ...], keepdims: int, rank: int) -> Iterator[tuple[int, int]]:
    for d in range(rank):
        if d not in axes:
            yield d, d if keepdims else d - sum(1 for a in axes if a < d)


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


def _guard_facts(w: _ProgramWriter, node: Node, spec: OpSpec, values: dict[str, Any]) -> None:
    """Literal-keyed facts for guards egglog cannot compute itself (see analysis.egg)."""
    graph = w.graph
    if spec.family is Family.RESHAPE:
        src = graph.types[values[spec.args[0].name]].shape
        dst = graph.types[node.outputs[0]].shape
        for d, d2 in reshape_pairs(src, dst):
            w.fact(f"(reshape-map {_egg_ivec(src)} {_egg_ivec(dst)} {d} {d2})")
    elif spec.family is Family.REDUCE:
        rank = graph.types[values["data"]].rank
        axes, keep = tuple(values["axes"]), int(values["keepdims"])
        for d, d2 in reduce_pairs(axes, keep, rank):
            w.fact(f"(reduce-map {_egg_ivec(axes)} {keep} {rank} {d} {d2})")


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
    used = _used_outputs(graph)
    opaque: dict[str, Node] = {}
    typed = 0
    for node in graph.nodes:
        spec = spec_for(node.op_type, node.domain)
        values = None
        if spec is not None:
            try:
                values = _normalize(node, graph, spec, _typed_values(node, graph, spec, used))
            except _Opaque:
                values = None
        if spec is not None and values is not None:
            typed += 1
            _guard_facts(w, node, spec, values)
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

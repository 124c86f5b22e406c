"""Measured op times: ``unity-eq profile`` and the table that ``optimize --profile`` reads.

The extractor prices every e-node of the saturated e-graph with :meth:`CostModel.compute` on the e-node's
*local* (per-device) shapes. ``profile`` measures exactly those: it builds the e-graph of a model on a mesh,
lists every distinct (op, attributes, local input shapes and dtypes) among its compute e-nodes, runs each
as a one-node ONNX model in onnxruntime on this machine's device (warm-up runs, then repeats; the median
is kept) and stores the table as JSON. With ``optimize --profile TABLE`` the cost model uses the measured
time of every op the table has and the roofline for the rest.

The table also holds a calibration of the device (peak FLOP/s from a large MatMul, memory bandwidth from a
large elementwise Add, the per-op floor from a one-element op), which makes it a roofline device spec, so
each entry also records the roofline's prediction and the table reports the median relative error
``|predicted − measured| / measured``. See docs/profile.md for the format.

Lookups are keyed as :meth:`CostModel.compute` is called: (op type, local input shapes, local output
shape, dtype). ``compute`` does not see attributes, so entries that differ only in attributes (a
Transpose's ``perm`` on a square tensor) answer with the slowest of them; :meth:`ProfileTable.lookup` takes
``attrs`` for an exact match. A multi-output op (Split) is one measurement, shared equally by the e-nodes
of its outputs, as the extractor sums them.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from unity_eq.cost import CostModel, OpInstance, op_flops
from unity_eq.egraph import EGraphData, Encoding, ENode, Limits, encode, parse_serialized, saturate
from unity_eq.errors import OptionError
from unity_eq.extract.build import typed_attrs
from unity_eq.extract.pricing import LEAVES, PARALLEL_OPS, enode_instance, list_members, local_shape, source_kinds
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import DeviceSpec, LinkSpec, Machine, default_machine
from unity_eq.ops.registry import OPS
from unity_eq.profile_table import PROFILE_FORMAT_VERSION, Calibration, ProfileTable, frozen_value, jsonable
from unity_eq.runtime.devices import DeviceChoice, available_cores, choose_device, make_session
from unity_eq.version import __version__

OPSET = 18


Progress = Callable[[str], None]


@dataclass(frozen=True)
class InputSpec:
    """One ONNX input of a measured op. ``kind``: ``activation`` (fed each run), ``weight`` (an initializer,
    as in a device model), ``constant`` (an integer list of the op, e.g. Reshape's shape), ``absent``."""

    shape: tuple[int, ...]
    dtype: str
    kind: str
    value: tuple[int, ...] | None = None  # constants, and small integer weights

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "kind": self.kind}
        if self.value is not None:
            out["value"] = list(self.value)
        return out


@dataclass(frozen=True)
class ProfiledOp:
    """One distinct op of the e-graph on local shapes: what is run (an ONNX node and its inputs), and
    ``priced``, the cost model's view of it, built as extraction builds it."""

    op: str
    domain: str
    attrs: tuple[tuple[str, Any], ...]  # sorted (name, value); lists as tuples
    inputs: tuple[InputSpec, ...]
    outputs: int  # outputs of the ONNX node
    output_index: int
    output_dtypes: tuple[str, ...]
    priced: OpInstance

    @property
    def in_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every input's local shape (an instance is only made when all are known)."""
        shapes = tuple(s for s in self.priced.in_shapes if s is not None)
        assert len(shapes) == len(self.priced.in_shapes)
        return shapes

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.priced.out_shape

    @property
    def dtype(self) -> str:
        return self.priced.dtype

    @property
    def run_key(self) -> tuple[Any, ...]:
        """Instances with the same run key are one measurement (the outputs of one multi-output node)."""
        return (self.op, self.domain, self.attrs, self.inputs, self.outputs)


def _itemsize(dtype: str | None) -> int:
    return 0 if dtype in (None, "", "none") else int(np.dtype(dtype).itemsize)


def _weight_value(cid: str, data: EGraphData, graph: Graph, shape: tuple[int, ...]) -> np.ndarray | None:
    """The values of a weight class (its first local chunk), found through Partition/Replicate chains."""
    seen: set[str] = set()
    while cid not in seen:
        seen.add(cid)
        cls = data.classes[cid]
        leaf = next((n for n in cls.nodes if n.op == "Weight"), None)
        if leaf is not None:
            array = graph.initializers.get(str(leaf.args[0]))
            if array is None or array.ndim != len(shape) or any(a < s for a, s in zip(array.shape, shape, strict=True)):
                return None
            return np.array(array[tuple(slice(0, s) for s in shape)], order="C")  # keeps a scalar 0-d
        step = next((n for n in cls.nodes if n.op in ("Partition", "Replicate")), None)
        if step is None:
            return None
        cid = step.args[0].id
    return None


def _tensor_input(
    cid: str, data: EGraphData, graph: Graph, locals_: Mapping[str, tuple[int, ...] | None], kinds: Mapping[str, str]
) -> tuple[InputSpec, np.ndarray | None]:
    cls = data.classes[cid]
    shape = locals_[cid] or ()
    dtype = cls.dtype or "float32"
    if any(n.op == "NoneT" for n in cls.nodes):
        return InputSpec((), "", "absent"), None
    if kinds.get(cid) == "weight":
        value = _weight_value(cid, data, graph, shape)
        ints = None
        if value is not None and value.dtype.kind in "iu" and value.size <= 64:
            ints = tuple(int(v) for v in value.reshape(-1))  # small integer weights (shapes, indices) matter
        return InputSpec(shape, dtype, "weight", ints), value
    return InputSpec(shape, dtype, "activation"), None


def _node_instance(
    node: ENode,
    out_cid: str,
    data: EGraphData,
    encoding: Encoding,
    graph: Graph,
    locals_: Mapping[str, tuple[int, ...] | None],
    kinds: Mapping[str, str],
    values: dict[ProfiledOp, dict[int, np.ndarray]],
) -> ProfiledOp | None:
    """The instance of a compute e-node (None when its local shapes are unknown: the cost model prices it ∞)."""
    cls = data.classes[out_cid]
    priced = enode_instance(node, cls, data, locals_)
    if priced is None:
        return None
    out_shape, dtype = priced.out_shape, priced.dtype

    inputs: list[InputSpec] = []
    arrays: dict[int, np.ndarray] = {}

    def add_tensor(cid: str) -> None:
        spec, value = _tensor_input(cid, data, graph, locals_, kinds)
        if value is not None:
            arrays[len(inputs)] = value
        inputs.append(spec)

    if node.op == "Opaque":
        op_type, key, args, index = node.args
        ir_node = encoding.opaque_nodes[str(key)]
        for member in list_members(args.id, data) or []:
            add_tensor(member)
        attrs = {k: frozen_value(v) for k, v in ir_node.attrs.items()}
        domain, outputs, output_index = ir_node.domain, len(ir_node.outputs), int(index)
        out_dtypes = tuple(graph.types[o].dtype if o in graph.types else dtype for o in ir_node.outputs)
        op = str(op_type)
    else:
        spec = OPS[node.op]
        for arg, value in zip(spec.args, node.args, strict=False):
            if arg.kind != "input":
                continue
            if arg.sort == "T":
                add_tensor(value.id)
            elif arg.sort == "TList":
                for member in list_members(value.id, data) or []:
                    add_tensor(member)
            elif not value and arg.optional:
                inputs.append(InputSpec((), "", "absent"))
            else:
                ints = tuple(out_shape) if node.op in ("Reshape", "Expand") and arg.name == "shape" else tuple(value)
                inputs.append(InputSpec((len(ints),), "int64", "constant", ints))
        while inputs and inputs[-1].kind == "absent":
            inputs.pop()
        attrs = {k: frozen_value(v) for k, v in typed_attrs(spec, list(node.args)).items()}
        op, domain = node.op, ""
        output_index = int(node.args[-1]) if spec.multi_output else 0
        sizes = spec.output_sizes_in(node.args)
        outputs = len(sizes) if sizes else output_index + 1
        out_dtypes = (dtype,) * outputs
    instance = ProfiledOp(
        op, domain, tuple(sorted(attrs.items())), tuple(inputs), outputs, output_index, out_dtypes, priced
    )
    values.setdefault(instance, arrays)
    return instance


def op_instances(
    data: EGraphData, encoding: Encoding, graph: Graph, mesh: Mesh
) -> tuple[list[ProfiledOp], dict[ProfiledOp, dict[int, np.ndarray]]]:
    """Every distinct compute op of the e-graph on its local shapes (sorted), and known weight values."""
    model = CostModel(default_machine(mesh.size), mesh)  # only its mesh matters for local shapes
    locals_ = {cid: local_shape(c, model) for cid, c in data.classes.items() if c.sort == "T"}
    kinds = source_kinds(data)
    values: dict[ProfiledOp, dict[int, np.ndarray]] = {}
    found: set[ProfiledOp] = set()
    for cls in data.classes.values():
        if cls.sort != "T":
            continue
        for node in cls.nodes:
            if node.op in LEAVES or node.op in PARALLEL_OPS or node.op == "Tensor":
                continue
            instance = _node_instance(node, cls.id, data, encoding, graph, locals_, kinds, values)
            if instance is not None:
                found.add(instance)
    ordered = sorted(found, key=lambda i: (i.op, i.in_shapes, i.out_shape, repr(i.attrs), i.output_index))
    return ordered, values


def _onnx_dtype(dtype: str) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def _single_op_model(
    instance: ProfiledOp,
    weights: Mapping[int, np.ndarray],
    rng: np.random.Generator,
    opsets: Mapping[str, int] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model running ``instance``, and the feeds of its activation inputs."""
    names: list[str] = []
    graph_inputs, initializers = [], []
    feeds: dict[str, np.ndarray] = {}
    for position, spec in enumerate(instance.inputs):
        name = f"in{position}"
        if spec.kind == "absent":
            names.append("")
            continue
        names.append(name)
        if spec.kind == "constant":
            initializers.append(numpy_helper.from_array(np.asarray(spec.value, dtype=np.int64), name))
            continue
        value = weights.get(position)
        if value is None:
            value = _random(spec.shape, spec.dtype, rng)
        if spec.kind == "weight":
            initializers.append(numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _onnx_dtype(spec.dtype), list(spec.shape)))
            feeds[name] = value
    outputs = [f"out{k}" for k in range(instance.outputs)]
    attrs: dict[str, Any] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in instance.attrs}
    attrs = {k: v for k, v in attrs.items() if not (isinstance(v, list) and not v)}
    node = helper.make_node(instance.op, names, outputs, domain=instance.domain or None, **attrs)
    graph = helper.make_graph(
        [node],
        f"profile.{instance.op}",
        graph_inputs,
        [
            helper.make_tensor_value_info(o, _onnx_dtype(d), None)
            for o, d in zip(outputs, instance.output_dtypes, strict=True)
        ],
        initializer=initializers,
    )
    versions = {"": OPSET, **(opsets or {})}
    if instance.domain and instance.domain not in ("", "ai.onnx"):
        versions.setdefault(instance.domain, 1)
    imports = [helper.make_opsetid(domain, version) for domain, version in versions.items()]
    return helper.make_model(graph, opset_imports=imports, ir_version=9), feeds


def _random(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.standard_normal(tuple(shape)).astype(dtype)
    if kind == "b":
        return rng.random(tuple(shape)) < 0.5
    return np.zeros(tuple(shape), dtype=dtype)  # integers index things: 0 is always in range


@dataclass
class Timing:
    median_s: float
    min_s: float
    repeats: int


class _Runner:
    """Runs one-node models on the chosen device with I/O bound to it, and times them."""

    def __init__(self, choice: DeviceChoice, threads: int, warmup: int, repeats: int, min_time: float) -> None:
        self.choice = choice
        self.threads = threads
        self.warmup = warmup
        self.repeats = repeats
        self.min_time = min_time
        self.device = ("cuda", int(dict(choice.providers[0][1])["device_id"])) if choice.cuda else ("cpu", 0)

    def session(self, model: onnx.ModelProto) -> Any:
        return make_session(model, self.choice.providers, self.threads)

    def time(self, session: Any, feeds: Mapping[str, np.ndarray]) -> Timing:
        import onnxruntime as ort

        kind, device_id = self.device
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, kind, device_id))
        for out in session.get_outputs():
            binding.bind_output(out.name, kind, device_id)
        for _ in range(self.warmup):
            session.run_with_iobinding(binding)
        samples: list[float] = []
        started = time.perf_counter()
        # at least `repeats` runs, more while the total is under `min_time` (short ops are noisy), at most 20×
        while len(samples) < self.repeats or (
            time.perf_counter() - started < self.min_time and len(samples) < 20 * self.repeats
        ):
            begin = time.perf_counter()
            session.run_with_iobinding(binding)
            samples.append(time.perf_counter() - begin)
        return Timing(statistics.median(samples), min(samples), len(samples))


def _measure(runner: _Runner, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Timing:
    return runner.time(runner.session(model), feeds)


def _matmul_model(n: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    b = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])],
        "calibrate.matmul",
        [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [n, n])],
        initializer=[b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    return model, {"A": rng.standard_normal((n, n)).astype(np.float32)}


def _add_model(elements: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    one = numpy_helper.from_array(np.ones((1,), np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "one"], ["Y"])],
        "calibrate.add",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [elements])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [elements])],
        initializer=[one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    return model, {"X": np.random.default_rng(0).standard_normal(elements).astype(np.float32)}


def describe_local_device(choice: DeviceChoice, threads: int) -> str:
    if choice.cuda:
        return f"{choice.description} (onnxruntime CUDAExecutionProvider)"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {threads} thread{'s' if threads != 1 else ''}"


def _memory_bytes(choice: DeviceChoice) -> float:
    if choice.cuda:
        return 0.0  # unknown here; machine files carry it
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0.0


def calibrate(runner: _Runner, progress: Progress | None = None) -> Calibration:
    """Peak FLOP/s (MatMul n×n×n, n doubled from 1024 while it runs under 20 ms), bandwidth (Add of a scalar
    to 2^24 floats, doubled while under 5 ms) and the per-op floor (Add on one element).

    Peaks are what the device achieves at best, so each uses the fastest of its runs (a run slowed by
    another process says nothing about the device); op entries keep the median.
    """
    say = progress or (lambda _m: None)
    details: dict[str, Any] = {}
    n = 1024
    while True:
        model, feeds = _matmul_model(n)
        timing = _measure(runner, model, feeds)
        if timing.min_s >= 0.02 or n >= 8192:
            break
        n *= 2
    peak = 2.0 * n**3 / timing.min_s
    details["matmul"] = {"n": n, "min_s": timing.min_s, "median_s": timing.median_s, "repeats": timing.repeats}
    say(f"calibration: MatMul {n}×{n}×{n} in {timing.min_s * 1e3:.2f} ms → {peak / 1e9:.1f} GFLOP/s")
    elements = 1 << 24
    while True:
        model, feeds = _add_model(elements)
        timing = _measure(runner, model, feeds)
        if timing.min_s >= 0.005 or elements >= 1 << 28:
            break
        elements *= 2
    bandwidth = 2.0 * 4 * elements / timing.min_s
    details["add"] = {
        "elements": elements,
        "min_s": timing.min_s,
        "median_s": timing.median_s,
        "repeats": timing.repeats,
    }
    say(f"calibration: Add over {elements * 4 >> 20} MiB in {timing.min_s * 1e3:.2f} ms → {bandwidth / 1e9:.1f} GB/s")
    model, feeds = _add_model(1)
    floor = _measure(runner, model, feeds)
    details["floor"] = {"min_s": floor.min_s, "median_s": floor.median_s, "repeats": floor.repeats}
    say(f"calibration: one-element Add in {floor.median_s * 1e6:.1f} µs (per-op floor, median)")
    device = describe_local_device(runner.choice, runner.threads)
    return Calibration(device, peak, bandwidth, floor.median_s, _memory_bytes(runner.choice), details)


def calibrated_machine(calibration: Calibration, devices: int = 1) -> Machine:
    """``devices`` copies of the calibrated device as a :class:`Machine` (efficiency 1: the calibration
    measured what is achievable), so that the roofline can be compared with measurements."""
    spec = DeviceSpec(
        calibration.device,
        {"float32": calibration.peak_flops},
        calibration.memory_bandwidth,
        calibration.memory_bytes,
    )
    link = LinkSpec(bandwidth=calibration.memory_bandwidth, latency=calibration.launch_overhead_s)
    return Machine(
        f"{devices}x calibrated {calibration.device}",
        (spec,) * devices,
        (0,) * devices,
        link,
        launch_overhead=calibration.launch_overhead_s,
        efficiency=1.0,
    )


def _mesh_devices(text: str) -> int:
    import re

    sizes = [int(v) for v in re.findall(r"(?:=|^|[x×*,])\s*(\d+)", text.strip())]
    if not sizes:
        raise OptionError(f"`--mesh`: expected sizes like `2x4` or `dp=2,tp=4`, got {text!r}")
    return math.prod(sizes)


def _relative_errors(entries: Iterable[Mapping[str, Any]], field_name: str) -> list[float]:
    return [
        abs(float(e[field_name]) - float(e["median_s"])) / float(e["median_s"])
        for e in entries
        if e.get(field_name) is not None and float(e["median_s"]) > 0
    ]


def _summary(entries: Sequence[Mapping[str, Any]], has_machine: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"entries": len(entries)}
    errors = _relative_errors(entries, "roofline_s")
    if errors:
        out["median_relative_error"] = statistics.median(errors)
        out["within_2x"] = sum(1 for e in entries if 0.5 <= float(e["roofline_s"]) / float(e["median_s"]) <= 2.0) / len(
            entries
        )
        by_op: dict[str, list[float]] = {}
        for e, err in zip(entries, errors, strict=True):
            by_op.setdefault(e["op"], []).append(err)
        out["median_relative_error_by_op"] = {op: statistics.median(v) for op, v in sorted(by_op.items())}
    if has_machine:
        machine_errors = _relative_errors(entries, "machine_roofline_s")
        if machine_errors:
            out["machine_median_relative_error"] = statistics.median(machine_errors)
    return out


def profile_model(
    model: str | Path | Graph,
    *,
    devices: int | None = None,
    mesh: str | Mesh | None = None,
    machine: Machine | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    device: str = "cpu",
    threads: int | None = None,
    warmup: int = 3,
    repeats: int = 10,
    min_time: float = 0.05,
    limits: Limits | None = None,
    rule_files: Sequence[Path] | None = None,
    progress: Progress | None = None,
) -> ProfileTable:
    """Measure every distinct compute op of ``model``'s e-graph on a mesh, on this machine's device.

    The mesh is ``mesh`` (``2x2``, ``dp=2,tp=2`` or a :class:`Mesh`) over ``devices`` devices, or over the
    devices of ``machine``; the machine's roofline is also compared with the measurements
    (``machine_roofline_s``). ``device`` is ``cpu``, ``cuda`` or ``auto`` (CUDA device 0 when usable).
    """
    from unity_eq.rulesets import load_rule_files

    say = progress or (lambda _m: None)
    if warmup < 0 or repeats < 1 or min_time < 0:
        raise OptionError("`--warmup` must be ≥ 0, `--repeats` ≥ 1 and `--min-time` ≥ 0.")
    if machine is not None:
        count = machine.device_count
        if devices is not None and devices != machine.device_count:
            raise OptionError(
                f"`--devices` {devices} disagrees with the machine {machine.name!r} ({machine.device_count} devices)."
            )
    elif devices is not None:
        count = devices
    elif isinstance(mesh, Mesh):
        count = mesh.size
    elif mesh is not None:
        count = _mesh_devices(mesh)
    else:
        raise OptionError("say which mesh to profile for: pass `--devices N` or `--mesh 2x2`.")
    if count < 1:
        raise OptionError(f"`--devices` must be at least 1, got {count}.")
    chosen_mesh = mesh if isinstance(mesh, Mesh) else Mesh.parse(mesh or str(count), count)

    started = time.perf_counter()
    if isinstance(model, Graph):
        graph = model
    else:
        from unity_eq.frontends.onnx import load_onnx

        say(f"loading {model}")
        graph = load_onnx(model, input_shapes)
    encoding = encode(graph, chosen_mesh)
    saturation = saturate(load_rule_files(list(rule_files) if rule_files is not None else None), encoding, limits)
    data = parse_serialized(saturation.serialized)
    instances, weights = op_instances(data, encoding, graph, chosen_mesh)
    runs: dict[tuple[Any, ...], list[ProfiledOp]] = {}
    for instance in instances:
        runs.setdefault(instance.run_key, []).append(instance)
    say(
        f"e-graph of {graph.name} on mesh {chosen_mesh}: {data.enode_count} e-nodes, "
        f"{len(instances)} distinct ops on local shapes ({len(runs)} to run)"
    )

    choice = choose_device(device, 0)
    if choice.note:
        say(choice.note)
    n_threads = threads or available_cores()
    runner = _Runner(choice, n_threads, warmup, repeats, min_time)
    calibration = calibrate(runner, say)
    predictor = CostModel(calibrated_machine(calibration, chosen_mesh.size), chosen_mesh)
    machine_model = CostModel(machine, chosen_mesh) if machine is not None else None

    rng = np.random.default_rng(0)
    opsets = {"": graph.opset, **graph.extra_opsets}
    entries: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for k, (_, group) in enumerate(runs.items()):
        first = group[0]
        try:
            model_proto, feeds = _single_op_model(first, weights.get(first, {}), rng, opsets)
            timing = _measure(runner, model_proto, feeds)
        except Exception as exc:  # onnxruntime refuses the op on this device: the roofline prices it
            reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            skipped.append({"op": first.op, "inputs": [s.to_json() for s in first.inputs], "reason": reason})
            continue
        if (k + 1) % 25 == 0:
            say(f"measured {k + 1} of {len(runs)} ops")
        for instance in group:
            entries.append(_entry(instance, timing, predictor, machine_model))
    provider = "CUDAExecutionProvider" if choice.cuda else "CPUExecutionProvider"
    import onnxruntime as ort

    meta: dict[str, Any] = {
        "kind": "unity-eq-profile",
        "format_version": PROFILE_FORMAT_VERSION,
        "unity_eq_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": {
            "description": calibration.device,
            "provider": provider,
            "device_id": runner.device[1],
            "onnxruntime": ort.__version__,
            "threads": n_threads,
            "host": platform.node(),
            "note": choice.note,
        },
        "model": {"name": graph.name, "source": str(model) if not isinstance(model, Graph) else graph.name},
        "mesh": {"axes": list(chosen_mesh.axes), "sizes": list(chosen_mesh.sizes)},
        "machine": machine.describe() if machine is not None else None,
        "settings": {"warmup": warmup, "repeats": repeats, "min_time_s": min_time, "statistic": "median"},
        "calibration": calibration.to_json(),
        "summary": _summary(entries, machine is not None),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return ProfileTable(meta, entries, skipped)


def _entry(
    instance: ProfiledOp, timing: Timing, predictor: CostModel, machine_model: CostModel | None
) -> dict[str, Any]:
    share = 1.0 / instance.outputs  # the outputs of one node split its time (the extractor sums them)

    def roofline(model: CostModel) -> float:
        return model.compute(instance.priced).compute

    entry: dict[str, Any] = {
        "op": instance.op,
        "domain": instance.domain,
        "attrs": {k: jsonable(v) for k, v in instance.attrs},
        "inputs": [s.to_json() for s in instance.inputs],
        "outputs": instance.outputs,
        "output_index": instance.output_index,
        "key": {
            "in_shapes": [list(s) for s in instance.in_shapes],
            "out_shape": list(instance.out_shape),
            "dtype": instance.dtype,
        },
        "flops": op_flops(instance.op, instance.in_shapes, instance.out_shape) * share,
        "bytes": (instance.priced.in_bytes + instance.priced.out_bytes) * share,
        "median_s": timing.median_s * share,
        "min_s": timing.min_s * share,
        "repeats": timing.repeats,
        "roofline_s": roofline(predictor),
    }
    if machine_model is not None:
        entry["machine_roofline_s"] = roofline(machine_model)
    return entry

"""``check`` compares every byte it can: each device file's weight slices, bit for bit, with the slices the plan
says they are of the source model's weights.

Outputs compared within a tolerance miss a weight edited below it, or one a ``ReduceMax`` hides. Lowering
names, in every device file's metadata (``unity_eq.weights``), the plan tensor each weight initializer holds;
here every rank's constants are made again from the source model by the plan's own steps (plan.json: a weight
loaded, its rank's chunk sliced, data movement folded by the lowering's own fold), and each initializer must
equal its tensor's value byte for byte. Any other initializer must be one of lowering's int64 literals
(shapes, slice bounds). A difference is a :class:`~unity_eq.errors.CheckFailed` naming the device file, the
weight and the first differing index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from unity_eq.collectives import BY_RECORD_KIND
from unity_eq.errors import CheckFailed, PlanError
from unity_eq.planfile import (
    CollectiveStepRecord,
    ComputeStepRecord,
    ExplainRecord,
    WeightStepRecord,
    read_explain_record,
)
from unity_eq.runtime.plandir import PlanDir
from unity_eq.weightfile import META_WEIGHTS, Deferred, release_pages, value_of

__all__ = ["check_weight_bytes"]

Value = np.ndarray | Deferred


class _RankConstants:
    """One rank's constants, made from the source weights as lowering makes them (the attributes
    ``DeviceGraphBuilder._fold`` reads: ``consts``, ``alias``, ``local_shape``)."""

    def __init__(self, record: ExplainRecord, rank: int, weights: Mapping[str, Any]) -> None:
        self.record = record
        self.coords = record.mesh.ranks[rank].coords
        self.weights = weights
        self.consts: dict[str, Value] = {}
        self.alias: dict[str, str] = {}
        self.origin: dict[str, str] = {}  # constant tensor -> the weight(s) it is made of (for messages)

    def local_shape(self, tid: str) -> tuple[int, ...]:
        return tuple(self.record.tensors[tid].local_shape)

    def _move(self, out: str, src: str, axis: str, step: CollectiveStepRecord) -> None:
        """A collective over weights as lowering writes it (its kind's ``lowering``): an alias or a slice; a
        communicating collective never has weight operands in a device file."""
        lowering = BY_RECORD_KIND[step.KIND].lowering
        if lowering == "alias":
            self.alias[out] = self.alias.get(src, src)
        elif lowering == "slice":
            src = self.alias.get(src, src)
            if src in self.consts:
                i = self.record.mesh.axes.index(axis)
                (dim,) = (int(getattr(step, name)) for name in BY_RECORD_KIND[step.KIND].dims)  # a slice's one dim
                self.consts[out] = _piece(self.consts[src], dim, self.coords[i], self.record.mesh.sizes[i])
                self.origin[out] = self.origin[src]

    def run(self, where: Path) -> None:
        from unity_eq.lower.builder import DeviceGraphBuilder
        from unity_eq.plan import Compute, Const

        for step in self.record.steps:
            match step:
                case WeightStepRecord(out=out, name=name):
                    if name not in self.weights:
                        raise PlanError(f"{where}: the plan loads weight {name!r}, which the model does not have.")
                    self.consts[out], self.origin[out] = self.weights[name], name
                case CollectiveStepRecord(out=out, src=src, axis=axis):
                    self._move(out, src, axis, step)
                case ComputeStepRecord():
                    inputs = tuple(Const(tuple(i)) if isinstance(i, tuple | list) else i for i in step.inputs)
                    compute = Compute(step.outputs, step.op, inputs, dict(step.attrs), step.domain)
                    if DeviceGraphBuilder._fold(self, compute):  # type: ignore[arg-type]  # the fields it reads
                        made = "+".join(
                            dict.fromkeys(
                                self.origin.get(self.alias.get(i, i), "?") for i in step.inputs if isinstance(i, str)
                            )
                        )
                        self.origin.update({o: made for o in step.outputs if o})


def _piece(value: Value, dim: int, index: int, parts: int) -> np.ndarray:
    """Chunk ``index`` of ``parts`` along ``dim`` (a view of a mapped weight: nothing is read yet)."""
    array = value_of(value)
    size = array.shape[dim] // parts
    where = [slice(None)] * array.ndim
    where[dim] = slice(index * size, (index + 1) * size)
    return array[tuple(where)]


def check_weight_bytes(model_path: str | Path, plans: Sequence[PlanDir], shapes: Mapping[str, Sequence[int]]) -> int:
    """Compare every device file's weights of ``plans`` (one SPMD plan, or a pipeline's stages) with the source
    model loaded at ``shapes`` (the shapes the plans were made for); returns how many initializers matched."""
    from unity_eq.frontends.onnx import load_onnx

    graph = load_onnx(model_path, {name: tuple(shape) for name, shape in shapes.items()})
    compared = 0
    for plan in plans:
        record = read_explain_record(plan.path / "plan.json")
        for rank in range(plan.world_size):
            constants = _RankConstants(record, rank, graph.initializers)
            constants.run(plan.path / "plan.json")
            compared += _compare_rank(plan.model_path(rank), constants)
    return compared


def _compare_rank(path: Path, constants: _RankConstants) -> int:
    model = onnx.load(str(path), load_external_data=False)  # weights in its data file are mapped, not read
    props = {p.key: p.value for p in model.metadata_props}
    if META_WEIGHTS not in props:
        raise PlanError(
            f"{path}: names none of its weights (an older unity-eq wrote it), so `check` cannot compare them with "
            "the model's. Re-run `unity-eq optimize`."
        )
    named: dict[str, str] = json.loads(props[META_WEIGHTS])
    present = {t.name for t in model.graph.initializer}
    for name in named:
        if name not in present:
            raise CheckFailed(f"{path}: weight {name!r} is missing from the device file. Re-run `unity-eq optimize`.")
    for tensor in model.graph.initializer:
        actual = _array(path, tensor)
        tid = named.get(tensor.name)
        if tid is None:
            if actual.dtype != np.int64 or actual.ndim > 1:
                raise CheckFailed(
                    f"{path}: initializer {tensor.name!r} ({actual.dtype}{list(actual.shape)}) is neither a slice of "
                    "the model's weights nor a literal lowering writes; the device file was altered. Re-run "
                    "`unity-eq optimize`."
                )
            continue
        key = constants.alias.get(tid, tid)
        if key not in constants.consts:
            raise CheckFailed(f"{path}: weight {tensor.name!r} claims plan tensor {tid!r}, which holds no weight.")
        expected = value_of(constants.consts[key])
        _compare(path, tensor.name, constants.origin.get(key, "?"), expected, actual)
        release_pages(expected)
        release_pages(actual)
    return len(named)


def _array(path: Path, tensor: onnx.TensorProto) -> np.ndarray:
    """An initializer's value: a read-only mapping of the device's data file when it lives there (the
    bytes onnxruntime reads; never the whole rank in memory), else the value stored in the model."""
    from onnx import external_data_helper

    if not external_data_helper.uses_external_data(tensor):
        return numpy_helper.to_array(tensor)
    info = external_data_helper.ExternalDataInfo(tensor)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    shape = tuple(int(d) for d in tensor.dims)
    if Path(info.location).name != info.location or not (path.parent / info.location).is_file():
        raise PlanError(f"{path}: weight {tensor.name!r} is stored in {info.location!r}, not beside it.")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype)
    mapped = np.memmap(path.parent / info.location, dtype=dtype, mode="r", offset=int(info.offset or 0), shape=(count,))
    return mapped.reshape(shape)


def _compare(path: Path, name: str, origin: str, expected: np.ndarray, actual: np.ndarray) -> None:
    """Equal bit for bit (a NaN is equal to itself, -0.0 is not 0.0): or a CheckFailed at the first difference."""
    expected = np.asarray(expected)
    of = f"weight {name!r} (of the model's {origin!r})"
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        raise CheckFailed(
            f"{path}: {of} is {actual.dtype}{list(actual.shape)}, the model's slice is "
            f"{expected.dtype}{list(expected.shape)}. Re-run `unity-eq optimize`."
        )
    if expected.size == 0:
        return
    if expected.dtype.kind in "OSU":
        differ = (expected != actual).reshape(-1)
    else:
        size = expected.dtype.itemsize
        a = np.ascontiguousarray(expected).reshape(-1).view(np.uint8).reshape(-1, size)
        b = np.ascontiguousarray(actual).reshape(-1).view(np.uint8).reshape(-1, size)
        differ = (a != b).any(axis=1)
    if not differ.any():
        return
    first = int(np.argmax(differ))
    index = [int(i) for i in np.unravel_index(first, expected.shape)]
    raise CheckFailed(
        f"{path}: {of} differs from the model's slice at index {index} ({int(differ.sum())} element(s) differ): "
        f"expected {expected.reshape(-1)[first]}, got {actual.reshape(-1)[first]}. The device file was altered "
        "or lowered wrong; restore it or re-run `unity-eq optimize`."
    )

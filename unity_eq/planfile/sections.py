"""The sections of plan.json that describe the plan: the model, the mesh and its ranks, the machine and how the
mesh's axes sit on it, the predicted cost, and the tensors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from unity_eq.dtypes import as_dtype
from unity_eq.planfile.codec import Record


@dataclass(frozen=True, kw_only=True)
class WeightRecord(Record):
    """``weights.<name>``: where a weight the plan loads comes from (``ir.WeightOrigin``). ``how``:
    ``parameter`` (the source model's own parameter, ``sources`` its name), ``folded`` (computed by the
    frontend from ``sources`` through ``ops``: a transpose or cast of a weight it made an initializer), or
    ``constant`` (nothing trainable flows in: a mask, a shape, a scalar; no gradient, no optimizer state).
    ``merged``: the source parameters the user's ``--parameters`` map says it holds (the exporter merged
    them: ``train`` refuses it). ``ambiguous``: without a map, why this weight may be several source
    parameters merged into one (a torch dynamo export merges parameters with equal values): ``train``
    refuses it unless told it is one (``--shared``)."""

    trainable: bool
    how: str
    sources: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    merged: tuple[str, ...] = ()  # the source parameters it holds, merged by the exporter (``--parameters``)
    ambiguous: str = ""


@dataclass(frozen=True, kw_only=True)
class ModelInputRecord(Record):
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, kw_only=True)
class ModelOutputRecord(Record):
    shape: tuple[int, ...]
    dtype: str
    tensor: str  # the plan's tensor that holds it


@dataclass(frozen=True, kw_only=True)
class ModelRecord(Record):
    """``model``: the source model's name, file and fingerprint, its inputs and outputs."""

    name: str
    source: str
    fingerprint: str | None = None  # of what the model computes (frontends.onnx.model_fingerprint)
    inputs: Mapping[str, ModelInputRecord]
    outputs: Mapping[str, ModelOutputRecord]


@dataclass(frozen=True, kw_only=True)
class RankRecord(Record):
    """One rank of the mesh: its coordinates and the machine device (kind, node) it runs on."""

    rank: int
    coords: tuple[int, ...]
    device: int
    device_kind: str
    node: int


@dataclass(frozen=True, kw_only=True)
class MeshRecord(Record):
    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    devices: tuple[int, ...]  # the machine device of each rank
    ranks: tuple[RankRecord, ...]

    @property
    def label(self) -> str:
        """``x=2,y=4``"""
        return ",".join(f"{a}={n}" for a, n in zip(self.axes, self.sizes, strict=True))


@dataclass(frozen=True, kw_only=True)
class DeviceKindRecord(Record):
    peak_flops: Mapping[str, float]  # FLOP/s per dtype
    memory_bandwidth_bytes_s: float
    memory_bytes: float


@dataclass(frozen=True, kw_only=True)
class LinkRecord(Record):
    name: str
    bandwidth_bytes_s: float | None  # null: unlimited
    latency_s: float


@dataclass(frozen=True, kw_only=True)
class NodeRecord(Record):
    """One node of the machine: its devices, the link between them and its network to the other nodes."""

    name: str
    devices: tuple[int, ...]
    link: LinkRecord
    network: LinkRecord | None
    nics: int


@dataclass(frozen=True, kw_only=True)
class AxisRecord(Record):
    """How a mesh axis sits on the machine (unity_eq.cost.axis_info)."""

    name: str
    size: int
    spans_nodes: bool
    nodes: int
    ranks_per_node: int
    link: str
    bandwidth_gbs: float | None


@dataclass(frozen=True, kw_only=True)
class MachineRecord(Record):
    """``machine``: device kinds, nodes and links (SI units: FLOP/s, bytes/s, s), and the mesh's axes on it."""

    name: str
    source: str
    devices: int
    nodes: int
    device_kinds: Mapping[str, DeviceKindRecord]
    node_list: tuple[NodeRecord, ...]
    launch_overhead_s: float
    efficiency: float
    memory_fraction: float
    mesh_axes: tuple[AxisRecord, ...]


@dataclass(frozen=True, kw_only=True)
class AxisTrafficRecord(Record):
    """Communication on one mesh axis by phase (unity_eq.report)."""

    forward_s: float
    backward_s: float
    gradient_s: float


@dataclass(frozen=True, kw_only=True)
class OverlapRecord(Record):
    """Training: how much of the gradient all-reduce traffic can hide behind the backward pass."""

    gradient_all_reduce_s: float
    overlappable_s: float
    exposed_s: float
    backward_s: float
    note: str


@dataclass(frozen=True, kw_only=True)
class CostRecord(Record):
    """``cost``: the predicted time per step, split into compute and communication (by axis and phase)."""

    total_s: float
    compute_s: float
    communication_s: float
    communication_by_axis: Mapping[str, AxisTrafficRecord] | None = None
    overlap: OverlapRecord | None = None


@dataclass(frozen=True, kw_only=True)
class TensorRecord(Record):
    """One tensor of the plan: global shape, placement per mesh axis, each rank's piece."""

    shape: tuple[int, ...]
    dtype: str
    placement: tuple[str, ...]
    local_shape: tuple[int, ...]
    source: str | None = None  # the source model's tensor it equals
    value: str | None = None  # the source model's tensor whose value it holds, sharded or not

    @property
    def local_bytes(self) -> int:
        """Bytes of each rank's piece (what a collective of it moves per rank)."""
        return math.prod(self.local_shape) * as_dtype(self.dtype).itemsize

"""Machines and the cost model: what a plan step costs on a given machine.

Placement transitions, the collective each one is, and its price on a mesh axis of n devices for a tensor of
S bytes (the gathered / reduced size), with link bandwidth B and latency α (NCCL's ring factors):

=====================  ==================  ===========================  =====================================
parallel op            transition          forward                      backward (objective ``training``)
=====================  ==================  ===========================  =====================================
Partition(x, d, ax)    R → S(d)            free for weights and inputs, all-gather of the gradient when x is an
                                           a local copy otherwise       activation: (n−1)α + (n−1)/n·S/B
Combine(x, d, ax)      S(d) → R            all-gather (n−1)α + (n−1)/n·S/B   free (a slice)
Replicate(x, ax)       R → R (for S work)  free                         all-reduce of the gradient, unless x is
                                                                        a model input: 2(n−1)α + 2(n−1)/n·S/B
Reduce(x, ax)          P → R               all-reduce 2(n−1)α + 2(n−1)/n·S/B   free
=====================  ==================  ===========================  =====================================

Compute is a roofline per op on its local (per-device) shapes: ``max(FLOPs / peak, bytes / bandwidth)`` plus
a launch floor; training charges the backward pass as twice the forward compute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unity_eq.ir import Mesh
from unity_eq.ops import Family, spec_for

if TYPE_CHECKING:
    from unity_eq.profile import ProfileTable

__all__ = [
    "Cost",
    "CostModel",
    "DeviceSpec",
    "LinkSpec",
    "Machine",
    "default_machine",
]


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator. ``flops`` maps a numpy dtype name to peak FLOP/s; bandwidths are bytes/s."""

    name: str
    flops: Mapping[str, float]
    memory_bandwidth: float
    memory: float

    def peak(self, dtype: str) -> float:
        if dtype in self.flops:
            return self.flops[dtype]
        return self.flops.get("float32", min(self.flops.values()))


@dataclass(frozen=True)
class LinkSpec:
    """A link class: per-device bandwidth in bytes/s (one direction) and latency in seconds."""

    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Machine:
    """Devices grouped into nodes, with one link class inside nodes and one between them."""

    name: str
    devices: tuple[DeviceSpec, ...]
    node_of: tuple[int, ...]
    intra_link: LinkSpec
    inter_link: LinkSpec | None = None
    launch_overhead: float = 5e-6
    efficiency: float = 0.75  # achievable fraction of peak FLOP/s and bandwidth

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def node_count(self) -> int:
        return len(set(self.node_of))

    def describe(self) -> str:
        kinds = sorted({d.name for d in self.devices})
        return f"{self.name}: {self.device_count} × {'/'.join(kinds)} in {self.node_count} node(s)"


A100_80G = DeviceSpec(
    "A100-80G",
    {"float32": 19.5e12, "float16": 312e12, "bfloat16": 312e12, "int8": 624e12},
    2.0e12,
    80 * 2**30,
)
NVLINK3 = LinkSpec(bandwidth=300e9, latency=5e-6)


def default_machine(devices: int) -> Machine:
    """``--devices N``: N A100-80G GPUs in one node on NVLink."""
    return Machine(f"{devices}xA100-80G", (A100_80G,) * devices, (0,) * devices, NVLINK3)


@dataclass(frozen=True)
class Cost:
    """Seconds of compute and of communication; extraction minimizes their sum."""

    compute: float = 0.0
    comm: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.comm

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.compute + other.compute, self.comm + other.comm)


ZERO = Cost()


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def op_flops(op_type: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Floating-point operations of one op on the given (local) shapes."""
    spec = spec_for(op_type)
    out = _numel(out_shape)
    family = spec.family if spec else None
    if family is Family.MATMUL and in_shapes[0]:
        return 2.0 * out * in_shapes[0][-1]
    if family is Family.GEMM and in_shapes[0]:
        return 2.0 * out * _numel(in_shapes[0]) / max(out_shape[0], 1)  # K = |A| / M, either layout
    if family is Family.CONV and in_shapes[1]:
        return 2.0 * out * _numel(in_shapes[1][1:])
    if family in (Family.SOFTMAX, Family.LAYERNORM, Family.BATCHNORM, Family.LRN):
        return 5.0 * out
    if family is Family.POOL and in_shapes[0]:
        return float(max(out, _numel(in_shapes[0])))
    if family is Family.REDUCE and in_shapes[0]:
        return float(_numel(in_shapes[0]))
    if family in (Family.RESHAPE, Family.TRANSPOSE, Family.CONCAT, Family.SPLIT, Family.SLICE, Family.EXPAND):
        return 0.0
    return float(out)


@dataclass
class CostModel:
    """Prices steps for one machine, mesh and objective (``inference`` or ``training``)."""

    machine: Machine
    mesh: Mesh
    objective: str = "inference"
    profile: ProfileTable | None = None  # measured op times (`unity-eq profile`); the roofline prices the rest
    _axis_links: dict[str, tuple[LinkSpec, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.objective not in ("inference", "training"):
            raise ValueError(f"objective: expected inference or training, got {self.objective!r}")

    # --- devices -----------------------------------------------------------------------------------------
    def _device(self) -> DeviceSpec:
        """The slowest device of the mesh: SPMD steps wait for it."""
        devices = [self.machine.devices[d] for d in self.mesh.devices]
        return min(devices, key=lambda d: (d.peak("float32"), d.memory_bandwidth))

    def compute(
        self,
        op_type: str,
        in_shapes: Sequence[Sequence[int] | None],
        in_bytes: float,
        out_shape: Sequence[int],
        out_bytes: float,
        dtype: str,
    ) -> Cost:
        """Roofline time of one op on its local shapes, plus the launch floor (or its measured time)."""
        if self.profile is not None:
            measured = self.profile.lookup(op_type, in_shapes, out_shape, dtype)
            if measured is not None:
                return Cost(compute=measured * (3.0 if self.objective == "training" else 1.0))
        device = self._device()
        eff = self.machine.efficiency
        flops = op_flops(op_type, in_shapes, out_shape)
        seconds = max(flops / (device.peak(dtype) * eff), (in_bytes + out_bytes) / (device.memory_bandwidth * eff))
        seconds += self.machine.launch_overhead
        if self.objective == "training":
            seconds *= 3.0  # forward + backward (≈ 2× forward)
        return Cost(compute=seconds)

    def local_copy(self, nbytes: float) -> Cost:
        device = self._device()
        return Cost(
            compute=2 * nbytes / (device.memory_bandwidth * self.machine.efficiency) + self.machine.launch_overhead
        )

    # --- links -------------------------------------------------------------------------------------------
    def axis_link(self, axis: str) -> LinkSpec:
        """The link a collective on ``axis`` runs over: inter-node if any group spans nodes."""
        spans_nodes = any(
            len({self.machine.node_of[self.mesh.devices[r]] for r in group}) > 1 for group in self.mesh.groups(axis)
        )
        if spans_nodes and self.machine.inter_link is not None:
            return self.machine.inter_link
        return self.machine.intra_link

    def all_gather(self, axis: str, nbytes: float) -> float:
        n = self.mesh.axis_size(axis)
        if n == 1:
            return 0.0
        link = self.axis_link(axis)
        return (n - 1) * link.latency + (n - 1) / n * nbytes / link.bandwidth

    def all_reduce(self, axis: str, nbytes: float) -> float:
        n = self.mesh.axis_size(axis)
        if n == 1:
            return 0.0
        link = self.axis_link(axis)
        return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth

    # --- parallel ops ------------------------------------------------------------------------------------
    def partition(self, axis: str, local_in_bytes: float, source: str) -> Cost:
        """Partition: free for weights and inputs (sliced when loaded); a local copy of an activation."""
        if source in ("weight", "input"):
            return ZERO
        cost = self.local_copy(local_in_bytes / self.mesh.axis_size(axis))
        if self.objective == "training":
            cost = cost + Cost(comm=self.all_gather(axis, local_in_bytes))
        return cost

    def combine(self, axis: str, local_out_bytes: float) -> Cost:
        return Cost(comm=self.all_gather(axis, local_out_bytes))

    def reduce(self, axis: str, local_bytes: float) -> Cost:
        return Cost(comm=self.all_reduce(axis, local_bytes))

    def replicate(self, axis: str, local_bytes: float, source: str) -> Cost:
        if self.objective == "training" and source != "input":
            return Cost(comm=self.all_reduce(axis, local_bytes))
        return ZERO

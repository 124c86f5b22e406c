"""The cost model: :class:`CostModel` prices an op's compute (roofline, or a profile table's measurement), the
collectives of a mesh axis (its slowest group) and the parallel ops, for one machine, mesh and objective."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unity_eq.cost.collectives import AlphaBeta, ring_all_gather, ring_all_reduce, ring_all_to_all, ring_send
from unity_eq.cost.records import INFERENCE, Cost, Objective, OpInstance
from unity_eq.cost.topology import MeshTopology
from unity_eq.ir import machine_order
from unity_eq.machine import DeviceSpec, GroupTopology
from unity_eq.ops.registry import family_for

if TYPE_CHECKING:
    from unity_eq.profile_table import ProfileTable


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def op_flops(op_type: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Floating-point operations of one op on the given (local) shapes."""
    family = family_for(op_type)
    if family is not None:
        return family.flops(op_type, in_shapes, out_shape)
    return float(_numel(out_shape))  # an opaque op: one operation per output element


@dataclass
class CostModel(MeshTopology):
    """Prices steps for one machine, mesh and objective (``inference`` or ``training``)."""

    # machine and mesh: MeshTopology's fields (and its caches, keyword-only)
    objective: Objective = INFERENCE  # a name (``"training"``) is accepted and parsed
    profile: ProfileTable | None = None  # measured op times (`unity-eq profile`); the roofline prices the rest
    # Data-parallel frameworks all-reduce gradients in buckets (PyTorch DDP: 25 MiB), so a gradient of S bytes
    # pays min(1, S / bucket) of a collective's latency; 0 disables bucketing.
    gradient_bucket_bytes: float = 25 * 2**20
    _slowest: DeviceSpec | None = field(default=None, repr=False)
    _capacity: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.objective = Objective.parse(self.objective)
        devices = self.mesh.devices
        highest = len(devices) - 1 if devices is machine_order(len(devices)) else max(devices, default=-1)
        if highest >= self.machine.device_count:
            raise ValueError(f"mesh uses device {highest}; the machine has {self.machine.device_count}")

    # --- devices -----------------------------------------------------------------------------------------
    def _device(self) -> DeviceSpec:
        """The slowest device of the mesh: SPMD steps wait for it (found once: every op's price asks)."""
        if self._slowest is None:
            kinds = {id(self.machine.devices[d]): self.machine.devices[d] for d in self.mesh.devices}
            # min() keeps the first of equal keys: scan the distinct kinds in the mesh's device order
            self._slowest = min(kinds.values(), key=lambda d: (d.peak("float32"), d.memory_bandwidth))
        return self._slowest

    def memory_capacity(self) -> float:
        """Usable bytes per device: the smallest device of the mesh (every rank holds the same shapes)."""
        if self._capacity is None:
            kinds = {id(self.machine.devices[d]): d for d in self.mesh.devices}
            self._capacity = min(self.machine.usable_memory(d) for d in kinds.values())
        return self._capacity

    def compute(self, op: OpInstance) -> Cost:
        """Roofline time of one op on its local shapes plus the launch floor (×3 for training), or its
        measured time when a profile table has the op.

        A node with several ``outputs`` (Split) is one kernel, but extraction prices one e-node per output:
        each carries 1/outputs of the launch and of the input read (and its own output's write), so the outputs
        of one Split sum to one kernel, as profile tables share a measured node among its outputs."""
        op_type, in_shapes, in_bytes, out_shape = op.op_type, op.in_shapes, op.in_bytes, op.out_shape
        out_bytes, dtype, outputs = op.out_bytes, op.dtype, op.outputs
        if self.profile is not None:
            measured = self.profile.lookup(op_type, in_shapes, out_shape, dtype)
            if measured is not None:
                return Cost(compute=measured * self.objective.compute_factor)
        device = self._device()
        eff = self.machine.efficiency
        flops = op_flops(op_type, in_shapes, out_shape)
        moved = in_bytes / outputs + out_bytes
        seconds = max(flops / (device.peak(dtype) * eff), moved / (device.memory_bandwidth * eff))
        seconds += self.machine.launch_overhead / outputs
        if self.objective.training:
            seconds *= self.objective.compute_factor  # forward + backward (≈ 2× forward)
        return Cost(compute=seconds)

    def local_copy(self, nbytes: float) -> Cost:
        device = self._device()
        seconds = 2 * nbytes / (device.memory_bandwidth * self.machine.efficiency)
        return Cost(compute=seconds + self.machine.launch_overhead)

    # --- collectives (seconds; the slowest group of the axis) -------------------------------------------
    def _worst(self, axis: str, fn: Callable[[GroupTopology, float], AlphaBeta], nbytes: float) -> AlphaBeta:
        return max((fn(t, nbytes) for t in self.group_topologies(axis)), key=lambda ab: ab.seconds, default=AlphaBeta())

    def all_reduce(self, axis: str, nbytes: float) -> float:
        """All-reduce of ``nbytes`` per rank over ``axis``."""
        return self._worst(axis, ring_all_reduce, nbytes).seconds

    def all_gather(self, axis: str, nbytes: float) -> float:
        """All-gather producing ``nbytes`` per rank (each contributes nbytes / n)."""
        return self._worst(axis, ring_all_gather, nbytes).seconds

    def reduce_scatter(self, axis: str, nbytes: float) -> float:
        """Reduce-scatter of ``nbytes`` per rank into nbytes / n each (the all-gather's mirror image)."""
        return self._worst(axis, ring_all_gather, nbytes).seconds

    def all_to_all(self, axis: str, nbytes: float) -> float:
        """All-to-all: each rank holds ``nbytes`` and sends (n−1)/n of it, nbytes / n to every other rank."""
        return self._worst(axis, ring_all_to_all, nbytes).seconds

    def send(self, axis: str, nbytes: float) -> float:
        """Point-to-point transfer of ``nbytes`` between two ranks of ``axis`` (over the network if it spans)."""
        return self._worst(axis, ring_send, nbytes).seconds

    def gradient_all_reduce(self, axis: str, nbytes: float) -> float:
        """A weight gradient's all-reduce: its bandwidth term and its share of a bucket's latency."""
        ab = self._worst(axis, ring_all_reduce, nbytes)
        share = 1.0 if self.gradient_bucket_bytes <= 0 else min(1.0, nbytes / self.gradient_bucket_bytes)
        return ab.transfer + share * ab.latency

"""The cost model: :class:`CostModel` prices an op's compute (roofline, or a profile table's measurement), the
collectives of a mesh axis (its slowest group) and the parallel ops, for one machine, mesh and objective."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from unity_eq.cost.collectives import AlphaBeta, ring_all_gather, ring_all_reduce, ring_all_to_all, ring_send
from unity_eq.cost.records import INFERENCE, Cost, Objective, OpInstance
from unity_eq.cost.topology import MeshTopology
from unity_eq.ir import machine_order
from unity_eq.machine import DeviceSpec, GroupTopology
from unity_eq.ops.family import Work
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


def op_class(op_type: str) -> str:
    """The efficiency class of an op (``gemm``, ``memory``, ``layout``): its family's; an opaque op's ``memory``."""
    family = family_for(op_type)
    return family.op_class(op_type) if family is not None else "memory"


def forward_work(op: OpInstance, lowered: bool = False) -> Work:
    """The forward pass of one op: its family's own account (a view moves nothing, Gather the rows it gathers)
    or the default: read every input, write the output, one kernel. In elements of the op's output type.
    ``lowered``: the device program's forward, where lowering writes another thing than the op's kernel for the
    op's dtype (``OpFamily.lowered_work``: Attention in bfloat16 is written as its composition)."""
    family = family_for(op.op_type)
    if lowered and family is not None and family.lowered_work is not None:
        work = family.lowered_work(op.op_type, op.in_shapes, op.out_shape, op.dtype, dict(op.attrs))
        if work is not None:
            return work
    if family is not None and family.forward_work is not None:
        work = family.forward_work(op.op_type, op.in_shapes, op.out_shape)
        if work is not None:
            return work
    itemsize = _itemsize(op)
    flops = op_flops(op.op_type, op.in_shapes, op.out_shape)
    return Work(flops, op.in_bytes / itemsize, op.out_bytes / itemsize)


def backward_work(op: OpInstance) -> Work | None:
    """The backward pass of one op as its family states it (in elements of the output type), or None: the family
    does not say (a plug-in without the hook, an opaque op), and the backward is the flat factor × forward."""
    family = family_for(op.op_type)
    if family is None or family.backward_work is None:
        return None
    return family.backward_work(op.op_type, op.in_shapes, op.out_shape)


def _itemsize(op: OpInstance) -> float:
    """Bytes per element of the op's output (what a family's element counts are multiplied by)."""
    count = _numel(op.out_shape)
    return op.out_bytes / count if count and op.out_bytes else 4.0


#: the gradient bucket the cost model prices by default (PyTorch DDP's); the torch backend all-reduces weight
#: gradients in buckets of this size (unity_eq.train.buckets)
GRADIENT_BUCKET_BYTES = 25 * 2**20


@dataclass
class CostModel(MeshTopology):
    """Prices steps for one machine, mesh and objective (``inference`` or ``training``)."""

    # machine and mesh: MeshTopology's fields (and its caches, keyword-only)
    objective: Objective = INFERENCE  # a name (``"training"``) is accepted and parsed
    profile: ProfileTable | None = None  # measured op times (`unity-eq profile`); the roofline prices the rest
    # Data-parallel frameworks all-reduce gradients in buckets (PyTorch DDP: 25 MiB), so a gradient of S bytes
    # pays min(1, S / bucket) of a collective's latency; 0 disables bucketing.
    gradient_bucket_bytes: float = GRADIENT_BUCKET_BYTES
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
        """Forward time of one op (:meth:`forward`), plus its backward (:meth:`backward`) for training; a profile
        table's measurement where it has the op.

        A node with several ``outputs`` (Split) is one kernel, but extraction prices one e-node per output:
        each carries 1/outputs of the launch and of the input read (and its own output's write), so the outputs
        of one Split sum to one kernel, as profile tables share a measured node among its outputs."""
        forward = self.forward(op)
        if not self.objective.training:
            return Cost(compute=forward)
        return Cost(compute=forward + self.backward(op, forward))

    def forward(self, op: OpInstance) -> float:
        """Seconds of the forward pass: measured, or the roofline of :func:`forward_work` on the slowest
        device."""
        if self.profile is not None:
            measured = self.profile.lookup(op.op_type, op.in_shapes, op.out_shape, op.dtype)
            if measured is not None:
                return measured
        return self.roofline(op, self._forward_work(op))

    def _forward_work(self, op: OpInstance) -> Work:
        # inference plans run their device programs (what lowering wrote); training plans the torch backend
        work = forward_work(op, lowered=not self.objective.training)
        if op.outputs > 1:  # one output's share of the node's input read (its own output's write is whole)
            work = replace(work, read=work.read / op.outputs)
        return work

    def backward(self, op: OpInstance, forward: float | None = None) -> float:
        """Seconds of the backward pass: measured (a profile table with backward times), the roofline of the
        family's :func:`backward_work`, or, where the family does not say, the objective's flat
        ``backward_factor`` × the forward time (``forward``, computed when not given)."""
        forward = self.forward(op) if forward is None else forward
        work = backward_work(op)
        if self.profile is not None:
            measured = self.profile.lookup(op.op_type, op.in_shapes, op.out_shape, op.dtype, backward=True)
            if measured is not None:
                return measured
            if self.profile.lookup(op.op_type, op.in_shapes, op.out_shape, op.dtype, count=False) is not None:
                # a measured forward without a measured backward: the roofline's backward / forward ratio of it
                modelled = self.roofline(op, self._forward_work(op))
                ratio = self.objective.backward_factor if work is None else self.roofline(op, work) / modelled
                return forward * ratio if modelled > 0 else 0.0
        if work is None:
            return self.objective.backward_factor * forward
        return self.roofline(op, work)

    def roofline(self, op: OpInstance, work: Work) -> float:
        """``max(FLOPs / (peak × e), bytes / (bandwidth × e)) + kernels × launch floor`` on the slowest device,
        ``e`` the machine's efficiency for the op's class (or the work's own) on that device; a multi-output
        node's e-node pays 1/outputs of the launches."""
        device = self._device()
        eff = self.machine.efficiency_for(device, work.compute_class or op_class(op.op_type))
        moved = work.elements * _itemsize(op)
        seconds = max(work.flops / (device.peak(op.dtype) * eff), moved / (device.memory_bandwidth * eff))
        return seconds + self.machine.launch_overhead * work.kernels / op.outputs

    def local_copy(self, nbytes: float) -> Cost:
        device = self._device()
        seconds = 2 * nbytes / (device.memory_bandwidth * self.machine.efficiency_for(device, "layout"))
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
        """A weight gradient's all-reduce: its bandwidth term and its share of a bucket's latency, at the slowest
        group by that price (the group slowest by the whole latency may not be: a faster link must never make
        this dearer)."""
        share = 1.0 if self.gradient_bucket_bytes <= 0 else min(1.0, nbytes / self.gradient_bucket_bytes)
        prices = (ring_all_reduce(t, nbytes) for t in self.group_topologies(axis))
        return max((ab.transfer + share * ab.latency for ab in prices), default=0.0)

    # --- the training step's weight state (ZeRO levels: the table in unity_eq/memory.py) -------------------
    def update_bandwidth(self) -> float:
        """Bytes/s the optimizer's update streams at: the mesh's slowest memory × the machine's efficiency."""
        kinds = {id(self.machine.devices[d]): self.machine.devices[d] for d in self.mesh.devices}
        return min(d.memory_bandwidth for d in kinds.values()) * self.machine.efficiency

    def optimizer_update(self, resident_bytes: float) -> float:
        """The optimizer's update after the last microbatch: it reads and writes the weights and their state a
        device keeps (``resident_bytes``: ``memory.resident_bytes``) at :meth:`update_bandwidth`. One term for a
        pipeline stage and for the SPMD search's plan, so the training search compares the two on the same terms."""
        return 2 * resident_bytes / self.update_bandwidth()

    def zero_step_traffic(self, zero: int, weights: float, replicas: int, axis: str = "d") -> float:
        """Once per step, on the data axis ``axis`` of ``replicas``: the gradients' all-reduce (ZeRO level 0), or
        reduce-scatter + all-gather of the updated weights (level 1: the same volume, priced as one all-reduce),
        or the all-gather alone (level 2, whose gradients were reduce-scattered microbatch by microbatch); level
        3 synchronizes per microbatch, inference never."""
        if not self.objective.training or replicas == 1 or zero == 3:
            return 0.0
        if zero == 2:
            return self.all_gather(axis, weights)
        return self.gradient_all_reduce(axis, weights)

    def zero_microbatch_traffic(self, zero: int, weights: float, replicas: int, axis: str = "d") -> float:
        """Per microbatch: level 2 reduce-scatters the gradients (a device keeps only its shard, so it cannot
        accumulate the others'); level 3 also all-gathers the weights for the forward and again for the backward
        (inference: once, and no gradients)."""
        if replicas == 1 or zero < 2:
            return 0.0
        training = self.objective.training
        scatter = self.reduce_scatter(axis, weights) if training else 0.0
        if zero == 2:
            return scatter
        return (2 if training else 1) * self.all_gather(axis, weights) + scatter

"""Machines and the cost model: what a plan step costs on a given machine.

Placement transitions, the collective each one is, and its price on a mesh axis of n devices for a tensor of
S bytes (the gathered / reduced size). Collectives follow NCCL's ring algorithms (alpha-beta, with the bus
factors below); B and α are the bandwidth and latency of the axis's link (see "Links" below):

=====================  ==================  ===============================  ====================================
parallel op            transition          forward                          backward (objective ``training``)
=====================  ==================  ===============================  ====================================
Partition(x, d, ax)    R → S(d)            free for weights and inputs;     all-gather of the gradient when x is
                                           a local copy of an activation    an activation
Combine(x, d, ax)      S(d) → R            all-gather                       free (a slice)
Replicate(x, ax)       R → R (for S work)  free                             all-reduce of the gradient, unless x
                                                                            is a model input
Reduce(x, ax)          P → R               all-reduce                       free
=====================  ==================  ===============================  ====================================

==================  ===================================  =========================================================
collective          flat (axis inside one node)          hierarchical (axis over m nodes, k ranks on each)
==================  ===================================  =========================================================
all-reduce          2(n−1)α + 2(n−1)/n·S/B               reduce-scatter in the node + all-reduce of S/k between
                                                         nodes + all-gather in the node
all-gather          (n−1)α + (n−1)/n·S/B                 all-gather of S/k between nodes, then in the node
reduce-scatter      (n−1)α + (n−1)/n·S/B                 reduce-scatter in the node, then of S/k between nodes
all-to-all          (n−1)α + (n−1)/n·S/B (S per rank)    (k−1)/n·S over the node link + (n−k)/n·S over the network
point-to-point      α + S/B                              the same over the network
==================  ===================================  =========================================================

Links: inside a node B is the node's link bandwidth per device (NVLink, PCIe); between nodes it is the rank's
share of its node's network, ``nics × NIC bandwidth / ranks of the mesh on that node`` (every rank of an SPMD
plan runs the same collective at the same time). A collective waits for its slowest group.

Compute is a roofline per op on its local (per-device) shapes on the slowest device of the mesh,
``max(FLOPs / (peak × efficiency), bytes / (bandwidth × efficiency)) + launch floor``; training charges
forward + backward as three times the forward. The formulas, with examples, are in docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from unity_eq.ir import Mesh
from unity_eq.ops import Family, spec_for

if TYPE_CHECKING:
    from unity_eq.profile import ProfileTable

__all__ = [
    "AlphaBeta",
    "Cost",
    "CostModel",
    "DeviceSpec",
    "GroupTopology",
    "LinkSpec",
    "Machine",
    "NodeSpec",
    "default_machine",
]

OBJECTIVES = ("inference", "training")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator kind. ``flops`` maps a numpy dtype name to peak FLOP/s; bandwidth in bytes/s, memory
    in bytes."""

    name: str
    flops: Mapping[str, float]
    memory_bandwidth: float
    memory: float

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``: its own entry, else float32's, else the smallest one given."""
        if dtype in self.flops:
            return self.flops[dtype]
        return self.flops.get("float32", min(self.flops.values()))


@dataclass(frozen=True)
class LinkSpec:
    """A link class: bandwidth in bytes/s per device (one direction) and latency in seconds per message."""

    bandwidth: float
    latency: float
    name: str = ""


@dataclass(frozen=True)
class NodeSpec:
    """One node: the link between its devices and its network to other nodes (``nics`` NICs of ``network``)."""

    name: str
    link: LinkSpec
    network: LinkSpec | None = None
    nics: int = 1


@dataclass(frozen=True)
class Machine:
    """Devices grouped into nodes, with links inside nodes and a network between them.

    ``devices`` and ``node_of`` are indexed by machine device; devices are listed node by node. ``nodes``
    gives each node's links; when it is empty every node uses ``intra_link`` inside and ``inter_link`` (one NIC
    per device) between nodes.
    """

    name: str
    devices: tuple[DeviceSpec, ...]
    node_of: tuple[int, ...]
    intra_link: LinkSpec
    inter_link: LinkSpec | None = None
    launch_overhead: float = 5e-6  # seconds: the floor of one kernel
    efficiency: float = 0.75  # achievable fraction of peak FLOP/s and memory bandwidth
    nodes: tuple[NodeSpec, ...] = ()
    memory_fraction: float = 0.9  # usable fraction of device memory (context, workspaces, fragmentation)
    source: str = ""  # the preset name or file it came from

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def node_count(self) -> int:
        return len(set(self.node_of))

    def node(self, index: int) -> NodeSpec:
        if self.nodes:
            return self.nodes[index]
        per_node = sum(1 for n in self.node_of if n == index)
        return NodeSpec(f"node{index}", self.intra_link, self.inter_link, max(per_node, 1))

    def usable_memory(self, device: int) -> float:
        return self.devices[device].memory * self.memory_fraction

    def describe(self) -> str:
        kinds = Counter(d.name for d in self.devices)
        text = " + ".join(f"{n} × {k}" for k, n in kinds.items())
        return f"{self.name}: {text} in {self.node_count} node(s)"


A100_80G = DeviceSpec(
    "A100-SXM-80G",
    {"float64": 19.5e12, "float32": 19.5e12, "float16": 312e12, "bfloat16": 312e12, "int8": 624e12},
    2.039e12,
    80 * 2**30,
)
NVLINK3 = LinkSpec(bandwidth=300e9, latency=2e-6, name="nvlink3")


def default_machine(devices: int) -> Machine:
    """``--devices N``: N A100-80G GPUs in one node on NVLink."""
    return Machine(f"{devices}xA100-SXM-80G", (A100_80G,) * devices, (0,) * devices, NVLINK3, source="--devices")


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


@dataclass(frozen=True)
class GroupTopology:
    """How one communication group of a mesh axis sits on the machine.

    ``n`` ranks on ``m`` nodes, at most ``k`` on one node; ``local`` is the slowest node link among the nodes
    holding more than one of its ranks (None when k = 1), ``network`` the smallest per-rank network share
    among its nodes (None when m = 1).
    """

    n: int
    k: int
    m: int
    local: LinkSpec | None
    network: LinkSpec | None

    @property
    def spans_nodes(self) -> bool:
        return self.m > 1


@dataclass(frozen=True)
class AlphaBeta:
    """A collective's time as latency + bandwidth terms (seconds), kept apart so gradients can bucket."""

    latency: float = 0.0
    transfer: float = 0.0

    @property
    def seconds(self) -> float:
        return self.latency + self.transfer

    def __add__(self, other: AlphaBeta) -> AlphaBeta:
        return AlphaBeta(self.latency + other.latency, self.transfer + other.transfer)


def _ring(steps: int, factor: float, nbytes: float, link: LinkSpec | None) -> AlphaBeta:
    """``steps`` latencies plus ``factor`` × bytes over the link (nothing when nothing moves)."""
    if steps <= 0 or link is None:
        return AlphaBeta()
    return AlphaBeta(steps * link.latency, factor * nbytes / link.bandwidth)


@dataclass
class CostModel:
    """Prices steps for one machine, mesh and objective (``inference`` or ``training``)."""

    machine: Machine
    mesh: Mesh
    objective: str = "inference"
    profile: ProfileTable | None = None  # measured op times (`unity-eq profile`); the roofline prices the rest
    # Data-parallel frameworks all-reduce gradients in buckets (PyTorch DDP: 25 MiB), so a gradient of S bytes
    # pays min(1, S / bucket) of a collective's latency; 0 disables bucketing.
    gradient_bucket_bytes: float = 25 * 2**20
    _topology: dict[str, tuple[GroupTopology, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: expected inference or training, got {self.objective!r}")
        if any(d >= self.machine.device_count for d in self.mesh.devices):
            raise ValueError(f"mesh uses device {max(self.mesh.devices)}; the machine has {self.machine.device_count}")

    # --- devices -----------------------------------------------------------------------------------------
    def _device(self) -> DeviceSpec:
        """The slowest device of the mesh: SPMD steps wait for it."""
        devices = [self.machine.devices[d] for d in self.mesh.devices]
        return min(devices, key=lambda d: (d.peak("float32"), d.memory_bandwidth))

    def memory_capacity(self) -> float:
        """Usable bytes per device: the smallest device of the mesh (every rank holds the same shapes)."""
        return min(self.machine.usable_memory(d) for d in self.mesh.devices)

    def compute(
        self,
        op_type: str,
        in_shapes: Sequence[Sequence[int] | None],
        in_bytes: float,
        out_shape: Sequence[int],
        out_bytes: float,
        dtype: str,
        outputs: int = 1,
    ) -> Cost:
        """Roofline time of one op on its local shapes plus the launch floor (×3 for training), or its
        measured time when a profile table has the op.

        A node with several ``outputs`` (Split) is one kernel, but extraction prices one e-node per output:
        each carries 1/outputs of the launch and of the input read (and its own output's write), so the outputs
        of one Split sum to one kernel, as profile tables share a measured node among its outputs."""
        if self.profile is not None:
            measured = self.profile.lookup(op_type, in_shapes, out_shape, dtype)
            if measured is not None:
                return Cost(compute=measured * (3.0 if self.objective == "training" else 1.0))
        device = self._device()
        eff = self.machine.efficiency
        flops = op_flops(op_type, in_shapes, out_shape)
        moved = in_bytes / outputs + out_bytes
        seconds = max(flops / (device.peak(dtype) * eff), moved / (device.memory_bandwidth * eff))
        seconds += self.machine.launch_overhead / outputs
        if self.objective == "training":
            seconds *= 3.0  # forward + backward (≈ 2× forward)
        return Cost(compute=seconds)

    def local_copy(self, nbytes: float) -> Cost:
        device = self._device()
        seconds = 2 * nbytes / (device.memory_bandwidth * self.machine.efficiency)
        return Cost(compute=seconds + self.machine.launch_overhead)

    # --- topology ----------------------------------------------------------------------------------------
    def _ranks_on_node(self) -> Counter[int]:
        return Counter(self.machine.node_of[d] for d in self.mesh.devices)

    def group_topologies(self, axis: str) -> tuple[GroupTopology, ...]:
        """The distinct placements of ``axis``'s communication groups on the machine."""
        if axis in self._topology:
            return self._topology[axis]
        per_node = self._ranks_on_node()
        found: dict[GroupTopology, None] = {}
        for group in self.mesh.groups(axis):
            nodes = Counter(self.machine.node_of[self.mesh.devices[r]] for r in group)
            k, m = max(nodes.values()), len(nodes)
            local = None
            if k > 1:
                links = [self.machine.node(i).link for i, c in nodes.items() if c > 1]
                local = LinkSpec(
                    min(link.bandwidth for link in links),
                    max(link.latency for link in links),
                    "/".join(sorted({link.name for link in links if link.name})),
                )
            network = None
            if m > 1:
                shares = []
                for i in nodes:
                    spec = self.machine.node(i)
                    if spec.network is None:
                        raise ValueError(f"node {spec.name} has no network, but mesh axis {axis} spans nodes")
                    shares.append(
                        LinkSpec(
                            spec.nics * spec.network.bandwidth / per_node[i], spec.network.latency, spec.network.name
                        )
                    )
                network = LinkSpec(
                    min(s.bandwidth for s in shares),
                    max(s.latency for s in shares),
                    "/".join(sorted({s.name for s in shares if s.name})),
                )
            found.setdefault(GroupTopology(len(group), k, m, local, network), None)
        self._topology[axis] = tuple(found)
        return self._topology[axis]

    def spans_nodes(self, axis: str) -> bool:
        return any(t.spans_nodes for t in self.group_topologies(axis))

    def axis_link(self, axis: str) -> LinkSpec:
        """The bottleneck link of ``axis``: the network share when it spans nodes, else the node link."""
        links = [t.network if t.network is not None else t.local for t in self.group_topologies(axis)]
        known = [link for link in links if link is not None]
        if not known:
            return self.machine.intra_link
        return min(known, key=lambda link: link.bandwidth)

    # --- collectives (seconds; the slowest group of the axis) -------------------------------------------
    def _worst(self, axis: str, fn: Callable[[GroupTopology, float], AlphaBeta], nbytes: float) -> AlphaBeta:
        return max((fn(t, nbytes) for t in self.group_topologies(axis)), key=lambda ab: ab.seconds, default=AlphaBeta())

    def all_reduce(self, axis: str, nbytes: float) -> float:
        """All-reduce of ``nbytes`` per rank over ``axis``."""
        return self._worst(axis, _all_reduce, nbytes).seconds

    def all_gather(self, axis: str, nbytes: float) -> float:
        """All-gather producing ``nbytes`` per rank (each contributes nbytes / n)."""
        return self._worst(axis, _all_gather, nbytes).seconds

    def reduce_scatter(self, axis: str, nbytes: float) -> float:
        """Reduce-scatter of ``nbytes`` per rank into nbytes / n each (the all-gather's mirror image)."""
        return self._worst(axis, _all_gather, nbytes).seconds

    def all_to_all(self, axis: str, nbytes: float) -> float:
        """All-to-all: each rank holds ``nbytes`` and sends (n−1)/n of it, nbytes / n to every other rank."""
        return self._worst(axis, _all_to_all, nbytes).seconds

    def send(self, axis: str, nbytes: float) -> float:
        """Point-to-point transfer of ``nbytes`` between two ranks of ``axis`` (over the network if it spans)."""
        return self._worst(axis, _send, nbytes).seconds

    def gradient_all_reduce(self, axis: str, nbytes: float) -> float:
        """A weight gradient's all-reduce: its bandwidth term and its share of a bucket's latency."""
        ab = self._worst(axis, _all_reduce, nbytes)
        share = 1.0 if self.gradient_bucket_bytes <= 0 else min(1.0, nbytes / self.gradient_bucket_bytes)
        return ab.transfer + share * ab.latency

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
        if self.objective != "training" or source == "input":
            return ZERO
        if source == "weight":
            return Cost(comm=self.gradient_all_reduce(axis, local_bytes))
        return Cost(comm=self.all_reduce(axis, local_bytes))


def _all_reduce(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    if t.m == 1:
        return _ring(2 * (t.n - 1), 2 * (t.n - 1) / t.n, s, t.local)
    k, m = t.k, t.m
    in_node = _ring(k - 1, (k - 1) / k, s, t.local)  # reduce-scatter, and at the end all-gather, in the node
    return in_node + _ring(2 * (m - 1), 2 * (m - 1) / m, s / k, t.network) + in_node


def _all_gather(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    if t.m == 1:
        return _ring(t.n - 1, (t.n - 1) / t.n, s, t.local)
    k, m = t.k, t.m
    return _ring(m - 1, (m - 1) / m, s / k, t.network) + _ring(k - 1, (k - 1) / k, s, t.local)


def _all_to_all(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    if t.m == 1:
        return _ring(t.n - 1, (t.n - 1) / t.n, s, t.local)
    k, n = t.k, t.n
    return _ring(k - 1, (k - 1) / n, s, t.local) + _ring(n - k, (n - k) / n, s, t.network)


def _send(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    return _ring(1, 1.0, s, t.network if t.network is not None else t.local)

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from unity_eq.ir import Mesh, machine_order
from unity_eq.machine import DeviceSpec, GroupTopology, LinkSpec, Machine
from unity_eq.ops.registry import family_for
from unity_eq.planfile import AxisRecord

if TYPE_CHECKING:
    from unity_eq.profile_table import ProfileTable

__all__ = [
    "INFERENCE",
    "OBJECTIVES",
    "TRAINING",
    "AlphaBeta",
    "Cost",
    "CostModel",
    "Objective",
    "OpInstance",
    "axis_info",
]


@dataclass(frozen=True)
class Objective:
    """What one step of the workload is, with the factors the cost and memory models share.

    ``inference``: a forward pass. ``training``: forward, backward (``backward_factor`` × the forward's compute,
    the usual ≈ 2×), and the gradient traffic that follows from it: a replicated weight's gradient is all-reduced,
    a partitioned activation's gradient all-gathered, and memory keeps the activations for the backward pass and
    the weights' gradient and optimizer state. Compare objectives by identity or ``.training``, never by name.
    """

    name: str
    backward_factor: float = 0.0

    @property
    def training(self) -> bool:
        return self.backward_factor > 0

    @property
    def compute_factor(self) -> float:
        """Compute of a step relative to the forward pass alone."""
        return 1.0 + self.backward_factor

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str | Objective) -> Objective:
        """``inference`` or ``training`` (an Objective passes through); ValueError names both otherwise."""
        if isinstance(text, Objective):
            return text
        if text not in OBJECTIVES:
            raise ValueError(f"objective: expected inference or training, got {text!r}")
        return OBJECTIVES[text]


INFERENCE = Objective("inference")
TRAINING = Objective("training", backward_factor=2.0)
#: The objectives by name (``--objective``).
OBJECTIVES = {o.name: o for o in (INFERENCE, TRAINING)}


@dataclass(frozen=True)
class OpInstance:
    """One op on its local (per-device) shapes: everything the cost model prices it by.

    Built from an e-node (``extract.pricing.enode_instance``, which extraction and ``profile`` share) or from
    a plan step (``report.step_instance``): one type and one :meth:`CostModel.compute`, so a plan re-priced step
    by step costs what its e-nodes cost. ``outputs``: the outputs of a multi-output node (Split), each priced
    with its share of the kernel.
    """

    op_type: str
    in_shapes: tuple[tuple[int, ...] | None, ...]
    in_bytes: float
    out_shape: tuple[int, ...]
    out_bytes: float
    dtype: str
    outputs: int = 1


MASK_KINDS = 62  # kinds of node link / network share told apart with int64 bit masks (more: a slower path)


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
    family = family_for(op_type)
    if family is not None:
        return family.flops(op_type, in_shapes, out_shape)
    return float(_numel(out_shape))  # an opaque op: one operation per output element


def _kinds_of(mask: int) -> tuple[int, ...]:
    """The kind indices set in a bit mask."""
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def _bottleneck(links: Sequence[LinkSpec]) -> LinkSpec:
    """One link standing for several: the smallest bandwidth, the largest latency, every name."""
    return LinkSpec(
        min(link.bandwidth for link in links),
        max(link.latency for link in links),
        "/".join(sorted({link.name for link in links if link.name})),
    )


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
    objective: Objective = INFERENCE  # a name (``"training"``) is accepted and parsed
    profile: ProfileTable | None = None  # measured op times (`unity-eq profile`); the roofline prices the rest
    # Data-parallel frameworks all-reduce gradients in buckets (PyTorch DDP: 25 MiB), so a gradient of S bytes
    # pays min(1, S / bucket) of a collective's latency; 0 disables bucketing.
    gradient_bucket_bytes: float = 25 * 2**20
    _topology: dict[str, tuple[GroupTopology, ...]] = field(default_factory=dict, repr=False)
    _uneven: dict[str, bool] = field(default_factory=dict, repr=False)
    _slowest: DeviceSpec | None = field(default=None, repr=False)
    _capacity: float | None = field(default=None, repr=False)
    _rank_node_array: np.ndarray | None = field(default=None, repr=False)
    _kinds: tuple[np.ndarray, np.ndarray, list[LinkSpec], list[LinkSpec | None], dict[int, int]] | None = field(
        default=None, repr=False
    )

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

    # --- topology ----------------------------------------------------------------------------------------
    # Everything below works on arrays of node ids, one row per communication group, and on the few kinds of
    # node (link, network share): never rank by rank in Python, so a 100k-device mesh takes milliseconds.

    def _rank_nodes(self) -> np.ndarray:
        """The node of every mesh rank."""
        if self._rank_node_array is None:
            devices = self.mesh.devices
            if devices is machine_order(len(devices)):  # the search's meshes: machine order
                self._rank_node_array = self.machine.node_array[: len(devices)]
            else:
                self._rank_node_array = self.machine.node_array[np.asarray(devices, dtype=np.int64)]
        return self._rank_node_array

    def _group_nodes(self, axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``axis``'s groups as (group, node) pairs sorted by group then node: (group, node, ranks of the group
        on that node, index of each group's first pair). Linear in the ranks when the devices are in machine
        order (each group's nodes are then already sorted)."""
        rows = self._rank_nodes()[self.mesh.group_matrix(axis)]
        if rows.shape[1] > 1 and not bool(np.all(rows[:, 1:] >= rows[:, :-1])):
            rows = np.sort(rows, axis=1)
        flat = rows.ravel()
        new_pair = np.ones(flat.shape, dtype=bool)
        new_pair[1:] = flat[1:] != flat[:-1]
        new_pair[:: rows.shape[1]] = True  # every group starts a pair
        first = np.flatnonzero(new_pair)
        counts = np.diff(np.r_[first, flat.size])
        group = first // rows.shape[1]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        return group, flat[first], counts, starts

    def _link_kinds(self) -> tuple[np.ndarray, np.ndarray, list[LinkSpec], list[LinkSpec | None], dict[int, int]]:
        """The kinds of link a group can meet on each node: (node link kind per node, network share kind per node
        (the share depends on the mesh's ranks on the node), the links, the shares (None: no network), a node of
        each share kind). Computed per kind of node, not per node."""
        if self._kinds is None:
            per_node = np.bincount(self._rank_nodes())
            kind_of, examples = self.machine.node_kinds
            present = np.flatnonzero(per_node)
            span = int(per_node.max(initial=0)) + 1
            pairs, first, inverse = np.unique(
                kind_of[present] * span + per_node[present], return_index=True, return_inverse=True
            )
            links: dict[LinkSpec, int] = {}
            shares: dict[LinkSpec | None, int] = {}
            pair_link, pair_share = np.zeros(len(pairs), np.int64), np.zeros(len(pairs), np.int64)
            share_node: dict[int, int] = {}
            for j, pair in enumerate(pairs.tolist()):
                spec, ranks = examples[pair // span], pair % span
                pair_link[j] = links.setdefault(spec.link, len(links))
                share = None
                if spec.network is not None:
                    network = spec.network
                    share = LinkSpec(spec.nics * network.bandwidth / ranks, network.latency, network.name)
                pair_share[j] = shares.setdefault(share, len(shares))
                share_node.setdefault(int(pair_share[j]), int(present[first[j]]))
            link_kind = np.zeros(len(per_node), np.int64)
            share_kind = np.zeros(len(per_node), np.int64)
            link_kind[present], share_kind[present] = pair_link[inverse], pair_share[inverse]
            self._kinds = (link_kind, share_kind, list(links), list(shares), share_node)
        return self._kinds

    def uneven_groups(self, axis: str) -> bool:
        """Whether some group of ``axis`` holds an unequal number of ranks on its nodes."""
        if axis not in self._uneven:
            _, _, counts, starts = self._group_nodes(axis)
            most, least = np.maximum.reduceat(counts, starts), np.minimum.reduceat(counts, starts)
            self._uneven[axis] = bool(np.any(most != least))
        return self._uneven[axis]

    def group_topologies(self, axis: str) -> tuple[GroupTopology, ...]:
        """The distinct placements of ``axis``'s communication groups on the machine, in the order of the
        first group (by rank) that has each."""
        if axis in self._topology:
            return self._topology[axis]
        shared = self._shared_key(axis)
        if shared is not None and shared in self.machine.axis_topologies:
            self._topology[axis] = self.machine.axis_topologies[shared]
            return self._topology[axis]
        self._topology[axis] = self._find_topologies(axis)
        if shared is not None:
            self.machine.axis_topologies[shared] = self._topology[axis]
        return self._topology[axis]

    def _shared_key(self, axis: str) -> tuple[int, int, int] | None:
        """(ranks, axis size, stride) when the mesh lies on the machine's devices in order: an axis's groups
        then depend on nothing else (the other axes' split does not matter), so meshes share them."""
        devices = self.mesh.devices
        if devices is not machine_order(len(devices)):
            return None
        i = self.mesh.axes.index(axis)
        return len(devices), self.mesh.sizes[i], math.prod(self.mesh.sizes[i + 1 :])

    def _find_topologies(self, axis: str) -> tuple[GroupTopology, ...]:
        group, node, counts, starts = self._group_nodes(axis)
        link_kind, share_kind, link_list, share_list, share_node = self._link_kinds()
        width = self.mesh.axis_size(axis)
        k = np.maximum.reduceat(counts, starts)
        m = np.diff(np.r_[starts, len(group)])
        if max(len(link_list), len(share_list)) <= MASK_KINDS:
            one = np.int64(1)
            local_bits = np.where(counts > 1, np.left_shift(one, link_kind[node]), 0)
            local_mask = np.bitwise_or.reduceat(local_bits, starts)
            net_mask = np.bitwise_or.reduceat(np.left_shift(one, share_kind[node]), starts)
            signature = np.stack([k, m, local_mask, net_mask], axis=1)
            if bool(np.all(signature == signature[0])):  # every group alike: the usual case, no sort
                distinct = signature[:1]
            else:
                distinct, first = np.unique(signature, axis=0, return_index=True)
                distinct = distinct[np.argsort(first)]
            rows = [(int(kk), int(mm), _kinds_of(int(lm)), _kinds_of(int(nm))) for kk, mm, lm, nm in distinct.tolist()]
        else:  # more kinds than bits: the same per group, in Python
            found: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], None] = {}
            for g, start in enumerate(starts.tolist()):
                end = start + int(m[g])
                nodes, ranks = node[start:end].tolist(), counts[start:end].tolist()
                on_link = sorted({int(link_kind[n]) for n, c in zip(nodes, ranks, strict=True) if c > 1})
                on_net = sorted({int(share_kind[n]) for n in nodes})
                found.setdefault((int(k[g]), int(m[g]), tuple(on_link), tuple(on_net)), None)
            rows = list(found)
        topologies: list[GroupTopology] = []
        for kk, mm, local_kinds, net_kinds in rows:
            local = _bottleneck([link_list[i] for i in local_kinds]) if kk > 1 else None
            network = None
            if mm > 1:
                net_links = [link for link in (share_list[i] for i in net_kinds) if link is not None]
                if len(net_links) < len(net_kinds):
                    missing = next(i for i in net_kinds if share_list[i] is None)
                    name = self.machine.node(share_node[missing]).name
                    raise ValueError(f"node {name} has no network, but mesh axis {axis} spans nodes")
                network = _bottleneck(net_links)
            topologies.append(GroupTopology(width, kk, mm, local, network))
        return tuple(topologies)

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
        if self.objective.training:
            cost = cost + Cost(comm=self.all_gather(axis, local_in_bytes))
        return cost

    def combine(self, axis: str, local_out_bytes: float) -> Cost:
        return Cost(comm=self.all_gather(axis, local_out_bytes))

    def reduce(self, axis: str, local_bytes: float) -> Cost:
        return Cost(comm=self.all_reduce(axis, local_bytes))

    def replicate(self, axis: str, local_bytes: float, source: str) -> Cost:
        if not self.objective.training or source == "input":
            return ZERO
        if source == "weight":
            return Cost(comm=self.gradient_all_reduce(axis, local_bytes))
        return Cost(comm=self.all_reduce(axis, local_bytes))


def axis_info(model: CostModel, axis: str) -> AxisRecord:
    """How an axis sits on the machine, for plan.json and explain."""
    tops = model.group_topologies(axis)
    worst = max(tops, key=lambda t: (t.m, t.k))
    link = model.axis_link(axis)
    return AxisRecord(
        name=axis,
        size=model.mesh.axis_size(axis),
        spans_nodes=worst.m > 1,
        nodes=worst.m,
        ranks_per_node=worst.k,
        link=link.name or "?",
        bandwidth_gbs=round(link.bandwidth / 1e9, 3) if math.isfinite(link.bandwidth) else None,
    )


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

"""What a machine is: device kinds (:class:`DeviceSpec`), links (:class:`LinkSpec`), nodes (:class:`NodeSpec`)
and the machine itself (:class:`Machine`: every device, the node it sits on, the links and the network), plus
where a group of its devices sits (:class:`GroupTopology`). Plain values, imported by every layer above; reading
them from TOML files and presets is :mod:`unity_eq.machine`'s.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["A100_80G", "MAX_DEVICES", "NVLINK3", "DeviceSpec", "GroupTopology", "LinkSpec", "Machine", "NodeSpec"]

# The most devices a plan may have: above the largest machines built (about 100k GPUs), and a plan directory holds
# one ONNX file per device. Beyond it a plan is for one replica of the model, replicated by the user.
MAX_DEVICES = 131_072


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator kind. ``flops`` maps a numpy dtype name to peak FLOP/s; bandwidth in bytes/s, memory
    in bytes."""

    name: str
    flops: Mapping[str, float]
    memory_bandwidth: float
    memory: float
    #: achievable fraction of peak and bandwidth per op class (``gemm``, ``memory``, ``layout``) for this kind,
    #: where it differs from the machine's (``Machine.efficiency_for``)
    efficiencies: Mapping[str, float] = field(default_factory=dict)

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
    #: efficiency per op class (``gemm``, ``memory``, ``layout``) where it differs from ``efficiency``; a device
    #: kind's own ``efficiencies`` come first
    efficiencies: Mapping[str, float] = field(default_factory=dict)

    def efficiency_for(self, device: DeviceSpec, op_class: str) -> float:
        """The achievable fraction of ``device``'s peak FLOP/s and bandwidth for an op of ``op_class``: the
        device kind's value, else the machine's for that class, else the machine's ``efficiency``."""
        return device.efficiencies.get(op_class, self.efficiencies.get(op_class, self.efficiency))

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def node_count(self) -> int:
        return len(set(self.node_of))

    @functools.cached_property
    def node_array(self) -> np.ndarray:
        """``node_of`` as an array (computed once: a machine may have 100k devices)."""
        return np.asarray(self.node_of, dtype=np.int64)

    @functools.cached_property
    def _devices_per_node(self) -> tuple[int, ...]:
        return tuple(int(n) for n in np.bincount(self.node_array)) if self.node_of else ()

    @functools.cached_property
    def axis_topologies(self) -> dict[tuple[int, int, int], tuple[GroupTopology, ...]]:
        """Group topologies of mesh axes laid on the devices in order, by (ranks, size, stride): filled by
        CostModel, shared by the meshes of a search."""
        return {}

    @functools.cached_property
    def node_kinds(self) -> tuple[np.ndarray, tuple[NodeSpec, ...]]:
        """Every node's kind (same link, network and NICs) and one node of each kind, found once: the mesh
        search prices hundreds of meshes over the same, maybe 10k, nodes."""
        kinds: dict[tuple[LinkSpec, LinkSpec | None, int], int] = {}
        examples: list[NodeSpec] = []
        kind_of = np.zeros(len(self._devices_per_node), dtype=np.int64)
        for i in range(len(kind_of)):
            spec = self.node(i)
            key = (spec.link, spec.network, spec.nics)
            if key not in kinds:
                kinds[key] = len(examples)
                examples.append(spec)
            kind_of[i] = kinds[key]
        return kind_of, tuple(examples)

    def node(self, index: int) -> NodeSpec:
        if self.nodes:
            return self.nodes[index]
        counts = self._devices_per_node
        per_node = counts[index] if 0 <= index < len(counts) else 0
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
#: NVLink 3 as the a100x8 preset has it: 232 GB/s is the all-reduce bus bandwidth nccl-tests reaches on 8 A100s
#: (NVIDIA, GTC24 S62129), not the 300 GB/s line rate, because the ring formulas price bytes at bus bandwidth.
NVLINK3 = LinkSpec(bandwidth=232e9, latency=2e-6, name="nvlink3")

"""Where a mesh's communication groups sit on the machine: for each axis, the distinct placements of its groups
(ranks per node, nodes, the node link and network share they meet), found on arrays of node ids. The base of
:class:`~unity_eq.cost.model.CostModel`, which prices collectives on them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from unity_eq.ir import Mesh, machine_order
from unity_eq.machine import GroupTopology, LinkSpec, Machine

MASK_KINDS = 62  # kinds of node link / network share told apart with int64 bit masks (more: a slower path)


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


@dataclass
class MeshTopology:
    """How ``mesh``'s axes lie on ``machine`` (computed once per axis, shared between meshes when it can be)."""

    machine: Machine
    mesh: Mesh
    _topology: dict[str, tuple[GroupTopology, ...]] = field(default_factory=dict, repr=False, kw_only=True)
    _uneven: dict[str, bool] = field(default_factory=dict, repr=False, kw_only=True)
    _rank_node_array: np.ndarray | None = field(default=None, repr=False, kw_only=True)
    _kinds: tuple[np.ndarray, np.ndarray, list[LinkSpec], list[LinkSpec | None], dict[int, int]] | None = field(
        default=None, repr=False, kw_only=True
    )

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

"""Collectives as alpha-beta times on one communication group's topology: NCCL's ring algorithms, flat inside a
node and hierarchical over nodes (the table in :mod:`unity_eq.cost`). :class:`~unity_eq.cost.model.CostModel`
prices an axis by its slowest group."""

from __future__ import annotations

from dataclasses import dataclass

from unity_eq.machine import GroupTopology, LinkSpec


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


def ring_all_reduce(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    if t.m == 1:
        return _ring(2 * (t.n - 1), 2 * (t.n - 1) / t.n, s, t.local)
    k, m = t.k, t.m
    in_node = _ring(k - 1, (k - 1) / k, s, t.local)  # reduce-scatter, and at the end all-gather, in the node
    return in_node + _ring(2 * (m - 1), 2 * (m - 1) / m, s / k, t.network) + in_node


def ring_all_gather(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    if t.m == 1:
        return _ring(t.n - 1, (t.n - 1) / t.n, s, t.local)
    k, m = t.k, t.m
    return _ring(m - 1, (m - 1) / m, s / k, t.network) + _ring(k - 1, (k - 1) / k, s, t.local)


def ring_all_to_all(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1 or t.m == 1:  # inside one node: the all-gather's ring (n - 1 steps of s / n)
        return ring_all_gather(t, s)
    k, n = t.k, t.n
    return _ring(k - 1, (k - 1) / n, s, t.local) + _ring(n - k, (n - k) / n, s, t.network)


def ring_send(t: GroupTopology, s: float) -> AlphaBeta:
    if t.n <= 1:
        return AlphaBeta()
    return _ring(1, 1.0, s, t.network if t.network is not None else t.local)

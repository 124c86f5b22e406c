"""Cutting a chain of pieces into contiguous pipeline stages: the slowest stage as fast as possible, every
stage within device memory.

A stage's time and memory are sums over its pieces plus terms of its position (1F1B's first stages hold more
microbatches), so both grow as a stage takes more pieces. For a bound ``T`` on the slowest stage, filling
stages greedily from the front — each takes as many pieces as stay under ``T`` and fit — uses the fewest
stages; the smallest ``T`` that needs at most ``p`` stages is found by bisection between the largest single
piece and the whole chain. A greedy cover with fewer than ``p`` stages is then split further (splitting a
stage never makes it slower or larger).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

__all__ = ["Chain", "StageCuts", "StageFunctions", "partition"]

ITERATIONS = 40


class Chain(Protocol):
    """Pieces in a row, with a stage's seconds and bytes per device for any run ``i..j-1`` of them."""

    @property
    def count(self) -> int: ...

    def seconds(self, stage: int, i: int, j: int) -> float: ...

    def nbytes(self, stage: int, i: int, j: int) -> float: ...


@dataclass
class StageCuts:
    """A :class:`Chain` from two functions (stages of different device kinds price pieces differently)."""

    count: int
    seconds_of: Callable[[int, int, int], float]
    nbytes_of: Callable[[int, int, int], float]

    def seconds(self, stage: int, i: int, j: int) -> float:
        return self.seconds_of(stage, i, j)

    def nbytes(self, stage: int, i: int, j: int) -> float:
        return self.nbytes_of(stage, i, j)


class StageFunctions:
    """Per-piece seconds and bytes, as prefix sums, and how a stage's position adds to them."""

    def __init__(
        self,
        seconds: Sequence[float],
        fixed_bytes: Sequence[float],
        held_bytes: Sequence[float],
        extra_seconds: Callable[[int, int, int], float],
        extra_bytes: Callable[[int, int, int], float],
        held_copies: Callable[[int], int],
    ) -> None:
        """``seconds``: a piece's time per microbatch; ``fixed_bytes``: its memory independent of the stage's
        position (weights and their state); ``held_bytes``: its memory per microbatch in flight;
        ``extra_seconds(stage, i, j)`` / ``extra_bytes(stage, i, j)``: what a stage of pieces ``i..j-1`` adds
        (sending its boundary activations; a buffer); ``held_copies(stage)``: microbatches it holds."""
        self.time = [0.0, *accumulate(seconds)]
        self.fixed = [0.0, *accumulate(fixed_bytes)]
        self.held = [0.0, *accumulate(held_bytes)]
        self.extra_seconds = extra_seconds
        self.extra_bytes = extra_bytes
        self.held_copies = held_copies

    @property
    def count(self) -> int:
        return len(self.time) - 1

    def seconds(self, stage: int, i: int, j: int) -> float:
        return self.time[j] - self.time[i] + self.extra_seconds(stage, i, j)

    def nbytes(self, stage: int, i: int, j: int) -> float:
        copies = self.held_copies(stage)
        return self.fixed[j] - self.fixed[i] + copies * (self.held[j] - self.held[i]) + self.extra_bytes(stage, i, j)


def _greedy(f: Chain, stages: int, bound: float, capacity: Sequence[float]) -> list[tuple[int, int]] | None:
    """Fill stages from the front under ``bound`` seconds and ``capacity`` bytes; None if more than
    ``stages`` stages are needed or a single piece breaks a limit."""
    cuts: list[tuple[int, int]] = []
    i, n = 0, f.count
    while i < n:
        s = len(cuts)
        if s == stages:
            return None
        j = i + 1
        if f.seconds(s, i, j) > bound or f.nbytes(s, i, j) > capacity[s]:
            return None
        lo, hi = j, n  # the last j that keeps both limits (both grow with j)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if f.seconds(s, i, mid) <= bound and f.nbytes(s, i, mid) <= capacity[s]:
                lo = mid
            else:
                hi = mid - 1
        cuts.append((i, lo))
        i = lo
    return cuts


def _spread(cuts: list[tuple[int, int]], stages: int, f: Chain) -> list[tuple[int, int]]:
    """Split the slowest splittable stage in two until there are ``stages``."""
    cuts = list(cuts)
    while len(cuts) < stages:
        options = [k for k, (i, j) in enumerate(cuts) if j - i > 1]
        if not options:
            break
        k = max(options, key=lambda k: f.seconds(k, *cuts[k]))
        i, j = cuts[k]
        middle = (i + j) // 2
        cuts[k : k + 1] = [(i, middle), (middle, j)]
    return cuts


def partition(f: Chain, stages: int, capacity: float | Sequence[float]) -> list[tuple[int, int]] | None:
    """Contiguous stages ``[(first, end), ...]`` of the pieces minimizing the slowest stage within
    ``capacity`` bytes per device (one figure, or one per stage); None when no cut into ``stages`` fits."""
    if stages > f.count:
        return None
    capacity = [capacity] * stages if isinstance(capacity, int | float) else list(capacity)
    best = _greedy(f, stages, math.inf, capacity)  # memory alone: is there any cut?
    if best is None:
        return None
    hi = max(f.seconds(s, i, j) for s, (i, j) in enumerate(best))  # that cut's slowest stage bounds the best
    lo = 0.0
    for _ in range(ITERATIONS):
        mid = (lo + hi) / 2
        found = _greedy(f, stages, mid, capacity)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
        if hi - lo <= 1e-4 * hi:
            break
    spread = _spread(best, stages, f)
    if len(spread) < stages:
        return None
    if any(f.nbytes(s, i, j) > capacity[s] for s, (i, j) in enumerate(spread)):
        return None  # a split moved pieces to a stage that holds more microbatches
    return spread

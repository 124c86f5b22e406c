"""What the families' instance generators share: the shapes of a rank over the proof ranges' dims, the
orthogonal-array sample the numeric back-up uses, broadcast patterns, absent optional inputs.

A family's ``instances`` must cover its proof ranges completely (docs/verify.md): a bounded proof is exhaustive
over them, so these helpers enumerate, and sample only when ``ranges.sample`` asks for the numeric back-up.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import cache
from typing import Any

from unity_eq.ops.family import InstanceRanges

__all__ = [
    "absent_options",
    "broadcast_positions",
    "oa16",
    "other_shapes",
    "rank_dims",
    "shape_pool",
    "shapes_of_rank",
]


def _gf4_mul(a: int, b: int) -> int:
    if not a or not b:
        return 0
    log = {1: 0, 2: 1, 3: 2}
    exp = [1, 2, 3]
    return exp[(log[a] + log[b]) % 3]


@cache
def oa16() -> tuple[tuple[int, ...], ...]:
    """OA(16, 5, 4, 2): rows (x, y, x+y, x+2y, x+3y) over GF(4)."""
    rows = []
    for x in range(4):
        for y in range(4):
            rows.append((x, y, x ^ y, x ^ _gf4_mul(2, y), x ^ _gf4_mul(3, y)))
    return tuple(rows)


@cache
def shapes_of_rank(
    rank: int, dims: tuple[int, ...] = (1, 2, 3, 4), sample: bool = False
) -> tuple[tuple[int, ...], ...]:
    """Every shape of ``rank`` over ``dims``; with ``sample``, the OA(16) rows for ranks 3 to 5."""
    if rank <= 2 or not sample:
        return tuple(itertools.product(dims, repeat=rank))
    assert len(dims) == 4 and rank <= 5
    return tuple(tuple(dims[row[i]] for i in range(rank)) for row in oa16())


def rank_dims(cfg: InstanceRanges, rank: int) -> tuple[int, ...]:
    """The dims of tensors of ``rank``: ``dims`` up to rank 3, ``rank4_dims`` beyond."""
    return cfg.dims if rank <= 3 or cfg.sample else cfg.rank4_dims


def shape_pool(cfg: InstanceRanges, ranks: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Every shape of the given ranks (default: 0 to ``max_rank``) over the ranges' dims."""
    ranks = range(cfg.max_rank + 1) if ranks is None else ranks
    return [s for r in ranks for s in shapes_of_rank(r, rank_dims(cfg, r), cfg.sample)]


def other_shapes(cfg: InstanceRanges) -> list[tuple[int, ...]]:
    """Shapes of rank 1 to ``other_rank`` (the families whose rules do not need rank 4)."""
    return shape_pool(cfg, range(1, min(cfg.other_rank, cfg.max_rank) + 1))


def broadcast_positions(k: int, dims: Sequence[int]) -> list[tuple[int, tuple[bool, ...]]]:
    """Every (output size, which of the ``k`` operands are size 1 there) at one position: size 1 makes
    every operand 1 (one pattern); a larger size any pattern that leaves one operand full."""
    out: list[tuple[int, tuple[bool, ...]]] = []
    for n in dims:
        for ones in itertools.product((False, True), repeat=k):
            if (n == 1 and any(ones)) or (n > 1 and all(ones)):
                continue
            out.append((n, ones))
    return out


def absent_options(tensors: Sequence[Any]) -> list[frozenset[int]]:
    """Which optional operands are absent: none, each alone, all together."""
    optional = [i for i, t in enumerate(tensors) if t.optional]
    options = [frozenset[int]()] + [frozenset([i]) for i in optional]
    if len(optional) > 1:
        options.append(frozenset(optional))
    return options

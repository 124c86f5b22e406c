"""What the families' instance generators share: the shapes of a rank over the proof ranges' dims, the
orthogonal-array sample the numeric back-up uses, broadcast patterns, absent optional inputs.

A family's ``instances`` must cover its proof ranges completely (docs/verify.md): a bounded proof is exhaustive
over them, so these helpers enumerate, and sample only when ``ranges.sample`` asks for the numeric back-up.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

from unity_eq.ops.family import InstanceRanges

__all__ = [
    "absent_options",
    "broadcast_positions",
    "broadcastable_to",
    "oa16",
    "other_shapes",
    "rank_dims",
    "rows_with_one_wide_dim",
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


#: rank-4 shapes with one odd dim (3, the others 2): rank 4's dims ({1, 2, 4}) are all even or 1, so a rule that
#: halves a dim (``h = w / 2``) was "proven" at rank 4 where an RGB width of 3 breaks it (issue 21's fourth
#: adversary); one per position keeps the rank-4 pool 5 % larger, not 40 % (every shape with a 3)
ODD_RANK4 = tuple(tuple(3 if i == p else 2 for i in range(4)) for p in range(4))


def shape_pool(cfg: InstanceRanges, ranks: Sequence[int] | None = None) -> list[tuple[int, ...]]:
    """Every shape of the given ranks (default: 0 to ``max_rank``) over the ranges' dims, and at rank 4 the
    shapes of :data:`ODD_RANK4`."""
    ranks = range(cfg.max_rank + 1) if ranks is None else ranks
    pool = [s for r in ranks for s in shapes_of_rank(r, rank_dims(cfg, r), cfg.sample)]
    if 4 in ranks and not cfg.sample and 3 not in cfg.rank4_dims:
        pool += ODD_RANK4
    return pool


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


def broadcastable_to(target: Sequence[int]) -> list[tuple[int, ...]]:
    """Every shape that broadcasts unidirectionally to ``target`` (ONNX's rule for Gemm's C): each rank up to
    ``target``'s, each trailing dim either ``target``'s or 1, without repeats (where a dim of ``target`` is 1
    the two agree). All of them, since a rule's domain records an operand's rank, not its sizes: Gemm's C of
    rank 1 is ``[n]`` or ``[1]``, and a rule right for one only passed while ``[1]`` was missing (issue 21)."""
    out: dict[tuple[int, ...], None] = {}
    for rank in range(len(target) + 1):
        tail = target[len(target) - rank :]
        for ones in itertools.product((False, True), repeat=rank):
            out.setdefault(tuple(1 if one else dim for dim, one in zip(tail, ones, strict=True)), None)
    return list(out)


def rows_with_one_wide_dim(
    k: int, rank: int, wide: int, every_pattern: bool = False
) -> Iterator[tuple[tuple[int, tuple[bool, ...]], ...]]:
    """Rank-4 rows with one position of size ``wide`` (4), every operand pattern there, and every other
    position 1 or 2 with every operand full. A dim cut on both axes of a 2 x 2 mesh needs a size of 4, and
    at most one dim can be (each axis cuts one dim): with dims 1-2 only, a rule that gathers the two axes in
    the wrong order is "proven" (``adv-rank4-2axis-add-same-dim-combine-order``). The other positions stay
    full: every broadcast pattern there as well multiplied the nested attention rules' cases by four. The
    size sweep (numeric, ``every_pattern``) takes every pattern there too: an operand broadcast at another
    dim while one dim is cut on both axes (issue 21's sixth adversary)."""
    full = tuple(False for _ in range(k))
    narrow = broadcast_positions(k, (1, 2)) if every_pattern else [(1, full), (2, full)]
    for p in range(rank):
        for rest in itertools.product(narrow, repeat=rank - 1):
            for w in broadcast_positions(k, (wide,)):
                yield (*rest[:p], w, *rest[p:])


def absent_options(tensors: Sequence[Any]) -> list[frozenset[int]]:
    """Which optional operands are absent: none, each alone, all together."""
    optional = [i for i, t in enumerate(tensors) if t.optional]
    options = [frozenset[int]()] + [frozenset([i]) for i in optional]
    if len(optional) > 1:
        options.append(frozenset(optional))
    return options


#: every value of ONNX's ``auto_pad`` (Conv and the windowed poolings)
AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")

#: one window: (spatial, kernel, pads, strides, dilations, auto_pad), pads begins then ends
Window = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], str]


@cache
def window_product(pool: bool) -> tuple[Window, ...]:
    """Every 1-D window of the product: sizes 1-6, kernels 1-3, strides 1-3, dilations 1-2, every
    ``auto_pad`` (``pads`` empty unless NOTSET, as ONNX requires) and, with NOTSET, every pair of pads 0-2
    (poolings: pads below the kernel, ONNX's rule). A product, not a sample: the attributes interact (a
    dilated window with padding, a stride that leaves a remainder, SAME padding that is uneven), so a rule
    that is right for one combination only meets the others. Sizes 5 and 6 are not multiples of the
    strides 2 and 4 and 3 and 4, so a window that divides evenly is not the only kind (issue 21)."""
    out: list[Window] = []
    for size, k, s, d in itertools.product(range(1, 7), (1, 2, 3), (1, 2, 3), (1, 2)):
        for auto in AUTO_PADS:
            if pool and auto.startswith("SAME") and d > 1:
                continue  # onnxruntime pads these for the undilated kernel: not modeled (pooling.py)
            if auto != "NOTSET":
                pad_options: list[tuple[int, ...]] = [()]
            else:
                pad_options = [(b, e) for b in range(3) for e in range(3) if not pool or (b < k and e < k)]
            for pads in pad_options:
                if size + sum(pads or (0,)) < d * (k - 1) + 1 and auto in ("NOTSET", "VALID"):
                    continue  # the window does not fit the (padded) input
                out.append(((size,), (k,), pads, (s,), (d,), auto))
    return tuple(out)


@cache
def window_pairs(pool: bool) -> tuple[Window, ...]:
    """2-D windows whose two axes differ: each 1-D window of :func:`window_product` beside another of the
    same ``auto_pad`` (every seventh, shifted), so that every attribute is asymmetric somewhere and a rule
    that mixes up the axes' pads, strides or dilations meets a case where that matters."""
    out: list[Window] = []
    for auto in AUTO_PADS:
        ones = [w for w in window_product(pool) if w[5] == auto]
        for i in range(0, len(ones), 7):
            a, b = ones[i], ones[(i * 5 + 3) % len(ones)]
            pads = (a[2][0], b[2][0], a[2][1], b[2][1]) if auto == "NOTSET" else ()
            out.append(((*a[0], *b[0]), (*a[1], *b[1]), pads, (*a[3], *b[3]), (*a[4], *b[4]), auto))
    return tuple(out)


@cache
def tiling_windows() -> tuple[Window, ...]:
    """2-D windows whose kernel equals their stride in both axes (non-overlapping pooling, the usual 2x2
    stride 2), pads 0 and dilations 1, on every height 1-6 and widths 1-3 that the kernel fits: the pairs of
    :func:`window_pairs` never make the kernel and the stride equal in both axes, so a rule guarded by
    ``(= ks st)`` had no case (issue 21's adversary: a split of H that divides by the kernel while its chunks
    do not)."""
    out: list[Window] = []
    for k1, k2, h, w in itertools.product((1, 2, 3), (1, 2, 3), range(1, 7), (1, 2, 3)):
        if h >= k1 and w >= k2:
            out.append(((h, w), (k1, k2), (0, 0, 0, 0), (k1, k2), (1, 1), "NOTSET"))
    return tuple(out)


#: the sizes of the axis a patch window is split along (kernel = stride = 2): under a split into n = 2, 3, 4
#: pieces, every n meets a piece below the kernel (1: H = 2, 3, 4) and one equal to it (2: H = 4, 6, 8, the
#: multiples of n x kernel a patchify split asks for), n = 2 also an odd piece past the dilated span (3: H = 6)
#: and one of two windows (4: H = 8); 1 is an input shorter than the kernel (only padded windows fit)
PATCH_SPLIT_SIZES = (1, 2, 3, 4, 6, 8)
#: the sizes of the other axis: one odd, one even (a guard ``(= 0 (% W kw))`` both ways), each at least the
#: longest span (kernel 2, dilation 2: 3), so every pads x dilations combination of that axis fits
PATCH_OTHER_SIZES = (3, 4)
#: one axis of a patch window: (kernel = stride, begin pad, end pad, dilation); kernel 1 is the identity
#: along its axis (no pad is below it, a dilation changes nothing), kernel 2 takes every pad 0-1 and dilation
#: 1-2
PATCH_AXES: tuple[tuple[int, int, int, int], ...] = (
    (1, 0, 0, 1),
    *((2, b, e, d) for b, e, d in itertools.product((0, 1), (0, 1), (1, 2))),
)


@cache
def patch_windows() -> tuple[Window, ...]:
    """2-D windows whose kernel equals their stride (patch pooling, the pattern the pooling split rules use)
    with every pad 0-1 at each of the four positions, every dilation 1-2 in each axis: a product, since the
    escapes of issue 21 lived in the combinations (a begin pad on H with kernel = strides and dilations 1;
    a dilated window past its stride, where ceil_mode adds a window). Kernel 2 in each axis, or 1 in one of
    them: with kernel = stride k, pads below k and dilations 1-2, what an axis does is the grid's offset
    from the begin pad, whether the dilated span (k - 1) d + 1 reaches past the stride, whether
    H + pads - span leaves a remainder for ceil_mode, and whether a split's pieces are multiples of k; k = 2
    gives each of these both ways (kernel 3 only adds other remainders: its unpadded windows are in
    :func:`tiling_windows`, its padded 1-D ones in :func:`window_product`). Sizes: one axis over
    :data:`PATCH_SPLIT_SIZES` (the axis a rule splits), the other over :data:`PATCH_OTHER_SIZES`, both
    ways round: a split along one axis does the same to every column of the other, so that axis only has to
    take each pattern a guard can test (its pads and dilation, all here; its size's parity), not every size;
    a kernel-1 axis keeps the other sizes (it is the identity, its size matters only to a guard)."""
    sizes = [(h, w) for h in PATCH_SPLIT_SIZES for w in PATCH_OTHER_SIZES]
    sizes += [(h, w) for h in PATCH_OTHER_SIZES for w in PATCH_SPLIT_SIZES if (h, w) not in sizes]
    out: list[Window] = []
    for (kh, bh, eh, dh), (kw, bw, ew, dw) in itertools.product(PATCH_AXES, repeat=2):
        if kh == kw == 1:
            continue  # no window at all: tiling_windows has the 1 x 1 kernel
        for h, w in sizes:
            if (kh == 1 and h not in PATCH_OTHER_SIZES) or (kw == 1 and w not in PATCH_OTHER_SIZES):
                continue
            if h + bh + eh < dh * (kh - 1) + 1 or w + bw + ew < dw * (kw - 1) + 1:
                continue  # the window does not fit the padded input
            if (h, dh) == (1, 2) or (w, dw) == (1, 2):
                continue  # both taps in the padding: no value (the case would be skipped)
            out.append(((h, w), (kh, kw), (bh, bw, eh, ew), (kh, kw), (dh, dw), "NOTSET"))
    return tuple(out)


@cache
def square_windows() -> tuple[Window, ...]:
    """2-D windows with the same kernel, stride, dilation and pads in both axes (pads may differ between
    begin and end) on inputs of height != width (2 and 4: rank-4 dims are {1, 2, 4}): the pairs of
    :func:`window_pairs` differ in every axis, so a rule guarded by equal attributes in H and W (a Conv that
    commutes with swapping H and W) had no case."""
    out: list[Window] = []
    for k, s, d, (h, w) in itertools.product((1, 2, 3), (1, 2), (1, 2), ((2, 4), (4, 2))):
        if d * (k - 1) + 1 > min(h, w):
            continue
        for b, e in ((0, 0), (1, 0), (0, 1), (1, 1)):
            out.append(((h, w), (k, k), (b, b, e, e), (s, s), (d, d), "NOTSET"))
        if d == 1:
            out += [((h, w), (k, k), (), (s, s), (d, d), auto) for auto in AUTO_PADS[1:]]
    return tuple(out)

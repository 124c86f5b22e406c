"""MatMul and Gemm: products that contract one dim.

They shard along the rows of A, the columns of B and (MatMul) any batch dim, each device computing its own
block of the output, and along the contracted dim too: each device's product is a piece of a pending sum
(``Partial``), which an all-reduce completes (Megatron's second MatMul). Gemm, ``alpha * op(A) @ op(B) + beta
* C``, does the same with ``transA``/``transB`` saying where A's rows and B's columns are and C broadcast to
the output. Their rules are in ``rules/parallel/matmul.egg``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.cases import broadcast_positions, broadcastable_to
from unity_eq.ops.family import Instance, InstanceRanges, OpFamily, ShapeError
from unity_eq.ops.spec import Family, OpSpec, float_attr, int_attr, tensor
from unity_eq.ops.tensors import InShapes, Shape, bcast, need, product_hooks

__all__ = ["MATMUL"]

SPECS = (
    OpSpec("MatMul", Family.MATMUL, (tensor("A"), tensor("B"))),
    OpSpec(
        "Gemm",
        Family.GEMM,
        (
            tensor("A"),
            tensor("B"),
            tensor("C", True),
            float_attr("alpha", 1.0),
            float_attr("beta", 1.0),
            int_attr("transA", 0),
            int_attr("transB", 0),
        ),
    ),
)

_KIND = {spec.name: spec.family for spec in SPECS}


# ----------------------------------------------------------------------------------------------------------
# Shapes


def _matmul_shape(a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ShapeError("MatMul of a scalar")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"MatMul contracts {a2[-1]} with {b2[-2]}")
    batch = bcast(a2[:-2], b2[:-2])
    out = (*batch, a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """numpy's matmul (batch dims broadcast, a rank-1 operand a row or a column); Gemm: 2-D A and B, C
    broadcast to ``[M, N]``."""
    if _KIND[op] is Family.MATMUL:
        return _matmul_shape(need(args[0]), need(args[1]))
    a, b, c, _al, _be, ta, tb = args
    a, b = need(a), need(b)
    if len(a) != 2 or len(b) != 2 or ta not in (0, 1) or tb not in (0, 1):
        raise ShapeError("Gemm needs 2-D A and B and transA/transB in {0, 1}")
    m, k = (a[1], a[0]) if ta else a
    k2, n = (b[1], b[0]) if tb else b
    if k != k2:
        raise ShapeError(f"Gemm contracts {k} with {k2}")
    if c is not None and bcast(c, (m, n)) != (m, n):
        raise ShapeError(f"Gemm: C {list(c)} does not broadcast to {[m, n]}")
    return (m, n)


# ----------------------------------------------------------------------------------------------------------
# Semantics


def _matmul(op: str, args: Sequence[Any], bk: Any) -> Any:
    a, b = args
    if getattr(bk, "symbolic", False):
        return _z3_matmul(bk, a, b)
    return np.matmul(a, b)


def _z3_matmul(bk: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy matmul semantics with n-ary sums (canonical for z3)."""
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    ab = np.broadcast_to(a2, (*batch, *a2.shape[-2:]))
    bb = np.broadcast_to(b2, (*batch, *b2.shape[-2:]))
    m, n = a2.shape[-2], b2.shape[-1]
    out = np.empty((*batch, m, n), dtype=object)
    for idx in np.ndindex(*batch) if batch else [()]:
        for i in range(m):
            for j in range(n):
                out[(*idx, i, j)] = bk.total(list(bk.mul(ab[(*idx, i)], bb[(*idx, slice(None), j)])))
    if a.ndim == 1:
        out = out.reshape((*out.shape[:-2], out.shape[-1]))
    if b.ndim == 1:
        out = out.reshape(out.shape[:-1])
    return out


def _gemm(op: str, args: Sequence[Any], bk: Any) -> Any:
    a, b, c, alpha, beta, ta, tb = args
    a = a.T if ta else a
    b = b.T if tb else b
    y = bk.mul(_matmul("MatMul", [a, b], bk), alpha)
    if c is not None:
        y = bk.add(y, bk.mul(np.broadcast_to(c, y.shape), beta))
    return y


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Products as n-ary sums over the backend (numpy's matmul on numbers); alpha and beta scale."""
    if _KIND[op] is Family.MATMUL:
        return _matmul(op, args, bk)
    return _gemm(op, args, bk)


# ----------------------------------------------------------------------------------------------------------
# Instances


def _matmul_instances(ranges: InstanceRanges) -> Iterator[Instance]:
    """Every rank pair 1-4 x 1-4, every (m, k, n), every batch dim with every pattern of which operand is
    size 1 or lacks it (rank-4 pairs: dims ``rank4_dims``)."""
    cfg = ranges
    top = max(2, min(4, cfg.max_rank))
    for ra, rb in itertools.product(range(1, top + 1), repeat=2):
        batch = max(ra, rb) - 2
        dims = cfg.dims if max(ra, rb) <= 3 or cfg.sample else cfg.rank4_dims
        mkn = list(itertools.product(dims, repeat=3))
        positions = list(itertools.product(broadcast_positions(2, dims), repeat=max(0, batch)))
        if cfg.sample and max(ra, rb) >= 3:
            mkn, positions = mkn[::7], positions[::5]
        for (m, k, n), row in itertools.product(mkn, positions):
            ba = [1 if ones[0] else size for size, ones in row][max(0, batch - (ra - 2)) :] if ra > 2 else []
            bb = [1 if ones[1] else size for size, ones in row][max(0, batch - (rb - 2)) :] if rb > 2 else []
            if ra > 2 and rb > 2 and ra != rb:
                # the shorter operand lacks leading batch dims: only where the longer one is full
                lacking = row[: batch - (min(ra, rb) - 2)]
                if any(ones[0 if ra > rb else 1] for _size, ones in lacking):
                    continue
            a = (k,) if ra == 1 else (*ba, m, k)
            b = (k,) if rb == 1 else (*bb, k, n)
            yield {"A": a, "B": b}, {}


def _gemm_instances(ranges: InstanceRanges) -> Iterator[Instance]:
    """Every (m, k, n) over ``dims`` (a product: with an orthogonal array, m == k forced n == 1, so a rule that
    confuses a transposed operand's dims with the other's passed), every transA/transB, C absent or of every
    shape that broadcasts to ``[m, n]`` (``cases.broadcastable_to``: ``[]``, ``[1]``, ``[n]``, ``[1, 1]``,
    ``[1, n]``, ``[m, 1]``, ``[m, n]``; the rarer ones on every other (m, k, n) when sampling)."""
    d = ranges.dims
    for ta, tb in itertools.product((0, 1), repeat=2):
        for i, (m, k, n) in enumerate(itertools.product(d, repeat=3)):
            a = (k, m) if ta else (m, k)
            b = (n, k) if tb else (k, n)
            for c in (None, *broadcastable_to((m, n))):
                if ranges.sample and c is not None and c not in ((m, n), (n,)) and i % 2:
                    continue
                yield {"A": a, "B": b, "C": c}, {"transA": ta, "transB": tb}


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """MatMul's or Gemm's instances (above)."""
    if spec.family is Family.MATMUL:
        return _matmul_instances(ranges)
    return _gemm_instances(ranges)


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Two operations (a multiply and an add) per output element and contracted index."""
    out = math.prod(out_shape)
    kind = _KIND[op]
    if kind is Family.MATMUL and in_shapes[0]:
        return 2.0 * out * in_shapes[0][-1]
    if kind is Family.GEMM and in_shapes[0]:
        return 2.0 * out * math.prod(in_shapes[0]) / max(out_shape[0], 1)  # K = |A| / M, either layout
    return float(out)


# ----------------------------------------------------------------------------------------------------------
# Shape-generic axioms


def _axioms_matmul(v: Any) -> None:
    """MatMul: rows, batch, columns, contraction (a pending sum)."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    a, b, d, da, db, i, n, ch, rel, FA, P = v.symbols("a b d da db i n ch rel FA P")
    mm = v.op("MatMul")
    v.add(
        "MatMul",
        FA(
            [a, b, d, da, i, n],
            z3.Implies(rel["mm-row"](mm(a, b), d, da), mm(ch(a, da, i, n), b) == ch(mm(a, b), d, i, n)),
            patterns=[P(mm(ch(a, da, i, n), b), rel["mm-row"](mm(a, b), d, da))],
        ),
    )
    v.add(
        "MatMul",
        FA(
            [a, b, d, da, db, i, n],
            z3.Implies(
                rel["mm-batch"](mm(a, b), d, da, db),
                mm(ch(a, da, i, n), ch(b, db, i, n)) == ch(mm(a, b), d, i, n),
            ),
            patterns=[P(mm(ch(a, da, i, n), ch(b, db, i, n)), rel["mm-batch"](mm(a, b), d, da, db))],
        ),
    )
    v.add(
        "MatMul",
        FA(
            [a, b, d, db, i, n],
            z3.Implies(rel["mm-col"](mm(a, b), d, db), mm(a, ch(b, db, i, n)) == ch(mm(a, b), d, i, n)),
            patterns=[P(mm(a, ch(b, db, i, n)), rel["mm-col"](mm(a, b), d, db))],
        ),
    )
    v.add(
        "MatMul",
        FA(
            [a, b, da, db, i, n],
            z3.Implies(
                z3.And(rel["mm-k"](mm(a, b), da, db), v.div(a, da, n), v.div(b, db, n)),
                v.is_partial(mm(ch(a, da, i, n), ch(b, db, i, n)), mm(a, b), i, n),
            ),
            patterns=[mm(ch(a, da, i, n), ch(b, db, i, n))],
        ),
    )


def _axioms_gemm(v: Any) -> None:
    """Gemm = alpha * op(A) @ op(B) + beta * C."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    a, b, c, dc, i, n, k, ta, tb, al, be, ch, rel, FA = v.symbols("a b c dc i n k ta tb al be ch rel FA")
    gm = v.op("Gemm")

    def gemm(a_: Any, b_: Any, c_: Any) -> Any:
        return gm(a_, b_, c_, al, be, ta, tb)

    full = gemm(a, b, c)
    gb = [a, b, c, al, be, ta, tb, i, n]
    v.add(
        "Gemm",
        FA(
            [*gb, k],
            z3.Implies(
                z3.And(k == ta, rel["bc-bcast"](c, full, 0)),
                gemm(ch(a, k, i, n), b, c) == ch(full, 0, i, n),
            ),
            patterns=[gemm(ch(a, k, i, n), b, c)],
        ),
    )
    v.add(
        "Gemm",
        FA(
            [*gb, k, dc],
            z3.Implies(
                z3.And(k == ta, rel["bc-dim"](c, full, 0, dc)),
                gemm(ch(a, k, i, n), b, ch(c, dc, i, n)) == ch(full, 0, i, n),
            ),
            patterns=[gemm(ch(a, k, i, n), b, ch(c, dc, i, n))],
        ),
    )
    v.add(
        "Gemm",
        FA(
            [*gb, k],
            z3.Implies(
                z3.And(k == 1 - tb, rel["bc-bcast"](c, full, 1)),
                gemm(a, ch(b, k, i, n), c) == ch(full, 1, i, n),
            ),
            patterns=[gemm(a, ch(b, k, i, n), c)],
        ),
    )
    v.add(
        "Gemm",
        FA(
            [*gb, k, dc],
            z3.Implies(
                z3.And(k == 1 - tb, rel["bc-dim"](c, full, 1, dc)),
                gemm(a, ch(b, k, i, n), ch(c, dc, i, n)) == ch(full, 1, i, n),
            ),
            patterns=[gemm(a, ch(b, k, i, n), ch(c, dc, i, n))],
        ),
    )
    kb = z3.Int("kb")
    nogemm = gm(a, b, v.none, al, be, ta, tb)
    v.add(
        "Gemm",
        FA(
            [a, b, al, be, ta, tb, i, n, k, kb],
            z3.Implies(
                z3.And(k == 1 - ta, kb == tb, v.div(a, k, n), v.div(b, kb, n)),
                v.is_partial(gm(ch(a, k, i, n), ch(b, kb, i, n), v.none, al, be, ta, tb), nogemm, i, n),
            ),
            patterns=[gm(ch(a, k, i, n), ch(b, kb, i, n), v.none, al, be, ta, tb)],
        ),
    )


def axioms(v: Any) -> None:
    """MatMul's and Gemm's slices of the output from slices of the operands, and their pending sums."""
    _axioms_matmul(v)
    _axioms_gemm(v)


def _bias(in_shapes: InShapes) -> Sequence[int] | None:
    """Gemm's C, a bias whose gradient is a sum of the output's over its broadcast dims (none for a scalar C).
    The backward is two GEMMs of the forward's FLOPs each: ``dA = dY · Bᵀ`` (reads the gradient and B, writes
    A's size) and ``dB = Aᵀ · dY`` (reads A and the gradient, writes B's; a B broadcast over A's batch is summed
    inside the GEMM), so MatMul and Gemm keep both operands (:func:`~unity_eq.ops.tensors.product_hooks`); C
    needs nothing. A weight operand is counted with the weights, an activation operand as stored."""
    c = in_shapes[2] if len(in_shapes) > 2 else None
    return c if c is not None and math.prod(c) > 1 else None


MATMUL = OpFamily(
    name="matmul",
    specs=SPECS,
    rule_file="parallel/matmul.egg",
    ranges=(
        "MatMul: every rank pair 1-4 x 1-4, every (m, k, n), every batch dim with every pattern of which operand"
        " is 1 or lacks it (dims 1-4 when both ranks are <= 3, {1, 2, 4} with a rank-4 operand); Gemm: every"
        " (m, k, n) over dims 1-4, every transA/transB, C absent or of every shape that broadcasts to [m, n]"
        " ([], [1], [n], [1, 1], [1, n], [m, 1], [m, n])"
    ),
    compute_class="gemm",
    **product_hooks(("A", "B"), flops, _bias),
    **OpFamily.hooks_in(globals()),
)

"""Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin over a set of axes, dims kept or dropped.

They shard along any dim they keep (each device reduces its own rows), and ReduceSum along a reduced dim too:
each device's sum is a piece of a pending sum (``Partial``), which an all-reduce completes. ReduceMean over a
split, reduced dim first averages over another of its axes on each device and all-gathers that small result.
Their rules are in
``rules/parallel/layout.egg`` with the other data-movement ops, whose ``reduce-map`` analysis they share.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from unity_eq.ops.cases import shape_pool
from unity_eq.ops.family import Instance, InstanceRanges, NodeView, NotModeled, OpFamily, Saved, ShapeError, Work
from unity_eq.ops.spec import Family, OpSpec, int_attr, static, tensor
from unity_eq.ops.tensors import Shape, need, norm_axes, reduce_elements

__all__ = ["REDUCE", "reduce_pairs"]

SPECS = tuple(
    OpSpec(
        name,
        Family.REDUCE,
        (tensor("data"), static("axes", True), int_attr("keepdims", 1), int_attr("noop_with_empty_axes", 0)),
        linear=name == "ReduceSum",
    )
    for name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
)


def _noop(args: Sequence[Any]) -> bool:
    """ONNX's ``noop_with_empty_axes``: with no axes given, the reduction is the identity (not a reduction
    over every dim). With axes given, the attribute changes nothing."""
    return not tuple(args[1]) and len(args) > 3 and bool(int(args[3]))


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """The reduced axes become 1 (``keepdims``) or disappear; no axes reduce every dim, or none with
    ``noop_with_empty_axes`` (the identity)."""
    x, axes, keep = need(args[0]), tuple(args[1]), args[2]
    if _noop(args):
        return tuple(x)
    axes = axes or tuple(range(len(x)))
    if len(set(axes)) != len(axes) or any(not 0 <= a < len(x) for a in axes):
        raise ShapeError(f"reduction axes {list(axes)} for rank {len(x)}")
    return tuple(1 if i in axes else n for i, n in enumerate(x) if keep or i not in axes)


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """Axes sorted and non-negative; no axes means every axis (unless ``noop_with_empty_axes``: not modeled)."""
    in_rank = node.rank(v["data"])
    if not v["axes"]:
        if int(v["noop_with_empty_axes"]):
            raise NotModeled
        v["axes"] = tuple(range(in_rank))
    v["axes"] = norm_axes(v["axes"], in_rank)
    v["noop_with_empty_axes"] = 0
    return v


def reduce_pairs(axes: tuple[int, ...], keepdims: int, rank: int) -> Iterator[tuple[int, int]]:
    """The dims (d, d2) that a reduction over ``axes`` keeps: dim d of the input is dim d2 of the output
    (a negative axis counts from the end, as ONNX says: axes (-1) reduce the last dim)."""
    axes = tuple(a + rank if a < 0 else a for a in axes)
    for d in range(rank):
        if d not in axes:
            yield d, d if keepdims else d - sum(1 for a in axes if a < d)


def guard_facts(op: str, values: Mapping[str, Any], node: NodeView) -> Iterator[tuple[Any, ...]]:
    """``reduce-map``: where each kept dim goes (analysis.egg), for the rules that shard a kept dim. A mean
    over several axes also gets the facts of a mean over each one of them alone, dims kept: the rule that
    splits it along a reduced dim (reduce-mean-split-reduced) averages over one of the others on each device."""
    rank = node.rank(values["data"])
    axes, keep = tuple(values["axes"]), int(values["keepdims"])
    for d, d2 in reduce_pairs(axes, keep, rank):
        yield ("reduce-map", axes, keep, rank, d, d2)
    if op == "ReduceMean" and len(axes) > 1:
        for j in axes:
            for d, d2 in reduce_pairs((j,), 1, rank):
                yield ("reduce-map", (j,), 1, rank, d, d2)


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Sums and means exactly, maxima and minima as the backend's ``largest``/``smallest``; empty axes with
    ``noop_with_empty_axes`` are the identity, as ONNX says. The mean divides with the backend's ``div``,
    which truncates on integer tensors (onnxruntime's int64 ReduceMean of [1, 2] is 1)."""
    x, axes, keep, _nop = args
    if _noop(args):
        return x
    axes = list(axes) or list(range(x.ndim))
    if op == "ReduceMax":
        return reduce_elements(bk, x, axes, bool(keep), bk.largest)
    if op == "ReduceMin":
        return reduce_elements(bk, x, axes, bool(keep), bk.smallest)
    if op in ("ReduceSum", "ReduceMean"):
        s = reduce_elements(bk, x, axes, bool(keep), bk.total)
        return bk.div(s, math.prod(x.shape[a] for a in axes)) if op == "ReduceMean" else s
    # a reduction added to SPECS without semantics here must not be proven as a sum
    raise NotImplementedError(f"{op}: no semantics in unity_eq/ops/reduce.py; add them with its spec")


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Every shape of rank 1 to ``max_rank`` (rank 4 over ``rank4_dims``: at rank 3 every permutation fixing
    dim 0 is its own inverse, so a rule that maps axes through p where p^-1 is needed passed there), every set
    of axes (the empty one: every dim), dims kept or not, ``noop_with_empty_axes`` 0 and 1 (with no axes, 1 is
    the identity)."""
    for shape in shape_pool(ranges, range(1, ranges.max_rank + 1)):
        rank = len(shape)
        for size in range(rank + 1):
            for axes in itertools.combinations(range(rank), size):
                for keep in (0, 1):
                    for nop in (0, 1):
                        yield {"data": shape}, {"axes": axes, "keepdims": keep, "noop_with_empty_axes": nop}


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """One operation per input element."""
    if in_shapes[0]:
        return float(math.prod(in_shapes[0]))
    return float(math.prod(out_shape))


def axioms(v: Any) -> None:
    """A reduction commutes with slicing a dim it keeps (``reduce-map`` says where that dim goes); ReduceSum
    over a sliced dim is a piece of a pending sum; ReduceMean may first average over one of its axes."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, axes, k, kd, d, d2, i, n, ch, rel, FA, P = v.symbols("x axes k kd d d2 i n ch rel FA P")
    for name in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"):
        rd = v.op(name)
        v.add(
            name,
            FA(
                [x, axes, k, kd, d, d2, i, n],
                z3.Implies(
                    rel["reduce-map"](axes, k, v.vlen(v.shape(x)), d, d2),
                    rd(ch(x, d, i, n), axes, k, kd) == ch(rd(x, axes, k, kd), d2, i, n),
                ),
                patterns=[
                    P(
                        rd(ch(x, d, i, n), axes, k, kd),
                        rel["reduce-map"](axes, k, v.vlen(v.shape(x)), d, d2),
                    )
                ],
            ),
        )
    rsum = v.op("ReduceSum")
    v.add(
        "ReduceSum",
        FA(
            [x, axes, k, kd, d, i, n],
            z3.Implies(
                z3.And(rel["vec-contains"](axes, d), v.div(x, d, n)),
                v.is_partial(rsum(ch(x, d, i, n), axes, k, kd), rsum(x, axes, k, kd), i, n),
            ),
            patterns=[rsum(ch(x, d, i, n), axes, k, kd)],
        ),
    )
    # The mean of equal-sized groups' means is the mean: a mean over one of the axes first, dims kept. On the
    # reals only (group ``.reals``): integer means truncate each group's mean.
    rmean = v.op("ReduceMean")
    inner = rmean(x, v.vec_of(d2), 1, kd)
    v.add(
        "ReduceMean.reals",
        FA(
            [x, axes, k, kd, d2],
            z3.Implies(
                z3.And(rel["vec-contains"](axes, d2), *v.vec_of_facts([d2])),
                rmean(inner, axes, k, kd) == rmean(x, axes, k, kd),
            ),
            patterns=[rmean(inner, axes, k, kd)],
        ),
    )


def saved(op: str) -> Saved:
    """ReduceMean and ReduceSum keep nothing (the gradient is broadcast back); ReduceMax and ReduceMin keep
    their input and output (where the extremum was)."""
    if op in ("ReduceMax", "ReduceMin"):
        return Saved(inputs=("data",), output=True)
    return Saved()


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work:
    """ReduceSum's and ReduceMean's gradient broadcasts the output's gradient back to the input's shape (reads
    the small gradient, writes the input's size); ReduceMax's and ReduceMin's also re-read the input and the
    output to find where the extreme was."""
    n_in = math.prod(in_shapes[0]) if in_shapes and in_shapes[0] is not None else math.prod(out_shape)
    n_out = math.prod(out_shape)
    if op in ("ReduceMax", "ReduceMin"):
        return Work(2.0 * n_in, float(n_in + 2 * n_out), float(n_in))
    return Work(float(n_in), float(n_out), float(n_in))


REDUCE = OpFamily(
    name="reduce",
    specs=SPECS,
    rule_file="parallel/layout.egg",
    ranges="every shape of rank 1-4 (rank 4 over {1, 2, 4}), every set of axes (empty included), keepdims 0 and 1, "
    "noop_with_empty_axes 0 and 1",
    **OpFamily.hooks_in(globals()),
)

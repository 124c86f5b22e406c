"""Normalizations along an axis: Softmax and LogSoftmax (along ``axis``), LayerNormalization (over the dims
from ``axis`` on).

They shard along any dim they do not normalize (each device normalizes its own rows): another dim than
Softmax's axis, a dim before LayerNormalization's. Their rules are in ``rules/parallel/layout.egg``. The
verifier models their arithmetic exactly and ``exp``, ``log`` and ``sqrt`` as uninterpreted functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

from unity_eq.ops.cases import shape_pool
from unity_eq.ops.family import Instance, InstanceRanges, NodeView, OpFamily, Saved, ShapeError, Work
from unity_eq.ops.spec import Family, OpSpec, float_attr, int_attr, tensor
from unity_eq.ops.tensors import Shape, bcast, check_axis, need, norm_axis, reduce_elements

__all__ = ["NORMALIZATION"]

SPECS = (
    OpSpec("Softmax", Family.SOFTMAX, (tensor("X"), int_attr("axis", -1))),
    OpSpec("LogSoftmax", Family.SOFTMAX, (tensor("X"), int_attr("axis", -1))),
    OpSpec(
        "LayerNormalization",
        Family.LAYERNORM,
        (
            tensor("X"),
            tensor("Scale"),
            tensor("B", True),
            int_attr("axis", -1),
            float_attr("epsilon", 1e-5),
            int_attr("stash_type", 1),
        ),
    ),
)
_KIND = {spec.name: spec.family for spec in SPECS}


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """The input's shape, ``axis`` in range; LayerNormalization's Scale and B broadcast to the normalized
    shape."""
    if _KIND[op] is Family.SOFTMAX:
        x = need(args[0])
        check_axis(args[1], len(x))
        return x
    x, scale, bias, axis = need(args[0]), need(args[1]), args[2], args[3]
    check_axis(axis, len(x))
    for p in (scale, bias):
        if p is not None and bcast(p, x[axis:]) != x[axis:]:
            raise ShapeError("LayerNormalization: Scale/B do not broadcast to the normalized shape")
    return x


def _softmax(op: str, args: Sequence[Any], bk: Any) -> Any:
    x, axis = args
    e = bk.apply("exp", x)
    s = reduce_elements(bk, e, [axis], True, bk.total)
    if op == "Softmax":
        return bk.div(e, s)
    return bk.sub(x, bk.apply("log", s))


def _layernorm(op: str, args: Sequence[Any], bk: Any) -> Any:
    x, scale, bias, axis, eps, _stash = args
    axes = list(range(axis, x.ndim))
    count = math.prod(x.shape[axis:])
    mean = bk.div(reduce_elements(bk, x, axes, True, bk.total), count)
    centered = bk.sub(x, mean)
    var = bk.div(reduce_elements(bk, bk.mul(centered, centered), axes, True, bk.total), count)
    y = bk.mul(bk.div(centered, bk.apply("sqrt", bk.add(var, eps))), scale)
    return bk.add(y, bias) if bias is not None else y


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Sums, means and divisions exactly; ``exp``, ``log`` and ``sqrt`` as the backend's functions."""
    if _KIND[op] is Family.SOFTMAX:
        return _softmax(op, args, bk)
    return _layernorm(op, args, bk)


def _softmax_instances(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """Every shape of rank 1 to ``max_rank`` (rank 4 over ``rank4_dims``), every axis."""
    for shape in shape_pool(cfg, range(1, cfg.max_rank + 1)):
        for axis in range(len(shape)):
            yield {"X": shape}, {"axis": axis}


def _param_shapes(norm: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes a LayerNormalization Scale (or B) may take: the normalized shape, every shape of lower rank
    that broadcasts to it (its trailing dims), and ones where it is larger than 1 (broadcast within a dim)."""
    out = [norm, *(norm[j:] for j in range(1, len(norm))), tuple(1 for _ in norm)]
    return list(dict.fromkeys(out))


def _layernorm_instances(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """Every shape of rank 1 to ``max_rank`` (rank 4 over ``rank4_dims``), every axis, every Scale shape of
    :func:`_param_shapes` (a rule that reads Scale as the full normalized shape met a lower-rank one only
    here), B absent or of Scale's shape."""
    for shape in shape_pool(cfg, range(1, cfg.max_rank + 1)):
        for axis in range(len(shape)):
            norm = shape[axis:]
            # rank 4 is there for the permutations (docs/verify.md): its Scale is the normalized shape; the
            # lower-rank Scales are shown at ranks 1-3, where how Scale broadcasts is the same
            for scale in _param_shapes(norm) if len(shape) <= 3 else [norm]:
                # B beside each Scale: absent, and present in Scale's own shape (B of every other shape
                # broadcasts the same way as Scale does, which the Scale shapes already cover)
                for bias in (None, scale):
                    yield {"X": shape, "Scale": scale, "B": bias}, {"axis": axis}


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Every shape of rank 1 to ``other_rank``, every axis; LayerNormalization with and without B."""
    if spec.family is Family.SOFTMAX:
        return _softmax_instances(spec, ranges)
    return _layernorm_instances(spec, ranges)


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """The axis made non-negative (ONNX's default -1 is the last dim)."""
    v["axis"] = norm_axis(v["axis"], node.rank(v["X"]))
    return v


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Five operations per output element."""
    return 5.0 * math.prod(out_shape)


def axioms(v: Any) -> None:
    """Normalizations along an axis commute with slicing another (LayerNorm: an outer dim)."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, b, w, d, i, n, k, axis, eps, ch, FA = v.symbols("x b w d i n k axis eps ch FA")
    # a negative axis counts from the end (ONNX): -1 is the last dim, so "d is not the axis" is d != axis
    # and d != axis + rank (issue 21: `d != axis` alone let a rule split the softmax axis spelled -1)
    rank = v.vlen(v.shape(x))
    for name in ("Softmax", "LogSoftmax"):
        sm = v.op(name)
        v.add(
            name,
            FA(
                [x, d, axis, i, n],
                z3.Implies(
                    z3.And(d >= 0, d != axis, d != axis + rank),
                    sm(ch(x, d, i, n), axis) == ch(sm(x, axis), d, i, n),
                ),
                patterns=[sm(ch(x, d, i, n), axis)],
            ),
        )
    ln = v.op("LayerNormalization")
    v.add(
        "LayerNormalization",
        FA(
            [x, w, b, axis, eps, k, d, i, n],
            z3.Implies(
                z3.And(d >= 0, d < z3.If(axis < 0, axis + rank, axis)),
                ln(ch(x, d, i, n), w, b, axis, eps, k) == ch(ln(x, w, b, axis, eps, k), d, i, n),
            ),
            patterns=[ln(ch(x, d, i, n), w, b, axis, eps, k)],
        ),
    )


def saved(op: str) -> Saved:
    """Softmax and LogSoftmax keep their output; LayerNormalization its input and scale (and two per-row
    statistics, ``1/hidden`` of the input: not counted)."""
    if op == "LayerNormalization":
        return Saved(inputs=("X", "Scale"))
    return Saved(output=True)


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work:
    """Softmax's and LogSoftmax's gradient, ``y · (g − Σ g·y)``, is one kernel reading the output's gradient and
    the saved output and writing the input's. LayerNormalization's is two kernels, as PyTorch runs it: the input's
    gradient (reads the gradient, the saved input, the scale and the row statistics; writes the input's size)
    and the scale's and bias's (re-reads the gradient and the input, sums over the rows): four reads of the
    input's size where the forward pass makes one, which is why its backward costs more than twice its forward."""
    n = math.prod(out_shape)
    if op != "LayerNormalization":
        return Work(4.0 * n, 2.0 * n, float(n))
    params = sum(math.prod(s) for s in in_shapes[1:] if s is not None)
    rows = n // max(math.prod(in_shapes[1]) if len(in_shapes) > 1 and in_shapes[1] is not None else 1, 1)
    return Work(8.0 * n, 4.0 * n + params + 2.0 * rows, float(n + params), kernels=2.0)


NORMALIZATION = OpFamily(
    name="normalization",
    specs=SPECS,
    rule_file="parallel/layout.egg",
    ranges=(
        "every shape of rank 1-4 (dims 1-4 up to rank 3, {1, 2, 4} at rank 4), every axis; LayerNormalization's"
        " Scale of the normalized shape and (ranks 1-3) of every lower rank and all ones, B absent or as Scale"
    ),
    **OpFamily.hooks_in(globals()),
)

"""The per-channel normalizations of convolutional networks: LRN (windowed across channels) and
BatchNormalization (per channel; inference, and training mode's semantics for the verifier).

LRN shards along the batch; BatchNormalization along the batch and, its parameters sliced alike, the channels.
Their rules are in ``rules/parallel/conv.egg`` with Conv's and the poolings' (unity_eq/ops/conv.py,
unity_eq/ops/pooling.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.family import Instance, InstanceRanges, NodeView, NotModeled, OpFamily, Saved, ShapeError, Work
from unity_eq.ops.spec import Family, OpSpec, float_attr, int_attr, tensor
from unity_eq.ops.tensors import Shape, need, out_dtype, reduce_elements

__all__ = ["CHANNEL_NORM"]

SPECS = (
    OpSpec(
        "LRN",
        Family.LRN,
        (
            tensor("X"),
            float_attr("alpha", 0.0001),
            float_attr("beta", 0.75),
            float_attr("bias", 1.0),
            int_attr("size"),
        ),
    ),
    OpSpec(
        "BatchNormalization",
        Family.BATCHNORM,
        (
            tensor("X"),
            tensor("scale"),
            tensor("B"),
            tensor("input_mean"),
            tensor("input_var"),
            float_attr("epsilon", 1e-5),
            float_attr("momentum", 0.9),
            int_attr("training_mode", 0),
        ),
    ),
)


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """Both keep X's shape (BatchNormalization's parameters are ``[C]``)."""
    x = need(args[0])
    if op == "LRN":
        if len(x) < 3 or args[4] < 1:
            raise ShapeError("LRN needs rank >= 3 and size >= 1")
        return x
    if len(x) < 2 or args[7] not in (0, 1):
        raise ShapeError("BatchNormalization needs rank >= 2 and training_mode 0 or 1")
    for p in args[1:5]:
        if need(p) != (x[1],):
            raise ShapeError(f"BatchNormalization: parameter {list(p)} is not [{x[1]}]")
    return x


def _lrn(args: Sequence[Any], bk: Any) -> Any:
    x, alpha, beta, bias, size = args
    c = x.shape[1]
    lo, hi = (size - 1) // 2, math.ceil((size - 1) / 2)
    sq = bk.mul(x, x)
    out = np.empty(x.shape, dtype=out_dtype(bk))
    for idx in np.ndindex(*x.shape):
        ci = idx[1]
        terms = [sq[(idx[0], j, *idx[2:])] for j in range(max(0, ci - lo), min(c - 1, ci + hi) + 1)]
        out[idx] = bk.total(terms)
    base = bk.add(bk.mul(out, bk.div(alpha, size)), bias)
    return bk.div(x, bk.apply("pow", base, np.broadcast_to(np.array(beta, dtype=object), base.shape)))


def _batchnorm(args: Sequence[Any], bk: Any) -> Any:
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B per channel. Inference (``training_mode`` 0) reads
    the given running statistics; training mode (1) the batch's own: the mean and the (biased) variance over
    every dim but the channels, as ONNX and onnxruntime compute Y (the running statistics it also outputs
    are not modeled: a rule reads Y). Modeled so that a rule that splits the batch "for any training_mode"
    is refuted (issue 21: each device's part of the batch has its own statistics)."""
    x, scale, bias, mean, var, eps, _mom, train = args
    shape = (x.shape[1], *([1] * (x.ndim - 2)))
    s, b, m, v = (p.reshape(shape) for p in (scale, bias, mean, var))
    if train:
        axes = [d for d in range(x.ndim) if d != 1]
        count = math.prod(x.shape[d] for d in axes)
        m = bk.div(reduce_elements(bk, x, axes, True, bk.total), count)
        centered = bk.sub(x, m)
        v = bk.div(reduce_elements(bk, bk.mul(centered, centered), axes, True, bk.total), count)
    return bk.add(bk.mul(bk.div(bk.sub(x, m), bk.apply("sqrt", bk.add(v, eps))), s), b)


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """LRN's sums of squares exactly, ``pow`` and ``sqrt`` uninterpreted."""
    return _lrn(args, bk) if op == "LRN" else _batchnorm(args, bk)


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Every (N, C) over ``dims``: LRN with sizes 1-3, BatchNormalization of rank 2-4 in both modes."""
    for i, (n, c) in enumerate(itertools.product(ranges.dims, repeat=2)):
        if spec.family is Family.LRN:
            yield {"X": (n, c, *((2,), (1, 2), (3,))[i % 3])}, {"size": 1 + i % 3}
            continue
        for spatial in ((), (2,), (2, 1))[: 1 + i % 3]:
            p = (c,)
            tensors = {"X": (n, c, *spatial), "scale": p, "B": p, "input_mean": p, "input_var": p}
            yield tensors, {"training_mode": 0}
            yield tensors, {"training_mode": 1}


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Five operations per output element."""
    return 5.0 * math.prod(out_shape)


def axioms(v: Any) -> None:
    """LRN per batch item; BatchNormalization per batch item and per channel (inference)."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    T, x, b, w, i, n, k, al, be, eps, mom, ch, FA = v.symbols("T x b w i n k al be eps mom ch FA")
    lrn = v.op("LRN")
    bi = z3.Real("bi")
    v.add(
        "LRN",
        FA(
            [x, al, be, bi, k, i, n],
            lrn(ch(x, 0, i, n), al, be, bi, k) == ch(lrn(x, al, be, bi, k), 0, i, n),
            patterns=[lrn(ch(x, 0, i, n), al, be, bi, k)],
        ),
    )
    bn = v.op("BatchNormalization")
    m_, v_ = z3.Const("m", T), z3.Const("v", T)
    v.add(
        "BatchNormalization",
        FA(
            [x, w, b, m_, v_, eps, mom, i, n],
            bn(ch(x, 0, i, n), w, b, m_, v_, eps, mom, 0) == ch(bn(x, w, b, m_, v_, eps, mom, 0), 0, i, n),
            patterns=[bn(ch(x, 0, i, n), w, b, m_, v_, eps, mom, 0)],
        ),
    )
    per_channel = bn(ch(x, 1, i, n), ch(w, 0, i, n), ch(b, 0, i, n), ch(m_, 0, i, n), ch(v_, 0, i, n), eps, mom, 0)
    v.add(
        "BatchNormalization",
        FA(
            [x, w, b, m_, v_, eps, mom, i, n],
            per_channel == ch(bn(x, w, b, m_, v_, eps, mom, 0), 1, i, n),
            patterns=[per_channel],
        ),
    )


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """BatchNormalization in training mode is not modeled (the encoder leaves it opaque)."""
    if op == "BatchNormalization" and int(v["training_mode"]):
        raise NotModeled
    return v


def saved(op: str) -> Saved:
    """LRN keeps its input and output; BatchNormalization its input and scale (the per-channel statistics are
    small)."""
    if op == "LRN":
        return Saved(inputs=("X",), output=True)
    return Saved(inputs=("X", "scale"))


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """BatchNormalization's is LayerNormalization's (the input's gradient, then the scale's and bias's sums
    re-reading the gradient and the input). LRN: not modelled (the flat price)."""
    if op == "LRN":
        return None
    n_out = math.prod(out_shape)
    params = sum(math.prod(s) for s in in_shapes[1:] if s is not None)
    return Work(8.0 * n_out, 4.0 * n_out + params, float(n_out + params), kernels=2.0)


CHANNEL_NORM = OpFamily(
    name="channel-norm",
    specs=SPECS,
    rule_file="parallel/conv.egg",
    ranges="every (N, C) with dims 1-4: LRN with sizes 1-3, BatchNormalization of rank 2-4 with training_mode 0 and 1",
    **OpFamily.hooks_in(globals()),
)

"""Poolings and the per-channel ops of convolutional networks: MaxPool, AveragePool, GlobalAveragePool,
GlobalMaxPool (windowed per (batch, channel) plane), LRN (windowed across channels) and BatchNormalization
(inference: per channel).

The poolings shard along the batch and the channels, LRN along the batch, BatchNormalization along the batch
and, its parameters sliced alike, the channels. Their rules are in ``rules/parallel/conv.egg`` with Conv's
(unity_eq/ops/conv.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.cases import tiling_windows, window_pairs, window_product
from unity_eq.ops.family import Instance, InstanceRanges, NodeView, NotModeled, OpFamily, Saved, ShapeError, Work
from unity_eq.ops.spec import Family, OpSpec, float_attr, int_attr, ints_attr, str_attr, tensor
from unity_eq.ops.tensors import (
    Shape,
    need,
    out_dtype,
    pool_out,
    reduce_elements,
    window_attrs,
    window_defaults,
    window_positions,
)

__all__ = ["POOLING"]

SPECS = (
    OpSpec(
        "MaxPool",
        Family.POOL,
        (
            tensor("X"),
            str_attr("auto_pad", "NOTSET"),
            int_attr("ceil_mode", 0),
            ints_attr("dilations"),
            ints_attr("kernel_shape"),
            ints_attr("pads"),
            int_attr("storage_order", 0),
            ints_attr("strides"),
        ),
    ),
    OpSpec(
        "AveragePool",
        Family.POOL,
        (
            tensor("X"),
            str_attr("auto_pad", "NOTSET"),
            int_attr("ceil_mode", 0),
            int_attr("count_include_pad", 0),
            ints_attr("dilations"),
            ints_attr("kernel_shape"),
            ints_attr("pads"),
            ints_attr("strides"),
        ),
    ),
    OpSpec("GlobalAveragePool", Family.POOL, (tensor("X"),)),
    OpSpec("GlobalMaxPool", Family.POOL, (tensor("X"),)),
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

_KIND = {spec.name: spec.family for spec in SPECS}


# ----------------------------------------------------------------------------------------------------------
# Shapes


def _pool_shape(x: Shape, auto_pad: str, ceil_mode: int, dils: Any, kernel: Any, pads: Any, strides: Any) -> Shape:
    if len(x) < 3 or not kernel:
        raise ShapeError("pooling needs rank >= 3 and a kernel shape")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and any(d != 1 for d in dils):
        # onnxruntime pads for the undilated kernel here (AveragePool's output then differs from the ONNX
        # spec's ceil(size / stride), MaxPool may refuse): not modeled, the encoder leaves it opaque
        raise ShapeError(f"pooling with auto_pad {auto_pad} and dilations {list(dils)} is not modeled")
    kern, pads_, strides_, dils_ = window_attrs(x[2:], kernel, pads, strides, dils, auto_pad)
    if any(p >= k for p, k in zip(pads_, kern + kern, strict=True)):
        raise ShapeError("pooling pads must be smaller than the kernel")
    return (x[0], x[1], *pool_out(x[2:], kern, pads_, strides_, dils_, bool(ceil_mode)))


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """Windowed poolings per plane, global ones to ``[N, C, 1, ...]``; LRN and BatchNormalization keep X's
    shape (BatchNormalization's parameters are ``[C]``, inference only)."""
    if op == "MaxPool":
        x, auto_pad, ceil_mode, dils, kernel, pads, _so, strides = args
        return _pool_shape(need(x), auto_pad, ceil_mode, dils, kernel, pads, strides)
    if op == "AveragePool":
        x, auto_pad, ceil_mode, _cip, dils, kernel, pads, strides = args
        return _pool_shape(need(x), auto_pad, ceil_mode, dils, kernel, pads, strides)
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        x = need(args[0])
        if len(x) < 3:
            raise ShapeError(f"{op} needs rank >= 3")
        return (*x[:2], *([1] * (len(x) - 2)))
    fam = _KIND.get(op)
    if fam is Family.LRN:
        x = need(args[0])
        if len(x) < 3 or args[4] < 1:
            raise ShapeError("LRN needs rank >= 3 and size >= 1")
        return x
    if fam is Family.BATCHNORM:
        x = need(args[0])
        if len(x) < 2 or args[7] not in (0, 1):
            raise ShapeError("BatchNormalization needs rank >= 2 and training_mode 0 or 1")
        for p in args[1:5]:
            if need(p) != (x[1],):
                raise ShapeError(f"BatchNormalization: parameter {list(p)} is not [{x[1]}]")
        return x
    raise ShapeError(f"no semantics for {op}")


# ----------------------------------------------------------------------------------------------------------
# Semantics


def _pool(op: str, args: Sequence[Any], bk: Any) -> Any:
    x = args[0]
    if op in ("GlobalAveragePool", "GlobalMaxPool"):
        axes = list(range(2, x.ndim))
        if op == "GlobalMaxPool":
            return reduce_elements(bk, x, axes, True, bk.largest)
        return bk.div(reduce_elements(bk, x, axes, True, bk.total), math.prod(x.shape[2:]))
    if op == "MaxPool":
        _x, auto_pad, ceil_mode, dils, kernel, pads, _so, strides = args
        cip = 0
    else:
        _x, auto_pad, ceil_mode, cip, dils, kernel, pads, strides = args
    kern, pads_, strides_, dils_ = window_attrs(x.shape[2:], kernel, pads, strides, dils, auto_pad)
    out_sp = pool_out(x.shape[2:], kern, pads_, strides_, dils_, bool(ceil_mode))
    out = np.empty((*x.shape[:2], *out_sp), dtype=out_dtype(bk))
    positions = window_positions(x.shape[2:], out_sp, kern, pads_, strides_, dils_)
    k = len(kern)
    for lead in np.ndindex(*x.shape[:2]):
        for o, taps in positions:
            vals = [x[(*lead, *pos)] for pos, _off in taps]
            if not vals:
                raise ShapeError("a pooling window lies entirely in the padding")
            if op == "MaxPool":
                out[(*lead, *o)] = bk.largest(vals)
            else:
                if cip:  # count the padded positions too (but not past the padded input)
                    count = 1
                    for i in range(k):
                        lo = o[i] * strides_[i] - pads_[i]
                        hi = min(lo + (kern[i] - 1) * dils_[i], x.shape[2 + i] + pads_[i + k] - 1)
                        count *= len(range(lo, hi + 1, dils_[i]))
                else:
                    count = len(vals)
                out[(*lead, *o)] = bk.div(bk.total(vals), count)
    return out


def _lrn(op: str, args: Sequence[Any], bk: Any) -> Any:
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


def _batchnorm(op: str, args: Sequence[Any], bk: Any) -> Any:
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


_EVAL: dict[Family, Callable[[str, Sequence[Any], Any], Any]] = {
    Family.POOL: _pool,
    Family.LRN: _lrn,
    Family.BATCHNORM: _batchnorm,
}


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Maxima as the backend's ``largest``, averages and LRN's sums of squares exactly; ``pow`` and ``sqrt``
    uninterpreted."""
    return _EVAL[_KIND[op]](op, args, bk)


# ----------------------------------------------------------------------------------------------------------
# Instances


_POOL_WINDOWS: list[tuple[Shape, Shape, Shape, Shape, Shape, int, int]] = [
    # (spatial, kernel, pads, strides, dilations, ceil_mode, count_include_pad)
    ((3,), (2,), (0, 0), (1,), (1,), 0, 0),
    ((4,), (3,), (1, 1), (2,), (1,), 1, 1),
    ((2,), (1,), (0, 0), (2,), (1,), 0, 0),
    ((3, 2), (2, 2), (1, 0, 0, 1), (2, 1), (1, 1), 1, 0),
    ((4,), (2,), (0, 0), (1,), (2,), 0, 1),
    ((3, 3), (2, 1), (0, 0, 0, 0), (1, 1), (1, 1), 0, 1),
]


def _pooling(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """The windowed poolings: every window of the product (``cases.window_product``/``window_pairs``:
    sizes 1-6, kernels 1-3, strides 1-3, dilations 1-2, every ``auto_pad``, every pair of pads below the
    kernel; ``tiling_windows``: 2-D kernels equal to their strides) crossed with ``ceil_mode`` 0/1 and
    (AveragePool) ``count_include_pad`` 0/1, on (N, C) = (1, 1) and (2, 3) (a split of 2 along the batch,
    of 3 along the channels); then every (N, C) over ``dims``
    with two of the short windows above (splits of 2-4). A window acts on each (batch, channel) plane alike,
    so the product need not be crossed with every (N, C) (conv.py's argument)."""
    if spec.name in ("MaxPool", "AveragePool") and not cfg.sample:
        cips = (0, 1) if spec.name == "AveragePool" else (0,)
        for (spatial, kern, pads, strides, dils, auto), ceil, cip in itertools.product(
            (*window_product(True), *window_pairs(True), *tiling_windows()), (0, 1), cips
        ):
            given: dict[str, Any] = dict(
                auto_pad=auto, kernel_shape=kern, pads=pads, strides=strides, dilations=dils, ceil_mode=ceil
            )
            if spec.name == "AveragePool":
                given["count_include_pad"] = cip
            for n, c in ((1, 1), (2, 3)):
                yield {"X": (n, c, *spatial)}, given
    for i, (n, c) in enumerate(itertools.product(cfg.dims, repeat=2)):
        if spec.name in ("GlobalAveragePool", "GlobalMaxPool"):
            # 1-D, 2-D and (rank 5) 3-D planes: a rule that takes the pool for a mean over H and W alone
            # meets a depth dim
            for plane in ((3,), (2, 2), (1,), (2, 1, 2))[: 1 + i % 4]:
                yield {"X": (n, c, *plane)}, {}
            continue
        for spatial, kern, pads, strides, dils, ceil, cip in (
            _POOL_WINDOWS[i % 6],
            _POOL_WINDOWS[(i + 3) % 6],
        ):
            given = dict(kernel_shape=kern, pads=pads, strides=strides, dilations=dils, ceil_mode=ceil)
            if spec.name == "AveragePool":
                given["count_include_pad"] = cip
            yield {"X": (n, c, *spatial)}, given


def _lrn_instances(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    for i, (n, c) in enumerate(itertools.product(cfg.dims, repeat=2)):
        spatial = ((2,), (1, 2), (3,))[i % 3]
        yield {"X": (n, c, *spatial)}, {"size": 1 + i % 3}


def _batchnorm_instances(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    for i, (n, c) in enumerate(itertools.product(cfg.dims, repeat=2)):
        for spatial in ((), (2,), (2, 1))[: 1 + i % 3]:
            p = (c,)
            tensors = {"X": (n, c, *spatial), "scale": p, "B": p, "input_mean": p, "input_var": p}
            yield tensors, {"training_mode": 0}
            yield tensors, {"training_mode": 1}


_INSTANCES: dict[Family, Callable[[OpSpec, InstanceRanges], Iterator[Instance]]] = {
    Family.POOL: _pooling,
    Family.LRN: _lrn_instances,
    Family.BATCHNORM: _batchnorm_instances,
}


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Every (N, C) over ``dims``: the windowed poolings with two of the windows above each, the global ones
    with 1-3 planes, LRN with sizes 1-3, BatchNormalization of rank 2-4."""
    return _INSTANCES[spec.family](spec, ranges)


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Poolings: one operation per input or output element, whichever is more; LRN and BatchNormalization:
    five per output element."""
    out = math.prod(out_shape)
    kind = _KIND[op]
    if kind in (Family.BATCHNORM, Family.LRN):
        return 5.0 * out
    if kind is Family.POOL and in_shapes[0]:
        return float(max(out, math.prod(in_shapes[0])))
    return float(out)


# ----------------------------------------------------------------------------------------------------------
# Shape-generic axioms


def axioms(v: Any) -> None:
    """Pooling per (batch, channel) plane; LRN per batch item; BatchNormalization per channel."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    T, x, b, w, d, i, n, k, al, be, eps, mom, dil, ks, pads, st, ap, ch, FA = v.symbols(
        "T x b w d i n k al be eps mom dil ks pads st ap ch FA"
    )
    cm, so_, cip = z3.Int("cm"), z3.Int("so_"), z3.Int("cip")
    mp, avp = v.op("MaxPool"), v.op("AveragePool")
    for name, fn_, extra in (
        ("MaxPool", lambda t: mp(t, ap, cm, dil, ks, pads, so_, st), [ap, cm, dil, ks, pads, so_, st]),
        (
            "AveragePool",
            lambda t: avp(t, ap, cm, cip, dil, ks, pads, st),
            [ap, cm, cip, dil, ks, pads, st],
        ),
        ("GlobalAveragePool", lambda t: v.op("GlobalAveragePool")(t), []),
        ("GlobalMaxPool", lambda t: v.op("GlobalMaxPool")(t), []),
    ):
        v.add(
            name,
            FA(
                [x, d, i, n, *extra],
                z3.Implies(z3.And(d >= 0, d < 2), fn_(ch(x, d, i, n)) == ch(fn_(x), d, i, n)),
                patterns=[fn_(ch(x, d, i, n))],
            ),
        )
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
    """MaxPool and AveragePool: strides, dilations and pads written out (a kernel shape is required, and
    ``SAME`` padding with dilations is not modeled: onnxruntime pads for the undilated kernel there, not as
    ONNX says). BatchNormalization in training mode is not modeled."""
    if op in ("MaxPool", "AveragePool"):
        if not v["kernel_shape"]:
            raise NotModeled
        if str(v["auto_pad"]).startswith("SAME") and any(int(d) != 1 for d in v["dilations"] or ()):
            raise NotModeled
        v.update(window_defaults(v, len(v["kernel_shape"])))
    elif op == "BatchNormalization" and int(v["training_mode"]):
        raise NotModeled
    return v


def saved(op: str) -> Saved:
    """The max poolings keep their input and the argmax (counted as their output's size); the average poolings
    their input (PyTorch keeps it for its shape); LRN its input and output; BatchNormalization its input and
    scale (the per-channel statistics are small)."""
    if op in ("MaxPool", "GlobalMaxPool", "LRN"):
        return Saved(inputs=("X",), output=True)
    if op == "BatchNormalization":
        return Saved(inputs=("X", "scale"))
    return Saved(inputs=("X",))


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """The poolings scatter the output's gradient back over their windows: read it (MaxPool also re-reads the
    saved argmax, the input's size), write the input's gradient. BatchNormalization's is LayerNormalization's
    (the input's gradient, then the scale's and bias's sums re-reading the gradient and the input). LRN: not
    modelled (the flat price)."""
    n_out = math.prod(out_shape)
    n_in = math.prod(in_shapes[0]) if in_shapes and in_shapes[0] is not None else n_out
    kind = _KIND[op]
    if kind is Family.BATCHNORM:
        params = sum(math.prod(s) for s in in_shapes[1:] if s is not None)
        return Work(8.0 * n_out, 4.0 * n_out + params, float(n_out + params), kernels=2.0)
    if kind is Family.LRN:
        return None
    reads_input = op in ("MaxPool", "GlobalMaxPool")
    return Work(float(max(n_in, n_out)), float(n_out + (n_in if reads_input else 0)), float(n_in))


POOLING = OpFamily(
    name="pooling",
    specs=SPECS,
    rule_file="parallel/conv.egg",
    ranges=(
        "MaxPool and AveragePool: every 1-D window of sizes 1-6, kernels 1-3, strides 1-3, dilations 1-2, every"
        " auto_pad and every pair of pads below the kernel, 2-D windows whose axes differ and 2-D kernels equal to"
        " their strides, times ceil_mode"
        " and count_include_pad, on (N, C) = (1, 1) and (2, 3); every (N, C) with dims 1-4 with a few windows;"
        " the global poolings over 1-3 planes (3-D ones: rank 5), LRN with sizes 1-3, BatchNormalization of rank 2-4"
        " with training_mode 0 and 1"
    ),
    **OpFamily.hooks_in(globals()),
)

"""The poolings of convolutional networks: MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool, windowed
per (batch, channel) plane.

They shard along the batch and the channels. Their rules are in ``rules/parallel/conv.egg`` with Conv's
(unity_eq/ops/conv.py) and the per-channel normalizations' (unity_eq/ops/channel_norm.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.cases import PATCH_OTHER_SIZES, patch_windows, tiling_windows, window_pairs, window_product
from unity_eq.ops.family import Instance, InstanceRanges, NodeView, NotModeled, OpFamily, Saved, ShapeError, Work
from unity_eq.ops.spec import Family, OpSpec, int_attr, ints_attr, str_attr, tensor
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
)


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
    """Windowed poolings per plane, global ones to ``[N, C, 1, ...]``."""
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


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Maxima as the backend's ``largest``, averages exactly."""
    return _pool(op, args, bk)


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


def _planes(spatial: Shape, patch: bool) -> tuple[tuple[int, int], ...]:
    """The (N, C) planes a window is crossed with: (1, 1) and (2, 3) (splits of 2 along the batch, of 3
    along the channels). A patch window (``cases.patch_windows``) is there for the splits of H and W, which
    (1, 1) shows; a split of N or C does the same to every plane whatever the window, so it needs of the
    window only each pattern a guard can test (kernels, pads, dilations, the parity of H and W), which the
    patch windows of sizes 3-4 in both axes hold: only those get (2, 3)."""
    if patch and any(size not in PATCH_OTHER_SIZES for size in spatial):
        return ((1, 1),)
    return ((1, 1), (2, 3))


def _pooling(spec: OpSpec, cfg: InstanceRanges) -> Iterator[Instance]:
    """The windowed poolings: every window of the product (``cases.window_product``/``window_pairs``:
    sizes 1-6, kernels 1-3, strides 1-3, dilations 1-2, every ``auto_pad``, every pair of pads below the
    kernel; ``tiling_windows``: 2-D kernels equal to their strides) crossed with ``ceil_mode`` 0/1 and
    (AveragePool) ``count_include_pad`` 0/1, on (N, C) = (1, 1) and (2, 3) (a split of 2 along the batch,
    of 3 along the channels); the patch windows (``cases.patch_windows``: kernel = strides 2 with every pad
    0-1 and dilation 1-2) crossed alike, on (1, 1) and, those of sizes 3-4 in both axes, (2, 3)
    (:func:`_planes`); then every (N, C) over ``dims`` with two of the short windows above (splits of 2-4).
    A window acts on each (batch, channel) plane alike, so the product need not be crossed with every (N, C)
    (conv.py's argument)."""
    if spec.name in ("MaxPool", "AveragePool") and not cfg.sample:
        cips = (0, 1) if spec.name == "AveragePool" else (0,)
        windows = [(w, False) for w in (*window_product(True), *window_pairs(True), *tiling_windows())]
        windows += [(w, True) for w in patch_windows()]
        for ((spatial, kern, pads, strides, dils, auto), patch), ceil, cip in itertools.product(windows, (0, 1), cips):
            given: dict[str, Any] = dict(
                auto_pad=auto, kernel_shape=kern, pads=pads, strides=strides, dilations=dils, ceil_mode=ceil
            )
            if spec.name == "AveragePool":
                given["count_include_pad"] = cip
            for n, c in _planes(spatial, patch):
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


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """The window product, then every (N, C) over ``dims``: the windowed poolings with two of the windows above
    each, the global ones with 1-3 planes."""
    return _pooling(spec, ranges)


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """One operation per input or output element, whichever is more."""
    out = math.prod(out_shape)
    if in_shapes[0]:
        return float(max(out, math.prod(in_shapes[0])))
    return float(out)


# ----------------------------------------------------------------------------------------------------------
# Shape-generic axioms


def axioms(v: Any) -> None:
    """Pooling per (batch, channel) plane."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, d, i, n, dil, ks, pads, st, ap, ch, FA = v.symbols("x d i n dil ks pads st ap ch FA")
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


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """MaxPool and AveragePool: strides, dilations and pads written out (a kernel shape is required, and
    ``SAME`` padding with dilations is not modeled: onnxruntime pads for the undilated kernel there, not as
    ONNX says)."""
    if op in ("MaxPool", "AveragePool"):
        if not v["kernel_shape"]:
            raise NotModeled
        if str(v["auto_pad"]).startswith("SAME") and any(int(d) != 1 for d in v["dilations"] or ()):
            raise NotModeled
        v.update(window_defaults(v, len(v["kernel_shape"])))
    return v


def saved(op: str) -> Saved:
    """The max poolings keep their input and the argmax (counted as their output's size); the average poolings
    their input (PyTorch keeps it for its shape)."""
    if op in ("MaxPool", "GlobalMaxPool"):
        return Saved(inputs=("X",), output=True)
    return Saved(inputs=("X",))


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """The poolings scatter the output's gradient back over their windows: read it (MaxPool also re-reads the
    saved argmax, the input's size), write the input's gradient."""
    n_out = math.prod(out_shape)
    n_in = math.prod(in_shapes[0]) if in_shapes and in_shapes[0] is not None else n_out
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
        " and count_include_pad, on (N, C) = (1, 1) and (2, 3); patch windows (kernel = strides 2, or 2 and 1)"
        " with every pad 0-1 at each position and dilations 1-2 per axis, times ceil_mode and count_include_pad,"
        " one axis over 1, 2, 3, 4, 6, 8 and the other over 3, 4, on (N, C) = (1, 1) and, where both axes are"
        " 3 or 4, (2, 3);"
        " every (N, C) with dims 1-4 with a few windows;"
        " the global poolings over 1-3 planes (3-D ones: rank 5)"
    ),
    **OpFamily.hooks_in(globals()),
)

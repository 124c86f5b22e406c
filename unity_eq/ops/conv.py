"""Conv: an N-dimensional convolution, with groups, pads (or ``auto_pad``), strides and dilations.

It shards along the batch (each device convolves its own images), along the output channels when there is one
group (each device holds its own filters, and the bias's matching piece), and along the input channels
without bias: each device's convolution is a piece of a pending sum (``Partial``), which an all-reduce
completes. Its rules are in ``rules/parallel/conv.egg``, with those of the poolings and per-channel
normalizations (unity_eq/ops/pooling.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.cases import (
    AUTO_PADS,
    oa16,
    patch_windows,
    square_windows,
    tiling_windows,
    window_pairs,
    window_product,
)
from unity_eq.ops.family import Instance, InstanceRanges, NodeView, NotModeled, OpFamily, ShapeError
from unity_eq.ops.spec import Family, OpSpec, int_attr, ints_attr, str_attr, tensor
from unity_eq.ops.tensors import (
    InShapes,
    Shape,
    need,
    out_dtype,
    pool_out,
    product_hooks,
    window_attrs,
    window_defaults,
    window_positions,
)

__all__ = ["CONV"]

SPECS = (
    OpSpec(
        "Conv",
        Family.CONV,
        (
            tensor("X"),
            tensor("W"),
            tensor("B", True),
            str_attr("auto_pad", "NOTSET"),
            ints_attr("dilations"),
            int_attr("group", 1),
            ints_attr("kernel_shape"),
            ints_attr("pads"),
            ints_attr("strides"),
        ),
    ),
)


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """``[N, M, ...]`` from X ``[N, C, ...]`` and W ``[M, C/group, ...]``, the spatial dims windowed."""
    x, w, b, auto_pad, dils, group, kernel, pads, strides = args
    x, w = need(x), need(w)
    if len(x) < 3 or len(w) != len(x) or group < 1:
        raise ShapeError("Conv needs X [N, C, ...] and W [M, C/group, ...] of the same rank")
    n, c, m = x[0], x[1], w[0]
    if c % group or m % group or w[1] != c // group:
        raise ShapeError(f"Conv: {c} channels, group {group}, W {list(w)}")
    if kernel and tuple(kernel) != tuple(w[2:]):
        raise ShapeError("Conv: kernel_shape differs from W")
    if b is not None and tuple(b) != (m,):
        raise ShapeError(f"Conv: B {list(b)} is not [{m}]")
    if _same_dilated(auto_pad, dils):
        # onnxruntime refuses it ("Dilation not supported for AutoPadType::SAME_UPPER"): a rule that builds one
        # is refuted, and the encoder leaves such a node opaque
        raise ShapeError(f"Conv with auto_pad {auto_pad} and dilations {list(dils)} does not run in onnxruntime")
    kern, pads_, strides_, dils_ = window_attrs(x[2:], w[2:], pads, strides, dils, auto_pad)
    return (n, m, *pool_out(x[2:], kern, pads_, strides_, dils_, False))


def _same_dilated(auto_pad: Any, dils: Any) -> bool:
    return str(auto_pad) in ("SAME_UPPER", "SAME_LOWER") and any(int(d) != 1 for d in dils or ())


def evaluate(op: str, args: Sequence[Any], bk: Any) -> Any:
    """Every output element an n-ary sum of its window's products (and the bias) over the backend."""
    x, w, b, auto_pad, dils, group, _kernel, pads, strides = args
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    kern, pads_, strides_, dils_ = window_attrs(x.shape[2:], w.shape[2:], pads, strides, dils, auto_pad)
    out_sp = pool_out(x.shape[2:], kern, pads_, strides_, dils_, False)
    out = np.empty((n, m, *out_sp), dtype=out_dtype(bk))
    positions = window_positions(x.shape[2:], out_sp, kern, pads_, strides_, dils_)
    for bi in range(n):
        for mi in range(m):
            g = mi // mg
            for o, taps in positions:
                terms = [bk.mul(x[(bi, g * cg + ci, *pos)], w[(mi, ci, *off)]) for ci in range(cg) for pos, off in taps]
                if b is not None:
                    terms.append(b[mi])
                out[(bi, mi, *o)] = bk.total(terms) if terms else bk.zero
    return out


_CONV_1D = [  # (H, kernel, pads, stride, dilation)
    (3, 2, (0, 0), 1, 1),
    (4, 3, (1, 1), 2, 1),
    (2, 1, (0, 0), 1, 1),
    (4, 2, (1, 0), 1, 2),
    (1, 1, (0, 0), 2, 1),
    (3, 3, (1, 1), 1, 1),
]
_CONV_2D = [  # (H, W, kernel, pads, strides, dilations)
    ((3, 2), (2, 2), (0, 0, 0, 0), (1, 1), (1, 1)),
    ((2, 3), (1, 2), (0, 1, 0, 0), (1, 2), (1, 1)),
    ((3, 3), (3, 1), (1, 0, 1, 0), (2, 1), (1, 1)),
]


def instances(spec: OpSpec, ranges: InstanceRanges) -> Iterator[Instance]:
    """Two parts. (1) Every window of the product (``cases.window_product``: sizes 1-6, kernels 1-3, strides
    1-3, dilations 1-2, every ``auto_pad``, every pair of pads 0-2), the 2-D windows whose axes differ
    (``cases.window_pairs``) and those whose axes agree (``cases.square_windows``), each with (N, C, M) =
    (1, 1, 1) and (2, 2, 2), groups 1 and 2, with and without bias: every attribute combination meets the
    batch, channel and group splits of a mesh axis of 2.
    (2) (N, C, M) from the orthogonal array over ``dims`` (each of N, C and M takes every dim), each with a
    1-D window (every other row a 2-D one) from the short lists above, groups 1 and 2, with and without bias:
    the splits over axes of 3 and 4. Why the product need not be crossed with every (N, C, M): a Conv's
    window acts on each (batch, output channel, input channel) plane alike, so what a rule does to the
    window attributes shows on one plane, and what it does to N, C and M on any window; the two parts
    cover each, and their meeting (a split of 2 under every window).
    (3) The 2-D windows whose kernel equals their stride (``cases.tiling_windows``, and
    ``cases.patch_windows`` with every pad 0-1 and dilation 1-2: a patchify Conv, as a ViT's first layer),
    on (N, C, M) = (1, 1, 1) only: what they add is how a split of H or W meets the patches, which one plane
    shows (the pooling family crosses the same windows alike)."""
    if ranges.sample:
        yield from _oa_instances(ranges)
        return
    for spatial, kern, pads, strides, dils, auto in (*window_product(False), *window_pairs(False), *square_windows()):
        attrs = dict(auto_pad=auto, dilations=dils, group=1, kernel_shape=kern, pads=pads, strides=strides)
        yield {"X": (1, 1, *spatial), "W": (1, 1, *kern), "B": None}, attrs
        for g, with_bias in itertools.product((1, 2), (True, False)):
            x, w = (2, 2, *spatial), (2, 2 // g, *kern)
            yield {"X": x, "W": w, "B": (2,) if with_bias else None}, {**attrs, "group": g}
    yield from _oa_instances(ranges)
    for spatial, kern, pads, strides, dils, auto in (*tiling_windows(), *patch_windows()):
        attrs = dict(auto_pad=auto, dilations=dils, group=1, kernel_shape=kern, pads=pads, strides=strides)
        yield {"X": (1, 1, *spatial), "W": (1, 1, *kern), "B": None}, attrs


def _oa_instances(ranges: InstanceRanges) -> Iterator[Instance]:
    """(N, C, M) from the orthogonal array over ``dims``, each with a 1-D window (and every other row a 2-D
    one) from the lists above, groups 1 and 2, with and without bias, ``auto_pad`` VALID now and then; and four
    input channels in groups of 2 and 1 under a 1-wide window."""
    d = ranges.dims
    for i, row in enumerate(oa16()):
        n, c, m = d[row[0]], d[row[1]], d[row[2]]
        configs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = []
        h, k, pads, s, dil = _CONV_1D[i % len(_CONV_1D)]
        configs.append(((h,), (k,), pads, (s,), (dil,)))
        if i % 2 == 0:
            hw, kk, pads2, st, dl = _CONV_2D[(i // 2) % len(_CONV_2D)]
            configs.append((hw, kk, pads2, st, dl))
        groups = [1] + ([2] if c % 2 == 0 and m % 2 == 0 else [])
        for (spatial, kern, pads_, strides, dils), g in itertools.product(configs, groups):
            for with_bias in (True, False):
                if not with_bias and (i + g) % 2:
                    continue
                x, w = (n, c, *spatial), (m, c // g, *kern)
                auto = AUTO_PADS[i % 4] if i % 3 == 0 else "NOTSET"
                attrs = dict(
                    auto_pad=auto,
                    dilations=dils,
                    group=g,
                    kernel_shape=kern,
                    pads=pads_ if auto == "NOTSET" else (),
                    strides=strides,
                )
                yield {"X": x, "W": w, "B": (m,) if with_bias else None}, attrs
    # several channels per group (C = 4, groups 2 and 4), with and without bias: a split of the input channels
    # re-groups them on each device, which the rows above may meet only with a bias (issue 21's fourth
    # adversary: only the numeric back-up refuted such a split)
    for m, g, with_bias in itertools.product((2, 4), (2, 4), (False, True)):
        if m % g == 0:
            attrs = dict(auto_pad="NOTSET", dilations=(1,), group=g, kernel_shape=(1,), pads=(0, 0), strides=(1,))
            yield {"X": (1, 4, 2), "W": (m, 4 // g, 1), "B": (m,) if with_bias else None}, attrs


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """Two operations per output element and weight of one filter (C/group times the kernel)."""
    out = math.prod(out_shape)
    if in_shapes[1]:
        return 2.0 * out * math.prod(in_shapes[1][1:])
    return float(out)


def axioms(v: Any) -> None:
    """Conv: batch, output channels (group 1), input channels (group 1, no bias: a pending sum)."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, b, w, i, n, g, dil, ks, pads, st, ap, ch, FA = v.symbols("x b w i n g dil ks pads st ap ch FA")
    cv = v.op("Conv")

    def conv(x_: Any, w_: Any, b_: Any, g_: Any) -> Any:
        return cv(x_, w_, b_, ap, dil, g_, ks, pads, st)

    cb = [x, w, b, ap, dil, ks, pads, st, i, n]
    v.add(
        "Conv",
        FA(
            [*cb, g],
            conv(ch(x, 0, i, n), w, b, g) == ch(conv(x, w, b, g), 0, i, n),
            patterns=[conv(ch(x, 0, i, n), w, b, g)],
        ),
    )
    v.add(
        "Conv",
        FA(
            cb,
            conv(x, ch(w, 0, i, n), ch(b, 0, i, n), 1) == ch(conv(x, w, b, 1), 1, i, n),
            patterns=[conv(x, ch(w, 0, i, n), ch(b, 0, i, n), 1)],
        ),
    )
    v.add(
        "Conv",
        FA(
            [x, w, ap, dil, ks, pads, st, i, n],
            z3.Implies(
                z3.And(v.div(x, 1, n), v.div(w, 1, n)),
                v.is_partial(conv(ch(x, 1, i, n), ch(w, 1, i, n), v.none, 1), conv(x, w, v.none, 1), i, n),
            ),
            patterns=[conv(ch(x, 1, i, n), ch(w, 1, i, n), v.none, 1)],
        ),
    )


def normalize(op: str, v: dict[str, Any], node: NodeView) -> dict[str, Any]:
    """The kernel shape read off W when absent; strides, dilations and pads written out. ``SAME`` padding with
    dilations is not modeled (onnxruntime refuses it)."""
    if _same_dilated(v["auto_pad"], v["dilations"]):
        raise NotModeled
    w_shape = node.shape(v["W"])
    v["kernel_shape"] = tuple(v["kernel_shape"]) or tuple(w_shape[2:])
    v.update(window_defaults(v, len(w_shape) - 2))
    return v


def _bias(in_shapes: InShapes) -> Sequence[int] | None:
    """The bias, whose gradient is a sum of the output's gradient per channel. The backward is two convolutions
    of the forward's FLOPs each (the input's gradient, a transposed convolution; the weight's, a correlation of
    the input with the gradient), each reading the gradient and the other operand, so Conv keeps its input and
    its kernel (:func:`~unity_eq.ops.tensors.product_hooks`); the bias needs nothing."""
    return in_shapes[2] if len(in_shapes) > 2 else None


CONV = OpFamily(
    name="conv",
    specs=SPECS,
    rule_file="parallel/conv.egg",
    ranges=(
        "every 1-D window of sizes 1-6, kernels 1-3, strides 1-3, dilations 1-2, every auto_pad and every pair of"
        " pads 0-2, 2-D windows whose axes differ and 2-D windows equal in both axes, each with (N, C, M) ="
        " (1, 1, 1) and (2, 2, 2), groups 1 and 2, with and without bias; and (N, C, M) from an orthogonal array"
        " over dims 1-4 with a few windows; 2-D windows whose kernel equals their stride (kernels 1-3 unpadded,"
        " kernel 2 with every pad 0-1 and dilation 1-2) on (N, C, M) = (1, 1, 1); four input channels in groups"
        " of 2 and 1 (M = 2, 4), width-1 windows"
    ),
    compute_class="gemm",
    **product_hooks(("X", "W"), flops, _bias),
    **OpFamily.hooks_in(globals()),
)

"""What the families' shape inference and semantics share: shapes that must be present, broadcasting, axes
in range, reductions over the elements of an array, the element type a backend's arrays hold, and the backward
work of a product of two operands (MatMul, Gemm, Conv).

Values are numpy arrays: ``dtype=object`` arrays of z3 expressions for proofs, of exact numbers for the rule
generator's fingerprints, float64 arrays for the numeric back-up (verify/_tensor.py's backends).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import numpy as np

from unity_eq.ops.family import NotModeled, Saved, ShapeError, Work

__all__ = [
    "InShapes",
    "ProductHooks",
    "Shape",
    "bcast",
    "check_axis",
    "need",
    "norm_axes",
    "norm_axis",
    "obj",
    "out_dtype",
    "pool_out",
    "product_backward",
    "product_hooks",
    "reduce_elements",
    "window_attrs",
    "window_defaults",
    "window_out",
    "window_positions",
]

Shape = tuple[int, ...]

#: The input shapes an op gets, as :data:`~unity_eq.ops.family.WorkFn` does (an absent operand is None).
InShapes = Sequence[Sequence[int] | None]


def need(shape: Any) -> Shape:
    """A required tensor argument's shape (``None`` is an absent optional input: not allowed here)."""
    if shape is None:
        raise ShapeError("a required input is absent (NoneT)")
    return tuple(shape)


def bcast(*shapes: Shape) -> Shape:
    """numpy's broadcast of ``shapes``; ShapeError when they do not broadcast."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes {' and '.join(map(str, map(list, shapes)))} do not broadcast") from None


def check_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` when it is a (normalized) axis of a tensor of ``rank``; ShapeError otherwise."""
    if not 0 <= axis < rank:
        raise ShapeError(f"{what} {axis} out of range for rank {rank}")
    return axis


def out_dtype(bk: Any) -> Any:
    """Element type of arrays an evaluator fills: z3 terms and exact numbers (the rule generator's
    fingerprints) are Python objects; the numeric back-up uses float64."""
    return object if getattr(bk, "symbolic", False) or getattr(bk, "exact", False) else float


def obj(x: Any) -> Any:
    """``x`` as a numpy array of Python objects (scalars and lists included)."""
    return x if isinstance(x, np.ndarray) else np.array(x, dtype=object)


def reduce_elements(
    bk: Any, x: np.ndarray, axes: Sequence[int], keepdims: bool, how: Callable[[list[Any]], Any]
) -> np.ndarray:
    """Reduce ``x`` over ``axes`` with ``how`` (a function of the list of elements, in row-major order)."""
    axes = sorted(set(axes))
    rank = x.ndim
    keep = [d for d in range(rank) if d not in axes]
    moved = np.transpose(x, keep + axes)
    outer = tuple(x.shape[d] for d in keep)
    inner = math.prod(x.shape[d] for d in axes)
    flat = moved.reshape((-1, inner)) if inner else moved.reshape((-1, 0))
    out = np.empty(flat.shape[0], dtype=out_dtype(bk))
    for i in range(flat.shape[0]):
        out[i] = how(list(flat[i]))
    out = out.reshape(outer)
    if keepdims:
        out = out.reshape(tuple(1 if d in axes else x.shape[d] for d in range(rank)))
    return out


def norm_axis(axis: int, rank: int) -> int:
    """An ONNX axis attribute made non-negative, for the encoder (``NotModeled`` when out of range: ONNX
    Runtime, not us, reports that)."""
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise NotModeled
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    """ONNX axes made non-negative (:func:`norm_axis`), sorted, for the encoder: ``NotModeled`` when two name the
    same dim (``(0, -3)`` at rank 3). ONNX does not say what a repeated axis means and onnxruntime's reductions
    and Squeeze count it once, while the rules' analyses (``reduce-map``) and the verifier's semantics take each
    axis as a distinct dim: such a node stays opaque (issue 21, the sixth adversary: the shipped
    ``reduce-sum-split`` fired on one and moved the wrong dim)."""
    normal = tuple(sorted(norm_axis(a, rank) for a in axes))
    if len(set(normal)) != len(normal):
        raise NotModeled
    return normal


def window_out(size: int, k: int, head: int, tail: int, stride: int, dil: int, ceil: bool) -> int:
    """Output size along one spatial dim with ``head``/``tail`` padding. With ``ceil`` a last window that
    would start in the right padding (at or past ``size + head`` in padded coordinates) is dropped, as ONNX
    and onnxruntime do: with asymmetric pads that point is not ``size + (head + tail) / 2``."""
    pad = head + tail
    span = dil * (k - 1) + 1
    if size + pad < span:
        raise ShapeError("window larger than the padded input")
    n = (size + pad - span) / stride
    out = (math.ceil(n) if ceil else math.floor(n)) + 1
    if ceil and (out - 1) * stride >= size + head:
        out -= 1  # the last window would start in the right padding
    return out


def window_attrs(
    spatial: Shape,
    kernel: Sequence[int],
    pads: Sequence[int],
    strides: Sequence[int],
    dils: Sequence[int],
    auto_pad: str,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The kernel, pads (every begin, then every end), strides and dilations of a window over ``spatial``:
    defaults filled in, ``auto_pad`` applied; ShapeError when they do not fit."""
    k = len(spatial)
    kernel = list(kernel)
    strides = list(strides) or [1] * k
    dils = list(dils) or [1] * k
    if len(kernel) != k or len(strides) != k or len(dils) != k:
        raise ShapeError("window attributes do not match the spatial rank")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, kk, s, d in zip(spatial, kernel, strides, dils, strict=True):
            total = max(0, (math.ceil(size / s) - 1) * s + (kk - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        pads = begins + ends
    elif auto_pad == "VALID":
        pads = [0] * (2 * k)
    else:
        pads = list(pads) or [0] * (2 * k)
    if len(pads) != 2 * k or any(p < 0 for p in pads) or any(s < 1 for s in strides) or any(d < 1 for d in dils):
        raise ShapeError("invalid pads, strides or dilations")
    if any(kk < 1 for kk in kernel):
        raise ShapeError("invalid kernel shape")
    return kernel, pads, strides, dils


def pool_out(
    spatial: Shape, kernel: list[int], pads: list[int], strides: list[int], dils: list[int], ceil: bool
) -> Shape:
    """The output's spatial shape of a window (attributes as :func:`window_attrs` returns them)."""
    k = len(spatial)
    return tuple(window_out(spatial[i], kernel[i], pads[i], pads[i + k], strides[i], dils[i], ceil) for i in range(k))


def window_positions(
    spatial: Shape, out: Shape, kern: list[int], pads: list[int], strides: list[int], dils: list[int]
) -> list[tuple[tuple[int, ...], list[tuple[tuple[int, ...], tuple[int, ...]]]]]:
    """For every output position: the (input position, kernel offset) pairs inside the input."""
    k = len(spatial)
    result = []
    for o in itertools.product(*[range(n) for n in out]):
        taps = []
        for off in itertools.product(*[range(n) for n in kern]):
            pos = tuple(o[i] * strides[i] - pads[i] + off[i] * dils[i] for i in range(k))
            if all(0 <= pos[i] < spatial[i] for i in range(k)):
                taps.append((pos, off))
        result.append((o, taps))
    return result


def window_defaults(v: dict[str, Any], spatial: int) -> dict[str, Any]:
    """The encoder's window attributes with ONNX's implicit defaults written out: strides and dilations of 1,
    and zero pads unless ``auto_pad`` computes them."""
    out = {
        "strides": tuple(v["strides"]) or (1,) * spatial,
        "dilations": tuple(v.get("dilations") or ()) or (1,) * spatial,
    }
    if v.get("auto_pad", "NOTSET") == "NOTSET":
        out["pads"] = tuple(v["pads"]) or (0,) * (2 * spatial)
    return out


def product_backward(
    forward_flops: float,
    in_shapes: Sequence[Sequence[int] | None],
    out_shape: Sequence[int],
    bias: Sequence[int] | None,
) -> Work:
    """The backward pass of a product of two operands (MatMul, Gemm, Conv): two products of the forward's
    ``forward_flops`` each, one per operand's gradient, each reading the output's gradient and the other operand
    and writing its operand's size; a ``bias`` (the caller says which counts) adds a sum of the gradient."""
    n = math.prod(out_shape)
    a, b = (math.prod(s) if s is not None else 0 for s in in_shapes[:2])
    work = Work(2.0 * forward_flops, 2.0 * n + a + b, float(a + b), kernels=2.0)
    if bias is not None:
        work = work + Work(float(n), float(n), float(math.prod(bias)))
    return work


class ProductHooks(TypedDict):
    """The hooks :func:`product_hooks` makes, by their :class:`~unity_eq.ops.family.OpFamily` field names."""

    saved: Callable[[str], Saved]
    backward_work: Callable[[str, InShapes, Sequence[int]], Work]


def product_hooks(
    operands: tuple[str, str],
    flops: Callable[[str, InShapes, Sequence[int]], float],
    bias_of: Callable[[InShapes], Sequence[int] | None],
) -> ProductHooks:
    """The ``saved`` and ``backward_work`` hooks of a family of products of two ``operands`` (MatMul and Gemm,
    Conv), passed by keyword to its OpFamily: the backward keeps both operands (each one's gradient is the
    other times the output's; a bias needs nothing) and is :func:`product_backward` of the forward's ``flops``.
    ``bias_of`` says which bias, from the input shapes, adds a sum of the gradient (None: none does)."""

    def saved(op: str) -> Saved:
        return Saved(inputs=operands)

    def backward_work(op: str, in_shapes: InShapes, out_shape: Sequence[int]) -> Work:
        return product_backward(flops(op, in_shapes, out_shape), in_shapes, out_shape, bias_of(in_shapes))

    return {"saved": saved, "backward_work": backward_work}

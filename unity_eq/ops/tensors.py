"""What the families' shape inference and semantics share: shapes that must be present, broadcasting, axes
in range, reductions over the elements of an array, the element type a backend's arrays hold.

Values are numpy arrays: ``dtype=object`` arrays of z3 expressions for proofs, of exact numbers for the rule
generator's fingerprints, float64 arrays for the numeric back-up (verify/_tensor.py's backends).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unity_eq.ops.family import NotModeled, ShapeError

__all__ = ["Shape", "bcast", "check_axis", "need", "norm_axis", "obj", "out_dtype", "reduce_elements"]

Shape = tuple[int, ...]


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

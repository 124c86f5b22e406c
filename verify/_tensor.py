"""Semantics of the tensor language: shape inference and evaluation of every typed constructor.

Values are numpy arrays: ``dtype=object`` arrays of z3 expressions for proofs (:class:`Z3Backend`), float64
arrays for the numeric back-up (:class:`NumpyBackend`); an absent optional input (``NoneT``) is ``None`` and
a ``TList`` a Python list. One implementation serves both backends: structural numpy operations (reshape,
transpose, concatenate, matmul, broadcasting) work on object arrays as they do on floats, and the few
operations that differ (uninterpreted functions, if-then-else, sums and maxima) go through the backend.

Exact and uninterpreted operations (the proof holds for every interpretation of an uninterpreted function):

* exact in z3: Neg, Identity, Add, Sub, Mul, Div, Max, Min, comparisons (1/0), Where, Clip, PRelu, MatMul,
  Gemm, Conv, pooling maxima and averages, sums and means, Concat/Split/Slice/Gather/Expand/Reshape/
  Transpose (pure data movement), and the normalizations' arithmetic;
* uninterpreted: every other unary op (Relu, Exp, Erf, Tanh, Sigmoid, Gelu…; float attributes are extra
  arguments, string/int attributes part of the name), Pow, And, Or, Xor, and the primitives ``exp``,
  ``log``, ``sqrt`` and ``pow`` inside Softmax, LogSoftmax, LayerNormalization, BatchNormalization and LRN.

Ops on integer tensors are evaluated by the integer backends (:class:`Z3IntegerBackend`,
:class:`NumpyIntegerBackend`): the same, except that division truncates toward zero (``Div``, the mean of
``ReduceMean``), as onnxruntime's integer kernels do.

The numeric backend replaces each uninterpreted function by a fixed smooth function derived from its name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from unity_eq.ops.family import OpFamily, ShapeError  # one class: a plug-in family's shape errors are the verifier's
from unity_eq.ops.registry import OPS, family_for
from unity_eq.ops.tensors import obj
from unity_eq.verify._backends import Backend, NumpyBackend, NumpyIntegerBackend, Shape, Z3Backend, Z3IntegerBackend
from unity_eq.verify._z3_terms import same_polynomial

# The backends live in _backends and the z3 terms they build in _z3_terms; the prover imports them from here.
__all__ = [
    "NEGATIVE_AXES",
    "Backend",
    "NumpyBackend",
    "NumpyIntegerBackend",
    "Shape",
    "ShapeError",
    "Z3Backend",
    "Z3IntegerBackend",
    "evaluate",
    "infer_shape",
    "onnx_axes",
    "same_polynomial",
]


# ----------------------------------------------------------------------------------------------------------
# Shape inference


def infer_shape(op: str, args: Sequence[Any]) -> Shape:
    """The output shape of ``op`` applied to ``args`` (tensor arguments given as shapes, ``None`` for
    ``NoneT``, lists of shapes for ``TList``; other arguments as values). Raises ShapeError, also when a
    required input is absent: a rule that feeds an absent optional input (Gemm's C, a Clip bound) to an op
    that needs one (Add, Max) is wrong there, not a crash of the verifier."""
    spec = OPS.get(op)
    if spec is not None:
        for arg, value in zip(spec.args, args, strict=False):
            if arg.sort == "T" and not arg.optional and value is None:
                raise ShapeError(f"{op}: its required input {arg.name} is absent (NoneT)")
    return tuple(_family(op).infer_shape(op, onnx_axes(op, args, args)))


#: ops whose axis attribute (an int, or a vector of them) counts from the end when negative, as ONNX says:
#: (the argument's position, the position of the tensor whose rank it counts from). The families' semantics
#: take normalized axes (the encoder normalizes them); a rule may spell one negative, so the verifier
#: normalizes here, in the one place every evaluation and shape inference passes through (issue 21: a guard
#: `(!= d -1)` read -1 as "no dim", and the rule split the softmax axis itself).
NEGATIVE_AXES: dict[str, tuple[int, int]] = {
    "Softmax": (1, 0),
    "LogSoftmax": (1, 0),
    "LayerNormalization": (3, 0),
    "Concat": (1, 0),
    "Split": (2, 0),
    "Gather": (2, 0),
    "ReduceSum": (1, 0),
    "ReduceMean": (1, 0),
    "ReduceMax": (1, 0),
    "ReduceMin": (1, 0),
    "Slice": (3, 0),
}


def onnx_axes(op: str, args: Sequence[Any], shapes: Sequence[Any]) -> list[Any]:
    """``args`` with ``op``'s negative axes counted from the end of its tensor's rank (``shapes``: the
    arguments' shapes); an axis outside ``[-rank, rank)`` is a ShapeError (ONNX rejects it)."""
    where = NEGATIVE_AXES.get(op)
    out = list(args)
    if where is None or where[0] >= len(args):
        return out
    at, of = where
    shape = shapes[of]
    if isinstance(shape, list):  # Concat: the rank of its operands
        shape = shape[0] if shape else None
    if shape is None or isinstance(shape, str) or args[at] is None:
        return out
    rank = len(shape)

    def norm(a: Any) -> int:
        a = int(a)
        if not -rank <= a < rank:
            raise ShapeError(f"{op}: axis {a} out of range for rank {rank}")
        return a + rank if a < 0 else a

    value = args[at]
    out[at] = tuple(norm(a) for a in value) if isinstance(value, tuple | list) else norm(value)
    return out


def _family(op: str) -> OpFamily:
    """The op's family, which holds its semantics (unity_eq/ops/)."""
    family = family_for(op)
    if family is None:
        raise KeyError(f"{op}: no op family in unity_eq/ops/registry.py")
    return family


# ----------------------------------------------------------------------------------------------------------
# Evaluation


def evaluate(op: str, args: Sequence[Any], bk: Backend) -> Any:
    """Apply ``op`` to argument values (see module docstring); raise ShapeError when they do not fit."""
    shapes = [_shape_arg(a) for a in args]
    out_shape = infer_shape(op, shapes)
    value = _family(op).evaluate(op, onnx_axes(op, args, shapes), bk)
    value = obj(value) if isinstance(bk, Z3Backend) else np.asarray(value)
    assert value.shape == out_shape, f"{op}: evaluated {value.shape}, inferred {out_shape}"
    return value


def _shape_arg(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return a.shape
    if isinstance(a, list):
        return [x.shape for x in a]
    return a

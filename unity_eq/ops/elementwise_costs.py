"""What the elementwise ops (unity_eq/ops/elementwise.py) cost beyond the default "read every operand, write the
output, one kernel": the backward pass as PyTorch's autograd runs it (the cost model's training price), and
Identity's forward, a view."""

from __future__ import annotations

import math
from collections.abc import Sequence

from unity_eq.ops.family import FREE, Work

__all__ = ["forward_work", "gradient_work"]

#: Ops without a gradient (comparisons, logic; rounding's is zero): their backward does nothing.
_NO_GRADIENT = frozenset(
    {"Floor", "Ceil", "Round", "Sign", "Not", "IsNaN"}
    | {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"}
)
#: Binary ops whose gradient of an operand is the output's gradient itself (up to a sign).
_LINEAR = frozenset({"Add", "Sub"})
#: Ops whose PyTorch derivative (its derivatives.yaml formula) is a chain of eager kernels instead of one fused
#: backward kernel, and how many: Erf's ``2/√π · exp(−x²) · grad`` is pow, neg, exp, a scale and the product (its
#: backward measured 422 µs on an H200 at 8 × 1024 × 4096 float32, where one kernel's roofline said 110 and
#: five kernels' say 420); Sqrt's ``grad / (2·y)``, Reciprocal's ``−grad·y·y``, Abs's ``grad·sgn(x)``, Sin's
#: ``grad·cos(x)``, Cos's ``−grad·sin(x)``; Pow's base gradient ``where(e = 0, 0, grad·e·x^(e−1))``. Each kernel
#: streams one intermediate (the last one the output's gradient too) and writes one.
_EAGER_BACKWARD_KERNELS = {"Erf": 5, "Sqrt": 2, "Reciprocal": 3, "Abs": 2, "Sin": 2, "Cos": 3, "Pow": 4}


def _eager_chain(kernels: int, n: int) -> Work:
    """``kernels`` elementwise kernels in a row over ``n`` elements: each reads one operand (the last two) and
    writes one."""
    return Work(float(kernels * n), float((kernels + 1) * n), float(kernels * n), float(kernels))


def _count(shape: Sequence[int] | None) -> int:
    return 0 if shape is None else math.prod(shape)


def _operand_gradient(op: str, position: int, shapes: Sequence[Sequence[int] | None], n: int) -> Work:
    """The gradient of one operand of a broadcasting op: the output's gradient times the local derivative
    (which reads the other operands; Add's is 1: no kernel, the buffer is shared; Sub's second is −1: one
    negation), then, for an operand broadcast to the output's shape, a sum over the broadcast dims that reads the
    whole gradient and writes the operand's size: the reduction the flat price ignored."""
    size = _count(shapes[position])
    if op in _LINEAR:
        local = FREE if op == "Add" or position == 0 else Work(float(n), float(n), float(n))
    elif op == "Pow" and position == 0:
        local = _eager_chain(_EAGER_BACKWARD_KERNELS[op], n)
    else:
        others = sum(_count(s) for j, s in enumerate(shapes) if j != position)
        local = Work(2.0 * n, float(n + others), float(n))
    if size == n:
        return local
    return local + Work(float(n), float(n), float(size))


def gradient_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int], unary: bool) -> Work:
    """The backward pass of an elementwise op (``unary``: one of the family's unary ops). Unary ops read the
    output's gradient and what they saved (their input or output; Neg and Cast nothing) and write the input's
    gradient in one kernel, or in the chain of eager kernels their PyTorch derivative is
    (:data:`_EAGER_BACKWARD_KERNELS`); Identity is a view. Broadcasting ops produce the gradient of every operand
    but one-element ones (constants: a scale, an epsilon; ONNX exports them as initializers) and Where's
    condition: see :func:`_operand_gradient`."""
    n = math.prod(out_shape)
    if op in _NO_GRADIENT:
        return FREE
    if op == "Identity":
        return FREE
    if op in _EAGER_BACKWARD_KERNELS and unary:
        return _eager_chain(_EAGER_BACKWARD_KERNELS[op], n)
    if unary:
        reads_saved = op not in ("Neg", "Cast")
        return Work(2.0 * n, float(n * (2 if reads_saved else 1)), float(n))
    if op == "Clip":  # the gradient where min < x < max: reads the gradient and the input
        return Work(2.0 * n, 2.0 * n, float(n))
    work = FREE
    for position, shape in enumerate(in_shapes):
        if shape is None or _count(shape) <= 1 or (op == "Where" and position == 0):
            continue
        work = work + _operand_gradient(op, position, in_shapes, n)
    return work


def forward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """Identity is a view (onnxruntime aliases its output to its input; PyTorch returns the tensor): free. The
    other ops read their operands and write their output (the default)."""
    return FREE if op == "Identity" else None

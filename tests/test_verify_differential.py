"""The verifier's tensor semantics agree with onnxruntime: a differential test on random one-node models.

A proof is only as good as the semantics it evaluates. For every typed operator of ``unity_eq.ops``, random
instances (ranks up to 4, broadcasting patterns, negative axes, Reshape 0/-1, Slice clamping, Conv/Pool
pads, strides, dilations and auto_pad, Gemm alpha/beta/transA/transB…) are built as one-node ONNX models
(``onnx.helper``, IR version 10) and run by onnxruntime. The same model goes through the path a proof relies
on:

1. the frontend (``frontends.onnx.load_onnx``) and the encoder's normalization (``unity_eq.egraph``) turn
   the node into the constructor's arguments, exactly as the e-graph sees them;
2. ``verify._tensor.evaluate`` evaluates the constructor on the concrete inputs twice: with the numpy
   backend (the numeric back-up's code path) and with the z3 backend (the bounded prover's), whose terms are
   then computed numerically;
3. the constructor is lowered back to an ONNX node as extraction and lowering do (``extract.typed_attrs``)
   and run again: a term must mean the node it becomes.

Operators the verifier leaves uninterpreted (Relu, Exp…, Pow, And…) are compared on their output shape only;
inside the normalizations, the primitives ``exp``, ``log``, ``sqrt`` and ``pow`` are given their real
meaning, so that the arithmetic around them is what is compared. Slices with negative steps and reductions
with ``noop_with_empty_axes`` are not modeled: the encoder must leave them opaque (and does).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import z3
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from unity_eq.egraph.typed_nodes import typed_values, used_outputs
from unity_eq.extract.build import typed_attrs
from unity_eq.frontends.onnx import load_onnx
from unity_eq.ops import registry
from unity_eq.ops.registry import OPS, PLUGINS, plugin_for, spec_for
from unity_eq.ops.spec import Family, OpSpec
from unity_eq.verify._gen import GenConfig
from unity_eq.verify._tensor import (
    NumpyBackend,
    NumpyIntegerBackend,
    ShapeError,
    Z3Backend,
    Z3IntegerBackend,
    evaluate,
)

OPSET = 21
IR_VERSION = 10  # onnxruntime 1.31 refuses the IR version onnx 1.23 writes by default
SEED = 12
INSTANCES = 40  # per operator with exact semantics
SHAPE_ONLY_INSTANCES = 6  # per uninterpreted operator
RTOL, ATOL = 2e-4, 2e-5  # float32 in onnxruntime against float64 in the verifier

UNINTERPRETED = sorted(
    name
    for name, spec in OPS.items()
    if (spec.family is Family.UNARY and name not in ("Neg", "Identity")) or name in ("Pow", "And", "Or", "Xor")
)


# ------------------------------------------------------------------------------------------ instances


@dataclass
class Inp:
    """A graph input (a runtime value)."""

    value: np.ndarray


@dataclass
class Const:
    """An initializer: constant integer lists (Reshape's shape, Slice's starts…)."""

    value: np.ndarray


@dataclass
class Instance:
    op: str
    inputs: list[Inp | Const | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: int = 1
    expect_opaque: bool = False  # a form the encoder must not type (negative Slice steps…)


def _f(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _ints(values: list[int] | tuple[int, ...]) -> Const:
    return Const(np.asarray(values, dtype=np.int64))


def _shape(rng: np.random.Generator, rank: int, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
    return tuple(int(v) for v in rng.integers(lo, hi + 1, rank))


def _bcast_shapes(rng: np.random.Generator, k: int) -> list[tuple[int, ...]]:
    """k shapes that broadcast together: suffixes of one output shape, some dims 1."""
    out = _shape(rng, int(rng.integers(0, 5)))
    shapes = []
    for _ in range(k):
        rank = int(rng.integers(0, len(out) + 1))
        shapes.append(tuple(d if rng.random() < 0.6 else 1 for d in out[len(out) - rank :]))
    return shapes


def _axis(rng: np.random.Generator, rank: int) -> int:
    """An axis in [-rank, rank): negative half the time."""
    axis = int(rng.integers(0, rank))
    return axis - rank if rng.random() < 0.5 else axis


def gen_unary(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        x = _f(rng, _shape(rng, int(rng.integers(0, 5))))
        attrs: dict[str, Any] = {}
        if op == "Not":
            x = np.asarray(x > 0)
        if op == "Cast":
            attrs["to"] = TensorProto.DOUBLE
        if op in ("LeakyRelu", "Elu", "Celu", "ThresholdedRelu", "HardSigmoid") and rng.random() < 0.5:
            attrs["alpha"] = float(rng.uniform(0.1, 2.0))
        return Instance(op, [Inp(x)], attrs)

    return gen


def gen_binary(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        sa, sb = _bcast_shapes(rng, 2)
        if op == "PRelu":  # the slope broadcasts to X (unidirectionally): a suffix of X's shape, some dims 1
            sa = _shape(rng, int(rng.integers(0, 5)))
            sb = tuple(d if rng.random() < 0.6 else 1 for d in sa[int(rng.integers(0, len(sa) + 1)) :])
        a: np.ndarray
        b: np.ndarray
        if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
            a, b = (rng.integers(-2, 3, s).astype(np.float32) for s in (sa, sb))  # ties happen
        elif op in ("And", "Or", "Xor"):
            a, b = rng.random(sa) > 0.5, rng.random(sb) > 0.5
        elif op == "Div":
            a = _f(rng, sa)
            b = (rng.choice([-1.0, 1.0], sb) * rng.uniform(0.5, 2.0, sb)).astype(np.float32)
        elif op == "Pow":
            a, b = np.abs(_f(rng, sa)) + np.float32(0.5), _f(rng, sb)
        else:
            a, b = _f(rng, sa), _f(rng, sb)
        return Instance(op, [Inp(np.asarray(a)), Inp(np.asarray(b))])

    return gen


def gen_where(rng: np.random.Generator) -> Instance:
    sc, sx, sy = _bcast_shapes(rng, 3)
    return Instance("Where", [Inp(np.asarray(rng.random(sc) > 0.5)), Inp(_f(rng, sx)), Inp(_f(rng, sy))])


def gen_clip(rng: np.random.Generator) -> Instance:
    x = _f(rng, _shape(rng, int(rng.integers(0, 5))))
    lo = Inp(np.asarray(rng.uniform(-1.5, 0.5), dtype=np.float32).reshape(())) if rng.random() < 0.7 else None
    hi = Inp(np.asarray(rng.uniform(-0.5, 1.5), dtype=np.float32).reshape(())) if rng.random() < 0.7 else None
    return Instance("Clip", [Inp(x), lo, hi])  # min > max happens: the result is max


def gen_matmul(rng: np.random.Generator) -> Instance:
    ra, rb = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    m, k, n = _shape(rng, 3)
    batch = _shape(rng, max(ra, rb) - 2) if max(ra, rb) > 2 else ()
    sa: tuple[int, ...] = (k,) if ra == 1 else (m, k)
    sb: tuple[int, ...] = (k,) if rb == 1 else (k, n)
    # batch dims: suffixes of the common batch, some broadcast (rank 3 x rank 4 included)
    ba = tuple(d if rng.random() < 0.7 else 1 for d in batch[len(batch) - max(ra - 2, 0) :]) if ra > 2 else ()
    bb = tuple(d if rng.random() < 0.7 else 1 for d in batch[len(batch) - max(rb - 2, 0) :]) if rb > 2 else ()
    return Instance("MatMul", [Inp(_f(rng, ba + sa)), Inp(_f(rng, bb + sb))])


def gen_gemm(rng: np.random.Generator) -> Instance:
    m, k, n = _shape(rng, 3)
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    a = _f(rng, (k, m) if ta else (m, k))
    b = _f(rng, (n, k) if tb else (k, n))
    c_shapes: list[tuple[int, ...] | None] = [None, (), (n,), (1, n), (m, 1), (m, n), (1,)]
    cs = c_shapes[int(rng.integers(0, len(c_shapes)))]
    attrs: dict[str, Any] = {"transA": ta, "transB": tb}
    if rng.random() < 0.7:
        attrs["alpha"] = float(rng.uniform(-2, 2))
    if rng.random() < 0.7:
        attrs["beta"] = float(rng.uniform(-2, 2))
    return Instance("Gemm", [Inp(a), Inp(b), None if cs is None else Inp(_f(rng, cs))], attrs)


def gen_softmax(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        rank = int(rng.integers(1, 5))
        attrs = {"axis": _axis(rng, rank)} if rng.random() < 0.8 else {}
        return Instance(op, [Inp(_f(rng, _shape(rng, rank)))], attrs)

    return gen


def gen_layernorm(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    shape = _shape(rng, rank)
    axis = _axis(rng, rank)
    normalized = shape[axis % rank :]
    cut = int(rng.integers(0, len(normalized) + 1))  # Scale and B may broadcast (a suffix)
    scale = _f(rng, normalized[cut:])
    bias = Inp(_f(rng, normalized[int(rng.integers(0, len(normalized) + 1)) :])) if rng.random() < 0.6 else None
    attrs = {"axis": axis, "epsilon": float(rng.choice([1e-5, 0.1, 1.0]))}
    return Instance("LayerNormalization", [Inp(_f(rng, shape)), Inp(scale), bias], attrs)


def _window(rng: np.random.Generator, spatial: tuple[int, ...], pool: bool) -> tuple[list[int], dict[str, Any]]:
    k = len(spatial)
    kernel = [int(rng.integers(1, min(s, 3) + 1)) for s in spatial]
    attrs: dict[str, Any] = {}
    if rng.random() < 0.6:
        attrs["strides"] = [int(rng.integers(1, 3)) for _ in range(k)]
    if rng.random() < 0.4:
        dil = [int(rng.integers(1, 3)) for _ in range(k)]
        if all((kk - 1) * d + 1 <= s for kk, d, s in zip(kernel, dil, spatial, strict=True)):
            attrs["dilations"] = dil
    mode = rng.choice(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if mode != "NOTSET":
        attrs["auto_pad"] = str(mode)
    elif rng.random() < 0.7:
        attrs["pads"] = [int(rng.integers(0, kk)) if pool else int(rng.integers(0, 3)) for kk in kernel * 2]
    return kernel, attrs


def gen_conv(rng: np.random.Generator) -> Instance:
    k = int(rng.choice([1, 2, 2, 3]))
    group = int(rng.choice([1, 1, 2]))
    c, m = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
    spatial = _shape(rng, k, 1, 5 if k < 3 else 3)
    kernel, attrs = _window(rng, spatial, pool=False)
    if group > 1:
        attrs["group"] = group
    if rng.random() < 0.3:
        attrs["kernel_shape"] = kernel
    x = _f(rng, (int(rng.integers(1, 3)), c, *spatial))
    w = _f(rng, (m, c // group, *kernel))
    b = Inp(_f(rng, (m,))) if rng.random() < 0.5 else None
    return Instance("Conv", [Inp(x), Inp(w), b], attrs)


def gen_pool(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        k = int(rng.integers(1, 3))
        spatial = _shape(rng, k, 1, 5)
        kernel, attrs = _window(rng, spatial, pool=True)
        attrs["kernel_shape"] = kernel
        if rng.random() < 0.4:
            attrs["ceil_mode"] = 1
        if op == "AveragePool" and rng.random() < 0.5:
            attrs["count_include_pad"] = 1
        x = _f(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 3)), *spatial))
        # onnxruntime pads SAME for the undilated kernel (not as ONNX says): the encoder must not type it
        same_dilated = str(attrs.get("auto_pad", "")).startswith("SAME") and "dilations" in attrs
        return Instance(op, [Inp(x)], attrs, expect_opaque=same_dilated and any(d != 1 for d in attrs["dilations"]))

    return gen


def gen_global_pool(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        return Instance(op, [Inp(_f(rng, _shape(rng, int(rng.integers(3, 5)))))])

    return gen


def gen_lrn(rng: np.random.Generator) -> Instance:
    attrs = {
        "size": int(rng.choice([1, 3, 5])),  # onnxruntime takes odd sizes only
        "alpha": float(rng.uniform(0.01, 1.0)),
        "beta": float(rng.uniform(0.5, 1.0)),
        "bias": float(rng.uniform(0.5, 2.0)),
    }
    return Instance("LRN", [Inp(_f(rng, _shape(rng, 4)))], attrs)


def gen_batchnorm(rng: np.random.Generator) -> Instance:
    shape = _shape(rng, int(rng.integers(2, 5)))
    c = shape[1]
    variance = Inp(rng.uniform(0.2, 2.0, c).astype(np.float32))
    params = [Inp(_f(rng, (c,))), Inp(_f(rng, (c,))), Inp(_f(rng, (c,))), variance]
    return Instance("BatchNormalization", [Inp(_f(rng, shape)), *params], {"epsilon": float(rng.choice([1e-5, 0.5]))})


def gen_flatten(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    axis = int(rng.integers(-rank, rank + 1))
    return Instance("Flatten", [Inp(_f(rng, _shape(rng, rank)))], {"axis": axis})


def gen_reshape(rng: np.random.Generator) -> Instance:
    shape = _shape(rng, int(rng.integers(1, 5)))
    total = math.prod(shape)
    dims = []  # a random factorization of total
    left = total
    for _ in range(int(rng.integers(0, 4))):
        divisors = [d for d in range(1, left + 1) if left % d == 0]
        d = int(rng.choice(divisors))
        dims.append(d)
        left //= d
    dims.append(left)
    target: list[int] = list(dims)
    if rng.random() < 0.5:  # -1 for one dim
        target[int(rng.integers(0, len(target)))] = -1
    for i in range(min(len(target), len(shape))):  # 0 copies the input dim
        if target[i] == shape[i] and rng.random() < 0.5:
            target[i] = 0
    return Instance("Reshape", [Inp(_f(rng, shape)), _ints(target)])


def gen_squeeze(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    shape = tuple(1 if rng.random() < 0.5 else int(rng.integers(2, 4)) for _ in range(rank))
    ones = [i for i, n in enumerate(shape) if n == 1]
    if ones and rng.random() < 0.7:
        chosen = [i for i in ones if rng.random() < 0.7] or ones[:1]
        axes = [a - rank if rng.random() < 0.5 else a for a in chosen]
        return Instance("Squeeze", [Inp(_f(rng, shape)), _ints(axes)])
    return Instance("Squeeze", [Inp(_f(rng, shape))])


def gen_unsqueeze(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(0, 4))
    count = int(rng.integers(1, 5 - rank)) if rank < 4 else 1
    out_rank = rank + count
    axes = [int(a) for a in rng.choice(out_rank, count, replace=False)]
    axes = [a - out_rank if rng.random() < 0.5 else a for a in axes]
    return Instance("Unsqueeze", [Inp(_f(rng, _shape(rng, rank))), _ints(axes)])


def gen_transpose(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    attrs = {"perm": [int(p) for p in rng.permutation(rank)]} if rng.random() < 0.8 else {}
    return Instance("Transpose", [Inp(_f(rng, _shape(rng, rank)))], attrs)


def gen_concat(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    base = _shape(rng, rank)
    axis = _axis(rng, rank)
    parts = []
    for _ in range(int(rng.integers(1, 5))):
        shape = list(base)
        shape[axis] = int(rng.integers(1, 4))
        parts.append(Inp(_f(rng, tuple(shape))))
    return Instance("Concat", list(parts), {"axis": axis})


def gen_split(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    shape = list(_shape(rng, rank))
    axis = _axis(rng, rank)
    if rng.random() < 0.6:  # explicit sizes, a zero size now and then
        sizes = [int(rng.integers(0 if rng.random() < 0.1 else 1, 4)) for _ in range(int(rng.integers(1, 4)))]
        if not sum(sizes):
            sizes[0] = 1
        shape[axis] = sum(sizes)
        return Instance("Split", [Inp(_f(rng, tuple(shape))), _ints(sizes)], {"axis": axis}, outputs=len(sizes))
    parts = int(rng.integers(1, 4))  # num_outputs: the last output is smaller when the dim does not divide
    shape[axis] = int(rng.integers(parts, 3 * parts + 1))
    return Instance("Split", [Inp(_f(rng, tuple(shape)))], {"axis": axis, "num_outputs": parts}, outputs=parts)


def gen_slice(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    shape = _shape(rng, rank, 1, 5)
    count = int(rng.integers(1, rank + 1))
    axes = [int(a) for a in rng.choice(rank, count, replace=False)]
    starts, ends, steps = [], [], []
    negative_step = rng.random() < 0.15
    for a in axes:
        n = shape[a]
        # in range, negative, past either end, and the INT64 sentinels exporters write
        starts.append([int(rng.integers(-n - 2, n + 2)), 0, -(2**62)][int(rng.integers(0, 3))])
        ends.append([int(rng.integers(-n - 2, n + 3)), n, 2**62, -1][int(rng.integers(0, 4))])
        steps.append(int(rng.integers(1, 4)))
    if negative_step:
        steps[0] = -steps[0]
    inputs: list[Inp | Const | None] = [Inp(_f(rng, shape)), _ints(starts), _ints(ends)]
    explicit_axes = rng.random() < 0.8 or axes != list(range(count))
    if explicit_axes:
        inputs.append(_ints([a - rank if rng.random() < 0.5 else a for a in axes]))
    else:
        inputs.append(None)
    if rng.random() < 0.7 or any(s != 1 for s in steps):
        inputs.append(_ints(steps))
    while inputs and inputs[-1] is None:
        inputs.pop()
    return Instance("Slice", inputs, expect_opaque=negative_step)


def gen_expand(rng: np.random.Generator) -> Instance:
    sx, st = _bcast_shapes(rng, 2)
    if rng.random() < 0.5:
        sx, st = st, sx  # the target may be smaller than the input (Expand broadcasts both ways)
    return Instance("Expand", [Inp(_f(rng, sx)), _ints(list(st))])


def gen_gather(rng: np.random.Generator) -> Instance:
    rank = int(rng.integers(1, 5))
    shape = _shape(rng, rank)
    axis = _axis(rng, rank)
    n = shape[axis]
    idx = rng.integers(-n, n, _shape(rng, int(rng.integers(0, 3))))
    return Instance("Gather", [Inp(_f(rng, shape)), Inp(np.asarray(idx, dtype=np.int64))], {"axis": axis})


def gen_reduce(op: str) -> Callable[[np.random.Generator], Instance]:
    def gen(rng: np.random.Generator) -> Instance:
        rank = int(rng.integers(1, 5))
        x = Inp(_f(rng, _shape(rng, rank)))
        attrs: dict[str, Any] = {}
        if rng.random() < 0.5:
            attrs["keepdims"] = int(rng.integers(0, 2))
        if rng.random() < 0.8:
            count = int(rng.integers(1, rank + 1))
            axes = [int(a) - rank if rng.random() < 0.5 else int(a) for a in rng.choice(rank, count, replace=False)]
            return Instance(op, [x, _ints(axes)], attrs)
        if rng.random() < 0.3:
            attrs["noop_with_empty_axes"] = 1  # the identity: not modeled
            return Instance(op, [x], attrs, expect_opaque=True)
        return Instance(op, [x], attrs)

    return gen


def gen_plugin(op: str) -> Callable[[np.random.Generator], Instance]:
    """A plug-in family's op: one of its own proof instances (dims up to 6, beyond the proof's 1-4), random
    values: its semantics in the family module must agree with onnxruntime like every built-in's."""
    spec = OPS[op]
    family = plugin_for(op)
    assert family is not None
    cases = list(family.instances(spec, GenConfig(dims=(1, 2, 3, 4, 5, 6))))

    def gen(rng: np.random.Generator) -> Instance:
        shapes, attrs = cases[int(rng.integers(len(cases)))]
        inputs: list[Inp | Const | None] = [Inp(_f(rng, tuple(shapes[a.name]))) for a in spec.args if a.sort == "T"]
        return Instance(op, inputs, dict(attrs))

    return gen


#: Plug-in ops that are no ONNX operator of their name and signature (their family's ``lower`` hook writes other
#: nodes: Attention takes the keys transposed): a one-node model of them would run another op. Their semantics
#: are compared with their reference and their lowering with onnxruntime in their own tests
#: (tests/test_attention.py: torch's scaled_dot_product_attention, the lowered nodes in onnxruntime).
LOWERED = frozenset(spec.name for family in PLUGINS if family.lower is not None for spec in family.specs)

GENERATORS: dict[str, Callable[[np.random.Generator], Instance]] = {
    "Neg": gen_unary("Neg"),
    "Identity": gen_unary("Identity"),
    **{op: gen_binary(op) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu")},
    **{op: gen_binary(op) for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")},
    "Where": gen_where,
    "Clip": gen_clip,
    "MatMul": gen_matmul,
    "Gemm": gen_gemm,
    "Softmax": gen_softmax("Softmax"),
    "LogSoftmax": gen_softmax("LogSoftmax"),
    "LayerNormalization": gen_layernorm,
    "Conv": gen_conv,
    "MaxPool": gen_pool("MaxPool"),
    "AveragePool": gen_pool("AveragePool"),
    "GlobalAveragePool": gen_global_pool("GlobalAveragePool"),
    "GlobalMaxPool": gen_global_pool("GlobalMaxPool"),
    "LRN": gen_lrn,
    "BatchNormalization": gen_batchnorm,
    "Flatten": gen_flatten,
    "Reshape": gen_reshape,
    "Squeeze": gen_squeeze,
    "Unsqueeze": gen_unsqueeze,
    "Transpose": gen_transpose,
    "Concat": gen_concat,
    "Split": gen_split,
    "Slice": gen_slice,
    "Expand": gen_expand,
    "Gather": gen_gather,
    **{op: gen_reduce(op) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")},
    **{spec.name: gen_plugin(spec.name) for family in PLUGINS for spec in family.specs if spec.name not in LOWERED},
}
SHAPE_ONLY: dict[str, Callable[[np.random.Generator], Instance]] = {
    op: gen_binary(op) if OPS[op].family is Family.BROADCAST else gen_unary(op) for op in UNINTERPRETED
}


# ------------------------------------------------------------------------------------------ models and runs


def _model(inst: Instance, nodes: list[onnx.NodeProto] | None = None) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, feeds, inits, graph_inputs = [], {}, [], []
    for i, item in enumerate(inst.inputs):
        if item is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(item, Const):
            inits.append(numpy_helper.from_array(item.value, name))
        else:
            feeds[name] = item.value
            graph_inputs.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(item.value.dtype), item.value.shape)
            )
    outs = [f"out{j}" for j in range(inst.outputs)]
    if nodes is None:
        nodes = [helper.make_node(inst.op, names, outs, name="node", **inst.attrs)]
    graph = helper.make_graph(
        nodes,
        "one",
        graph_inputs,
        [helper.make_empty_tensor_value_info(o) for o in outs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    # output types from onnx's inference (the outputs onnxruntime computes are compared, not these)
    typed = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for out, inferred in zip(model.graph.output, typed.graph.output, strict=True):
        out.CopyFrom(inferred)
    return model, feeds


# how onnx and onnxruntime refuse an invalid node
INVALID = (
    onnx.shape_inference.InferenceError,
    ort_errors.Fail,
    ort_errors.InvalidArgument,
    ort_errors.InvalidGraph,
    ort_errors.NotImplemented,
    ort_errors.RuntimeException,
)
_SESSION_OPTIONS = ort.SessionOptions()
_SESSION_OPTIONS.log_severity_level = 4  # invalid random instances are expected: no error logs
_SESSION_OPTIONS.intra_op_num_threads = 1
_SESSION_OPTIONS.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), _SESSION_OPTIONS, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, feeds)]


def _constructor(model: onnx.ModelProto, folder: Path) -> tuple[OpSpec, dict[str, Any], Any] | None:
    """The typed constructor's arguments for the model's node, as the encoder writes them (None: opaque)."""
    path = folder / "model.onnx"
    onnx.save(model, path)
    graph = load_onnx(path)
    (node,) = graph.nodes
    spec = spec_for(node.op_type, node.domain)
    assert spec is not None
    values = typed_values(node, graph, spec, used_outputs(graph))
    return None if values is None else (spec, values, graph)


def _lowered_node(spec: OpSpec, values: dict[str, Any], inst: Instance) -> tuple[list[onnx.NodeProto], Instance]:
    """The constructor lowered back to ONNX as extraction and lowering do (IVec inputs become constants)."""
    inputs: list[Inp | Const | None] = []
    feeds = {f"in{i}": item for i, item in enumerate(inst.inputs) if isinstance(item, Inp)}
    for arg in spec.args:
        if arg.kind != "input":
            continue
        value = values[arg.name]
        if arg.sort == "T":
            inputs.append(feeds[value] if value else None)
        elif arg.sort == "TList":
            inputs.extend(feeds[v] for v in value)
        else:
            inputs.append(_ints(list(value)) if value or not arg.optional else None)
    while inputs and inputs[-1] is None:
        inputs.pop()
    attrs = typed_attrs(spec, [values[a.name] for a in spec.args])
    lowered = Instance(inst.op, inputs, attrs, inst.outputs)
    names = ["" if item is None else f"in{i}" for i, item in enumerate(inputs)]
    outs = [f"out{j}" for j in range(inst.outputs)]
    node = helper.make_node(inst.op, names, outs, name="lowered", **attrs)  # type: ignore[arg-type]
    return [node], lowered


# ------------------------------------------------------------------------------------------ evaluation


class RealBackend(NumpyBackend):
    """The numeric back-up's backend with the normalizations' primitives given their real meaning."""

    PRIMITIVES: ClassVar[dict[str, Callable[..., Any]]] = {
        "exp": np.exp,
        "log": np.log,
        "sqrt": np.sqrt,
        "pow": np.power,
    }

    def apply(self, name: str, *args: Any) -> Any:
        fn = self.PRIMITIVES.get(name)
        return fn(*[np.asarray(a, dtype=float) for a in args]) if fn else super().apply(name, *args)


_Z3_KINDS: dict[int, Callable[[list[Any]], Any]] = {
    z3.Z3_OP_ADD: lambda k: sum(k[1:], k[0]),
    z3.Z3_OP_SUB: lambda k: k[0] - sum(k[1:]),
    z3.Z3_OP_MUL: lambda k: math.prod(k),
    z3.Z3_OP_DIV: lambda k: k[0] / k[1],
    z3.Z3_OP_UMINUS: lambda k: -k[0],
    z3.Z3_OP_ITE: lambda k: k[1] if k[0] else k[2],
    z3.Z3_OP_LT: lambda k: k[0] < k[1],
    z3.Z3_OP_GT: lambda k: k[0] > k[1],
    z3.Z3_OP_LE: lambda k: k[0] <= k[1],
    z3.Z3_OP_GE: lambda k: k[0] >= k[1],
    z3.Z3_OP_EQ: lambda k: k[0] == k[1],
    z3.Z3_OP_DISTINCT: lambda k: k[0] != k[1],
    z3.Z3_OP_OR: lambda k: any(k),
    z3.Z3_OP_AND: lambda k: all(k),
    z3.Z3_OP_NOT: lambda k: not k[0],
    z3.Z3_OP_TO_REAL: lambda k: float(k[0]),
    z3.Z3_OP_TO_INT: lambda k: math.floor(k[0]),
}


def _z3_number(expr: Any, memo: dict[int, Any]) -> Any:
    """The value of a z3 term over numerals, with exp/log/sqrt/pow computed (the bounded prover's terms)."""
    key = expr.get_id()
    if key in memo:
        return memo[key]
    if z3.is_rational_value(expr):
        ratio = z3.RatNumRef(expr.as_ast(), expr.ctx)
        value: Any = ratio.numerator_as_long() / ratio.denominator_as_long()
    elif z3.is_int_value(expr):
        value = z3.IntNumRef(expr.as_ast(), expr.ctx).as_long()
    elif z3.is_true(expr) or z3.is_false(expr):
        value = z3.is_true(expr)
    elif z3.is_app_of(expr, z3.Z3_OP_ITE):  # the branch taken only: Gather's out-of-range branch is a free symbol
        cond, then, other = expr.children()
        value = _z3_number(then if _z3_number(cond, memo) else other, memo)
    else:
        kids = [_z3_number(c, memo) for c in expr.children()]
        kind = expr.decl().kind()
        if kind == z3.Z3_OP_UNINTERPRETED:
            value = float(RealBackend.PRIMITIVES[expr.decl().name()](*kids))
        else:
            value = _Z3_KINDS[kind](kids)
    memo[key] = value
    return value


def _args(
    spec: OpSpec, values: dict[str, Any], arrays: dict[str, np.ndarray], z3_backend: bool, integer: bool = False
) -> list[Any]:
    """Constructor arguments in spec order, tensors from ``arrays`` (z3 numerals for the z3 backend: Gather's
    indices as integers, integer data as the integer-valued reals the verifier gives integer tensors)."""

    def tensor(name: str) -> Any:
        a = arrays[name]
        if not z3_backend:
            return a.astype(np.int64) if a.dtype.kind == "i" else a.astype(np.float64)
        out = np.empty(a.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(a.reshape(-1)):
            index = a.dtype.kind == "i" and not integer
            flat[i] = z3.IntVal(int(v)) if index else z3.RealVal(int(v) if a.dtype.kind == "i" else float(v))
        return out

    args: list[Any] = []
    for arg in spec.args:
        value = values[arg.name]
        if arg.sort == "T":
            args.append(tensor(value) if value else None)
        elif arg.sort == "TList":
            args.append([tensor(v) for v in value])
        elif arg.sort == "IVec":
            args.append(tuple(value or ()))
        elif arg.sort == "f64":
            args.append(z3.RealVal(float(value)) if z3_backend else float(value))
        elif arg.sort == "i64":
            args.append(int(value))
        else:
            args.append(str(value))
    return args


class RealIntegerBackend(NumpyIntegerBackend):
    """The numpy integer backend (truncating division), for ops on integer tensors."""


def _verifier_outputs(
    spec: OpSpec,
    values: dict[str, Any],
    arrays: dict[str, np.ndarray],
    outputs: int,
    z3_backend: bool,
    integer: bool = False,
) -> list[np.ndarray]:
    """The verifier's values of the node; ``integer``: its data are integers, evaluated as the verifier
    evaluates ops on integer tensors (truncating division)."""
    results = []
    for index in range(outputs):
        args = _args(spec, values, arrays, z3_backend, integer)
        if spec.multi_output:
            args.append(index)
        if z3_backend:
            terms = evaluate(spec.name, args, Z3IntegerBackend() if integer else Z3Backend())
            memo: dict[int, Any] = {}
            flat = [float(_z3_number(t, memo)) for t in terms.reshape(-1)]
            results.append(np.asarray(flat, dtype=float).reshape(terms.shape))
        else:
            bk = RealIntegerBackend() if integer else RealBackend()
            results.append(np.asarray(evaluate(spec.name, args, bk), dtype=float))
    return results


def _mismatch(want: np.ndarray, got: np.ndarray, shape_only: bool) -> str | None:
    if tuple(want.shape) != tuple(got.shape):
        return f"shape {list(got.shape)}, onnxruntime {list(want.shape)}"
    if shape_only:
        return None
    w = np.asarray(want, dtype=float)
    if want.dtype.kind in "iu":  # integer outputs: exactly
        if not np.array_equal(got, w):
            return f"integer values differ: {got.reshape(-1)[:6].tolist()} against {w.reshape(-1)[:6].tolist()}"
        return None
    if not np.allclose(got, w, rtol=RTOL, atol=ATOL, equal_nan=True):
        return f"max abs error {np.max(np.abs(got - w)):.3g}"
    return None


# ------------------------------------------------------------------------------------------ the tests


@dataclass
class Tally:
    checked: int = 0  # instances whose values (or shapes) were compared
    opaque: int = 0  # instances the encoder leaves opaque (nothing claimed)
    rejected: int = 0  # invalid instances onnxruntime refuses
    problems: list[str] = field(default_factory=list)


def _check_instance(inst: Instance, folder: Path, shape_only: bool, tally: Tally) -> None:
    try:
        model, feeds = _model(inst)
        expected = _run(model, feeds)
    except INVALID:  # an invalid random instance (the generators make few: the tests bound them)
        tally.rejected += 1
        return
    typed = _constructor(model, folder)
    shown = [
        None if i is None else i.value.tolist() if isinstance(i, Const) else list(i.value.shape) for i in inst.inputs
    ]
    where = f"{inst.op} {inst.attrs} inputs {shown}"
    if typed is None:
        tally.opaque += 1
        if not inst.expect_opaque:
            tally.problems.append(f"{where}: the encoder leaves it opaque")
        return
    if inst.expect_opaque:
        tally.problems.append(f"{where}: typed although its form is not modeled")
        return
    spec, values, graph = typed
    arrays = dict(feeds)
    arrays.update({k: np.asarray(v) for k, v in graph.initializers.items()})
    backends = [False] if shape_only else [False, True]
    first = inst.inputs[0]
    integer = isinstance(first, Inp) and first.value.dtype.kind in "iu"
    for z3_backend in backends:
        try:
            got = _verifier_outputs(spec, values, arrays, inst.outputs, z3_backend, integer)
        except ShapeError as exc:
            tally.problems.append(f"{where}: the verifier rejects a valid node: {exc}")
            return
        for j, (want, value) in enumerate(zip(expected, got, strict=True)):
            problem = _mismatch(want, value, shape_only)
            if problem:
                backend = "z3" if z3_backend else "numpy"
                tally.problems.append(f"{where}: output {j} ({backend} backend): {problem}")
                return
    nodes, lowered = _lowered_node(spec, values, inst)
    lowered_model, lowered_feeds = _model(lowered, nodes)
    for j, (want, value) in enumerate(zip(expected, _run(lowered_model, lowered_feeds), strict=True)):
        problem = _mismatch(want, value, shape_only)
        if problem:
            tally.problems.append(f"{where}: lowered as {nodes[0].input} {lowered.attrs}: output {j}: {problem}")
            return
    tally.checked += 1


def _check_op(op: str, gen: Callable[[np.random.Generator], Instance], count: int, shape_only: bool) -> Tally:
    rng = np.random.default_rng([SEED, sorted(OPS).index(op)])
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(count):
            _check_instance(gen(rng), Path(tmp), shape_only, tally)
    return tally


def test_every_typed_operator_has_a_generator() -> None:
    assert set(GENERATORS) | set(SHAPE_ONLY) | LOWERED == set(OPS)
    assert not set(GENERATORS) & set(SHAPE_ONLY)


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_semantics_match_onnxruntime(op: str) -> None:
    tally = _check_op(op, GENERATORS[op], INSTANCES, shape_only=False)
    assert not tally.problems, "\n".join(tally.problems[:5])
    # the generators make valid nodes: most instances are compared (not refused, not opaque)
    assert tally.checked >= INSTANCES * 2 // 3, tally


@pytest.mark.parametrize("op", UNINTERPRETED)
def test_uninterpreted_operators_have_onnxruntime_shapes(op: str) -> None:
    tally = _check_op(op, SHAPE_ONLY[op], SHAPE_ONLY_INSTANCES, shape_only=True)
    assert not tally.problems, "\n".join(tally.problems[:5])
    assert tally.checked == SHAPE_ONLY_INSTANCES, tally


# Instances that once disagreed (found by this test), kept as fast regressions.
REGRESSIONS = [
    # ceil_mode with asymmetric pads: the last window starts in the right padding and is dropped (the
    # verifier once compared with size + (head + tail) // 2 instead of size + head)
    Instance(
        "MaxPool",
        [Inp(np.arange(8, dtype=np.float32).reshape(2, 2, 2))],
        {"kernel_shape": [2], "strides": [2], "pads": [0, 1], "ceil_mode": 1},
    ),
    Instance(
        "AveragePool",
        [Inp(np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3))],
        {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 2], "ceil_mode": 1},
    ),
    # ... and, with more padding at the head, the verifier once dropped a window ONNX keeps (one output short)
    Instance(
        "MaxPool",
        [Inp(np.arange(4, dtype=np.float32).reshape(1, 2, 2))],
        {"kernel_shape": [3], "strides": [3], "pads": [2, 0], "ceil_mode": 1},
    ),
    Instance(
        "AveragePool",
        [Inp(np.arange(10, dtype=np.float32).reshape(1, 2, 5))],
        {"kernel_shape": [3], "strides": [3], "pads": [2, 0], "ceil_mode": 1, "count_include_pad": 1},
    ),
    # auto_pad SAME with dilations: onnxruntime pads for the undilated kernel, so it is left opaque
    Instance(
        "AveragePool",
        [Inp(np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3))],
        {"kernel_shape": [2, 1], "strides": [1, 2], "dilations": [2, 1], "auto_pad": "SAME_UPPER"},
        expect_opaque=True,
    ),
]


@pytest.mark.parametrize("inst", REGRESSIONS, ids=lambda inst: f"{inst.op}-{sorted(inst.attrs)}")
def test_regressions(inst: Instance, tmp_path: Path) -> None:
    tally = Tally()
    _check_instance(inst, tmp_path, False, tally)
    assert not tally.problems, tally.problems
    assert tally.checked + tally.opaque == 1, tally


def test_a_wrong_semantics_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness is not vacuous: a ReduceMean that forgets to divide (right shapes, wrong values) is
    caught."""
    family = registry.family_for("ReduceMean")
    assert family is not None

    def sum_for_mean(op: str, args: Sequence[Any], bk: Any) -> Any:
        return family.evaluate("ReduceSum" if op == "ReduceMean" else op, args, bk)

    monkeypatch.setitem(registry._FAMILY_OF, "ReduceMean", dataclasses.replace(family, evaluate=sum_for_mean))
    tally = _check_op("ReduceMean", GENERATORS["ReduceMean"], INSTANCES, shape_only=False)
    assert tally.problems and "max abs error" in tally.problems[0]


def test_a_reduction_without_semantics_is_not_taken_for_a_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduction typed in the op registry but not modelled here (ReduceProd) must fail loudly: read as a sum,
    a rule about it would be 'proven' against the wrong function."""
    spec = OPS["ReduceSum"]
    monkeypatch.setitem(OPS, "ReduceProd", OpSpec("ReduceProd", spec.family, spec.args))
    monkeypatch.setitem(registry._FAMILY_OF, "ReduceProd", registry.family_for("ReduceSum"))
    x = np.arange(1.0, 7.0).reshape(2, 3)
    with pytest.raises(NotImplementedError, match="ReduceProd: no semantics"):
        evaluate("ReduceProd", [x, (1,), 0, 0], NumpyBackend())


def test_the_ops_a_proof_may_not_stand_for_are_exactly_the_exact_ones() -> None:
    """verify/_verify.py reuses a proof about an uninterpreted elementwise op (``bk.apply``) for every op of its
    kind; ``elementwise.INTERPRETED`` names the ops it must never do that for. An op made exact without being
    listed there (or listed but uninterpreted) would make that reuse unsound: each op's evaluation decides."""
    from unity_eq.ops.elementwise import ELEMENTWISE, INTERPRETED
    from unity_eq.verify._gen import op_instances
    from unity_eq.verify._semantics import SYMBOLIC, VarSpec

    class Recording(NumpyBackend):
        def __init__(self) -> None:
            super().__init__(np.random.default_rng(0))
            self.applied = False

        def apply(self, name: str, *args: Any) -> Any:
            self.applied = True
            return super().apply(name, *args)

    wrong = []
    for spec in ELEMENTWISE.specs:
        args, _out = op_instances(spec.name, GenConfig())[0]
        bk = Recording()
        values = [
            bk.symbols(f"a{i}", a.shape) if isinstance(a, VarSpec) else bk.scalar(f"s{i}") if a == SYMBOLIC else a
            for i, a in enumerate(args)
        ]
        evaluate(spec.name, values, bk)
        if bk.applied == (spec.name in INTERPRETED):
            wrong.append(spec.name)
    assert not wrong, f"INTERPRETED disagrees with the semantics for {wrong}"


# ------------------------------------------------------------------------------------------ attribute by attribute
#
# Every attribute of every typed op with an exact semantics, each of its values (or kinds of value), compared
# with onnxruntime on a fixed instance that sets it, so that a value the random generators happen not to draw
# is still compared. Forms the encoder leaves opaque are listed in OPAQUE_FORMS and must stay opaque (the
# values of the others are compared, so nothing the encoder types is left unchecked). Attributes with no
# effect on the output the verifier reads: MaxPool's storage_order (its indices output, which keeps the node
# opaque when read), BatchNormalization's momentum (training mode, opaque), LayerNormalization's stash_type
# (the precision of its mean: the verifier computes over the reals), Cast's saturate (float8 only).


def _x(*shape: int) -> Inp:
    return Inp(np.random.default_rng(sum(shape) + len(shape)).standard_normal(shape).astype(np.float32))


def _pool_case(op: str, **attrs: Any) -> Instance:
    attrs.setdefault("kernel_shape", [2, 2])
    return Instance(op, [_x(1, 2, 5, 4)], attrs)


def _conv_case(group: int = 1, **attrs: Any) -> Instance:
    return Instance("Conv", [_x(1, 2 * group, 5, 4), _x(3 * group, 2, 2, 2), _x(3 * group)], dict(attrs, group=group))


def _ints_inp(values: list[int]) -> Inp:
    return Inp(np.asarray(values, dtype=np.int64))


ATTRIBUTE_CASES: dict[str, Instance] = {
    # Gemm: every trans flag pair with m, k, n distinct, alpha and beta, C absent or broadcast
    **{
        f"Gemm-transA={ta}-transB={tb}": Instance(
            "Gemm",
            [_x(*((4, 2) if ta else (2, 4))), _x(*((3, 4) if tb else (4, 3))), _x(3)],
            {"transA": ta, "transB": tb, "alpha": 0.5, "beta": -1.5},
        )
        for ta in (0, 1)
        for tb in (0, 1)
    },
    "Gemm-C-absent": Instance("Gemm", [_x(2, 4), _x(4, 3), None], {"alpha": 2.0}),
    # ... and C of every shape the bounded proofs take (every one that broadcasts to [m, n]: [1] included)
    **{
        f"Gemm-C={list(c)}": Instance("Gemm", [_x(2, 4), _x(4, 3), _x(*c)], {"beta": 0.5})
        for c in ((), (1,), (3,), (1, 1), (1, 3), (2, 1), (2, 3))
    },
    # Softmax and LogSoftmax: every axis of a rank-3 input, negative spellings included
    **{
        f"{op}-axis={axis}": Instance(op, [_x(2, 3, 4)], {"axis": axis})
        for op in ("Softmax", "LogSoftmax")
        for axis in range(-3, 3)
    },
    # LayerNormalization: every axis, epsilon, stash_type 0 and 1, Scale and B of lower rank (broadcast)
    **{
        f"LayerNormalization-axis={axis}": Instance(
            "LayerNormalization", [_x(2, 3, 4), _x(*(2, 3, 4)[axis % 3 :]), _x(4)], {"axis": axis, "epsilon": 0.5}
        )
        for axis in range(-3, 3)
    },
    **{
        f"LayerNormalization-stash_type={st}": Instance(
            "LayerNormalization", [_x(2, 3, 4), _x(3, 4), None], {"axis": 1, "stash_type": st}
        )
        for st in (0, 1)
    },
    # Conv: auto_pad values, dilations, strides, pads, group, kernel_shape given
    **{
        f"Conv-auto_pad={ap}": _conv_case(auto_pad=ap, strides=[2, 1])
        for ap in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
    },
    "Conv-dilations": _conv_case(dilations=[2, 1]),
    "Conv-pads": _conv_case(pads=[1, 0, 2, 1], strides=[2, 2]),
    "Conv-group=2": _conv_case(group=2),
    "Conv-kernel_shape": _conv_case(kernel_shape=[2, 2]),
    # MaxPool, AveragePool: auto_pad x ceil_mode, count_include_pad x pads x ceil_mode, dilations, strides
    **{
        f"{op}-auto_pad={ap}-ceil_mode={cm}": _pool_case(op, auto_pad=ap, ceil_mode=cm, strides=[2, 2])
        for op in ("MaxPool", "AveragePool")
        for ap in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
        for cm in (0, 1)
    },
    **{
        f"AveragePool-count_include_pad={cip}-ceil_mode={cm}-pads": _pool_case(
            "AveragePool", count_include_pad=cip, ceil_mode=cm, pads=[1, 0, 1, 1], strides=[2, 2]
        )
        for cip in (0, 1)
        for cm in (0, 1)
    },
    **{f"{op}-dilations": _pool_case(op, dilations=[2, 1], pads=[1, 1, 0, 0]) for op in ("MaxPool", "AveragePool")},
    "MaxPool-storage_order=1": _pool_case("MaxPool", storage_order=1),
    # LRN: each size, alpha, beta, bias
    **{
        f"LRN-size={n}": Instance("LRN", [_x(1, 5, 2, 2)], {"size": n, "alpha": 0.3, "beta": 0.6, "bias": 1.5})
        for n in (1, 3, 5)
    },
    "BatchNormalization-epsilon-momentum": Instance(
        "BatchNormalization",
        [_x(2, 3, 2), _x(3), _x(3), _x(3), Inp(np.asarray([0.5, 1.0, 2.0], dtype=np.float32))],
        {"epsilon": 0.25, "momentum": 0.5},
    ),
    # layout ops
    **{f"Flatten-axis={axis}": Instance("Flatten", [_x(2, 3, 4)], {"axis": axis}) for axis in range(-3, 4)},
    "Reshape-allowzero=1": Instance("Reshape", [_x(2, 3, 4), _ints([4, 6])], {"allowzero": 1}),
    "Transpose-perm-default": Instance("Transpose", [_x(2, 3, 4)]),
    "Transpose-perm": Instance("Transpose", [_x(2, 3, 4)], {"perm": [2, 0, 1]}),
    **{f"Concat-axis={axis}": Instance("Concat", [_x(2, 3, 4), _x(2, 3, 4)], {"axis": axis}) for axis in range(-3, 3)},
    "Split-num_outputs": Instance("Split", [_x(2, 5, 4)], {"axis": 1, "num_outputs": 2}, outputs=2),
    "Split-zero-size": Instance("Split", [_x(2, 3, 4), _ints([0, 3])], {"axis": 1}, outputs=2),
    **{
        f"Gather-axis={axis}": Instance("Gather", [_x(2, 3, 4), _ints_inp([1, -1])], {"axis": axis}) for axis in (-2, 1)
    },
    # reductions: keepdims, noop_with_empty_axes with axes given (no effect), empty axes without it (every dim)
    **{
        f"{op}-keepdims={k}-noop_with_empty_axes={nop}": Instance(
            op, [_x(2, 3, 4), _ints([0, -1])], {"keepdims": k, "noop_with_empty_axes": nop}
        )
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
        for k in (0, 1)
        for nop in (0, 1)
    },
    **{f"{op}-no-axes": Instance(op, [_x(2, 3)], {"keepdims": 0}) for op in ("ReduceSum", "ReduceMean")},
    **{f"SpaceToDepth-blocksize={b}": Instance("SpaceToDepth", [_x(1, 2, 4, 4)], {"blocksize": b}) for b in (1, 2, 4)},
    "Clip-no-bounds": Instance("Clip", [_x(2, 3)]),
    "Clip-min-only": Instance("Clip", [_x(2, 3), Inp(np.asarray(0.1, dtype=np.float32)), None]),
    # integer tensors: onnxruntime's integer Div and ReduceMean truncate toward zero, and so does the verifier
    "Div-int64": Instance("Div", [_ints_inp([-7, 7, -7, 7, 5, -1, 0]), _ints_inp([2, -2, -2, 2, 3, 2, 5])]),
    "ReduceMean-int64": Instance(
        "ReduceMean", [Inp(np.asarray([[1, 2], [2, 3], [-1, -2]], dtype=np.int64)), _ints([1])], {"keepdims": 0}
    ),
    "ReduceMean-int64-all": Instance(
        "ReduceMean", [Inp(np.asarray([[1, 2], [2, 3]], dtype=np.int64))], {"keepdims": 0}
    ),
    "MatMul-int64": Instance(
        "MatMul", [Inp(np.arange(6, dtype=np.int64).reshape(2, 3)), Inp(np.arange(6, dtype=np.int64).reshape(3, 2) - 3)]
    ),
}

#: forms the encoder does not model: it must leave them opaque (nothing is claimed about them, no rule fires)
OPAQUE_FORMS: dict[str, Instance] = {
    **{
        f"{op}-noop_with_empty_axes=1-no-axes": Instance(op, [_x(2, 3)], {"noop_with_empty_axes": 1})
        for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")
    },
    "Slice-negative-step": Instance("Slice", [_x(4, 3), _ints([-1]), _ints([-5]), _ints([0]), _ints([-1])]),
    **{
        f"{op}-SAME-dilations": _pool_case(op, auto_pad="SAME_UPPER", dilations=[2, 1])
        for op in ("MaxPool", "AveragePool")
    },
    # (Conv with SAME and dilations: onnxruntime refuses to run it; the encoder leaves it opaque and the
    # verifier's shape inference refuses it, so a rule that builds one is refuted: test_conv_same_dilated)
    "MaxPool-indices-read": Instance("MaxPool", [_x(1, 2, 4, 4)], {"kernel_shape": [2, 2]}, outputs=2),
    "LayerNormalization-mean-read": Instance("LayerNormalization", [_x(2, 3), _x(3)], {"axis": -1}, outputs=2),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTE_CASES))
def test_each_attribute_value_matches_onnxruntime(case: str, tmp_path: Path) -> None:
    tally = Tally()
    _check_instance(ATTRIBUTE_CASES[case], tmp_path, False, tally)
    assert not tally.problems, tally.problems
    assert tally.checked == 1, tally  # compared: not refused by onnxruntime, not left opaque


@pytest.mark.parametrize("case", sorted(OPAQUE_FORMS))
def test_forms_not_modelled_stay_opaque(case: str, tmp_path: Path) -> None:
    inst = dataclasses.replace(OPAQUE_FORMS[case], expect_opaque=True)
    tally = Tally()
    _check_instance(inst, tmp_path, False, tally)
    assert not tally.problems, tally.problems
    assert tally.opaque == 1, tally  # onnxruntime runs it (not refused) and the encoder does not type it


def test_every_attribute_of_every_exact_op_has_a_case() -> None:
    """Each attribute of each typed op with exact semantics is set by some case above (or named among the
    attributes that do not change what the verifier reads)."""
    no_effect = {("MaxPool", "storage_order"), ("BatchNormalization", "training_mode"), ("Cast", "saturate")}
    cases = [*ATTRIBUTE_CASES.values(), *OPAQUE_FORMS.values()]
    missing = []
    for op, spec in OPS.items():
        if op in UNINTERPRETED or op in LOWERED:
            continue
        for arg in spec.args:
            if arg.kind != "attr" or (op, arg.name) in no_effect:
                continue
            if not any(c.op == op and arg.name in c.attrs for c in cases):
                missing.append(f"{op}.{arg.name}")
    assert not missing, missing


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_noop_with_empty_axes_is_modelled_for_rules_that_write_it(op: str, keepdims: int, tmp_path: Path) -> None:
    """The encoder leaves `noop_with_empty_axes=1` with no axes opaque, but a rule may write the constructor
    `(ReduceSum x (vec-empty) k 1)`: its semantics is the identity, as onnxruntime's, and lowering it gives
    the node back (ONNX: with no axes and the flag, the input unchanged)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    inst = Instance(op, [Inp(x)], {"keepdims": keepdims, "noop_with_empty_axes": 1})
    model, feeds = _model(inst)
    (want,) = _run(model, feeds)
    symbolic = np.array([z3.RealVal(float(v)) for v in x.reshape(-1)], dtype=object).reshape(x.shape)
    numeric = evaluate(op, [x.astype(np.float64), (), keepdims, 1], RealBackend())
    terms = evaluate(op, [symbolic, (), keepdims, 1], Z3Backend())
    exact = np.asarray([float(_z3_number(t, {})) for t in terms.reshape(-1)]).reshape(terms.shape)
    for got in (numeric, exact):
        assert np.array_equal(np.asarray(got, dtype=float), want.astype(float)), (got, want)
    attrs = typed_attrs(OPS[op], [None, (), keepdims, 1])
    assert attrs.get("noop_with_empty_axes") == 1, attrs  # lowering keeps the flag


def test_conv_same_dilated_is_refused_as_onnxruntime_refuses_it() -> None:
    from unity_eq.ops.conv import normalize

    with pytest.raises(ShapeError, match="does not run in onnxruntime"):
        evaluate(
            "Conv",
            [np.zeros((1, 1, 4, 4)), np.zeros((1, 1, 2, 2)), None, "SAME_UPPER", (2, 2), 1, (), (), ()],
            NumpyBackend(),
        )
    from unity_eq.ops.family import NodeView, NotModeled

    view = NodeView("Conv", {"w": (1, 1, 2, 2)}, ((1, 1, 4, 4),))
    with pytest.raises(NotModeled):
        normalize("Conv", {"W": "w", "auto_pad": "SAME_LOWER", "dilations": (1, 2), "kernel_shape": ()}, view)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_patch_windows_match_onnxruntime(op: str, tmp_path: Path) -> None:
    """The patch windows the bounded proofs enumerate (``cases.patch_windows``: kernel = strides, every pad
    0-1, dilations 1-2) mean what onnxruntime computes, with ceil_mode 0/1 and count_include_pad 0/1: a proof
    over them is only as good as this. Every attribute combination on one input ([1, 1, 4, 3]: an even H, an
    odd W); the whole product (7 536 nodes) agreed when the windows were added."""
    from unity_eq.ops.cases import patch_windows

    tally = Tally()
    windows = [w for w in patch_windows() if w[0] == (4, 3)]
    for (spatial, kern, pads, strides, dils, _auto), ceil, cip in itertools.product(
        windows, (0, 1), (0, 1) if op == "AveragePool" else (0,)
    ):
        attrs: dict[str, Any] = dict(
            kernel_shape=list(kern), pads=list(pads), strides=list(strides), dilations=list(dils), ceil_mode=ceil
        )
        if op == "AveragePool":
            attrs["count_include_pad"] = cip
        _check_instance(Instance(op, [_x(1, 1, *spatial)], attrs), tmp_path, False, tally)
    assert not tally.problems, "\n".join(tally.problems[:5])
    assert len(windows) == 80 and tally.checked == 80 * 2 * (2 if op == "AveragePool" else 1), tally


def test_conv_patch_windows_match_onnxruntime(tmp_path: Path) -> None:
    """Conv takes the same patch windows (a patchify Conv: kernel = strides, every pad 0-1, dilations 1-2) and
    the unpadded tiling windows on (N, C, M) = (1, 1, 1): the semantics agree with onnxruntime on each of those
    of one input size ([1, 1, 4, 3]: an even H, an odd W), and the instances hold them."""
    from unity_eq.ops.cases import patch_windows, tiling_windows
    from unity_eq.verify._gen import GenConfig
    from unity_eq.verify._instances import op_instances

    tally = Tally()
    windows = [w for w in (*patch_windows(), *tiling_windows()) if w[0] == (4, 3)]
    for spatial, kern, pads, strides, dils, _auto in windows:
        attrs: dict[str, Any] = dict(
            kernel_shape=list(kern), pads=list(pads), strides=list(strides), dilations=list(dils)
        )
        _check_instance(Instance("Conv", [_x(1, 1, *spatial), _x(1, 1, *kern)], attrs), tmp_path, False, tally)
    assert not tally.problems, "\n".join(tally.problems[:5])
    assert len(windows) == 80 + 9 and tally.checked == len(windows), tally
    # the verifier's instances, in the order of Conv's arguments: X, W, B, auto_pad, dilations, group,
    # kernel_shape, pads, strides
    taken = {(a[6], a[7], a[8], a[4]) for a, _out in op_instances("Conv", GenConfig()) if a[0].shape[:2] == (1, 1)}
    assert all((kern, pads, strides, dils) in taken for _s, kern, pads, strides, dils, _a in windows)


@pytest.mark.parametrize("shape", [(2, 3), (4, 2, 3), (2, 3, 2, 2)])
def test_batchnorm_training_mode_matches_onnxruntime(shape: tuple[int, ...]) -> None:
    """The encoder leaves a training-mode BatchNormalization opaque, but a rule may write one (or leave
    training_mode a variable): the verifier models its Y with the batch's own statistics (issue 21: every
    case had training_mode 0, so a batch split "for any training_mode" was proven). Y compared with
    onnxruntime's, directly (the encoder does not type the node)."""
    rng = np.random.default_rng(7)
    c = shape[1]
    x = rng.normal(size=shape).astype(np.float32)
    params = [rng.normal(size=c).astype(np.float32) for _ in range(2)]
    params += [rng.normal(size=c).astype(np.float32), rng.uniform(0.5, 2.0, size=c).astype(np.float32)]
    names = ["X", "scale", "B", "mean", "var"]
    outs = ["Y", "running_mean", "running_var"]  # onnxruntime wants all three in training mode
    node = onnx.helper.make_node("BatchNormalization", names, outs, epsilon=0.25, momentum=0.5, training_mode=1)
    inputs = [
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(v.shape))
        for n, v in zip(names, [x, *params], strict=True)
    ]
    outputs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outs]
    graph = onnx.helper.make_graph([node], "bn", inputs, outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 15)])
    model.ir_version = 8
    want = _run(model, dict(zip(names, [x, *params], strict=True)))[0]
    args = [x.astype(float), *(p.astype(float) for p in params), 0.25, 0.5, 1]
    got = np.asarray(evaluate("BatchNormalization", args, RealBackend()), dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    inference = np.asarray(evaluate("BatchNormalization", [*args[:-1], 0], RealBackend()), dtype=float)
    assert not np.allclose(inference, want, atol=1e-3)  # the two modes differ on these inputs


def _ort_node(op: str, inputs: Sequence[np.ndarray], outputs: int = 1, **attrs: Any) -> np.ndarray:
    """onnxruntime's first output of one node on ``inputs`` (float32 and int64 arrays, fed as graph inputs)."""
    names = [f"in{k}" for k in range(len(inputs))]
    outs = [f"out{k}" for k in range(outputs)]
    kinds = [TensorProto.INT64 if v.dtype == np.int64 else TensorProto.FLOAT for v in inputs]
    graph = helper.make_graph(
        [helper.make_node(op, names, outs, **attrs)],
        "one",
        [helper.make_tensor_value_info(n, k, list(v.shape)) for n, k, v in zip(names, kinds, inputs, strict=True)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return _run(model, dict(zip(names, inputs, strict=True)))[0]


@pytest.mark.parametrize(
    ("op", "axis"),
    [("Softmax", -1), ("Softmax", -2), ("LogSoftmax", -1), ("Concat", -1), ("Gather", -1), ("Split", -1)],
)
def test_negative_axes_count_from_the_end_as_onnxruntime_does(op: str, axis: int) -> None:
    """A rule may spell an axis negative; the verifier evaluates it as ONNX does (-1 is the last dim). It
    read -1 as no dim at all before (a split of the softmax axis itself was "proven"; issue 21)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    if op == "Concat":
        want = _ort_node("Concat", [x, x], axis=axis)
        got = evaluate("Concat", [[x.astype(float), x.astype(float)], axis], RealBackend())
    elif op == "Gather":
        idx = np.asarray([3, 0], dtype=np.int64)
        want = _ort_node("Gather", [x, idx], axis=axis)
        got = evaluate("Gather", [x.astype(float), idx, axis], RealBackend())
    elif op == "Split":
        want = _ort_node("Split", [x, np.asarray([1, 3], dtype=np.int64)], outputs=2, axis=axis)  # output 0
        got = evaluate("Split", [x.astype(float), (1, 3), axis, 0], RealBackend())
    else:
        want = _ort_node(op, [x], axis=axis)
        got = evaluate(op, [x.astype(float), axis], RealBackend())
    np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("op", "shape", "axes"),
    [
        ("Squeeze", (1,), (-1,)),
        ("Squeeze", (2, 1, 3), (-2,)),
        ("Squeeze", (1, 2, 1), (-3, 2)),
        ("Unsqueeze", (), (-1,)),
        ("Unsqueeze", (2, 3), (-1, 0)),
        ("Unsqueeze", (2,), (-3, -1)),
    ],
)
def test_negative_squeeze_and_unsqueeze_axes_as_onnxruntime_counts_them(
    op: str, shape: tuple[int, ...], axes: tuple[int, ...]
) -> None:
    """Squeeze counts a negative axis from the end of its input, Unsqueeze from the end of its *output*
    (ONNX; onnxruntime agrees). The verifier refused every negative axis before, so a sound rule that
    writes one was refuted (issue 21: adv-ok-keepdims1-as-unsqueeze-nonempty-axes)."""
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    want = _ort_node(op, [x, np.asarray(axes, dtype=np.int64)])
    got = evaluate(op, [x.astype(float), axes], RealBackend())
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, dtype=float), want)


@pytest.mark.parametrize(
    ("shape", "target", "allowzero"),
    [((2, 3, 4), (0, -1), 0), ((2, 3, 4), (-1, 4), 0), ((2, 3, 4), (0, 0, 4), 0), ((2, 3), (3, 2), 1)],
)
def test_reshape_targets_with_zero_and_minus_one_match_onnxruntime(
    shape: tuple[int, ...], target: tuple[int, ...], allowzero: int
) -> None:
    """ONNX's Reshape target: 0 copies the input's dim (allowzero 0), -1 is inferred; the verifier took them
    for no dims (so Reshape(Reshape(x, s1), (0, -1)) = Reshape(x, (0, -1)) was "proven"; issue 21)."""
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    want = _ort_node("Reshape", [x, np.asarray(target, dtype=np.int64)], allowzero=allowzero)
    got = evaluate("Reshape", [x.astype(float), target, allowzero], RealBackend())
    np.testing.assert_array_equal(np.asarray(got, dtype=float), want)


def test_reshape_zero_with_allowzero_is_a_shape_error() -> None:
    """With allowzero 1 a 0 is a dim of size 0: no target for a non-empty input (onnxruntime refuses it too)."""
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error types
        _ort_node("Reshape", [x, np.asarray([0, 3], dtype=np.int64)], allowzero=1)
    with pytest.raises(ShapeError):
        evaluate("Reshape", [x.astype(float), (0, 3), 1], RealBackend())

"""Concrete counterexamples for the adversary corpus (``tests/data/adversary_corpus.egg``), run by onnxruntime.

Each ``adv-*`` rule of the corpus has a function here, registered under its name, that builds both sides of
the rule on the failing shapes and attributes named in the corpus comment, one ONNX node at a time
(onnxruntime runs every operator; numpy only slices, concatenates and sums the pieces of the device mesh, as
docs/verify.md "What a rule must keep" defines them), and returns the two values. The test asserts they
differ: a different shape, a different value, or a right-hand side that onnxruntime refuses to evaluate (an
operator applied to shapes it does not take). None of this uses the verifier: it is the independent evidence
that each rule is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

OPSET = 18
Side = Callable[[], np.ndarray]
COUNTEREXAMPLES: dict[str, Callable[[], tuple[Side, Side]]] = {}


class Invalid(Exception):
    """onnxruntime (or the mesh simulation) cannot evaluate a side on these shapes."""


def counterexample(name: str) -> Callable[[Callable[[], tuple[Side, Side]]], Callable[[], tuple[Side, Side]]]:
    """Register the counterexample of corpus rule ``name``."""

    def register(fn: Callable[[], tuple[Side, Side]]) -> Callable[[], tuple[Side, Side]]:
        COUNTEREXAMPLES[name] = fn
        return fn

    return register


def run(op: str, *inputs: Any, outputs: int = 1, index: int = 0, **attrs: Any) -> np.ndarray:
    """Output ``index`` of one ONNX node ``op`` with ``outputs`` outputs on ``inputs`` (numpy arrays; ``None``
    for an absent optional input), by onnxruntime."""
    names, feeds, graph_inputs = [], {}, []
    for k, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        arr = np.asarray(value)
        name = f"in{k}"
        names.append(name)
        feeds[name] = arr
        dtype = helper.np_dtype_to_tensor_dtype(arr.dtype)
        graph_inputs.append(helper.make_tensor_value_info(name, dtype, arr.shape))
    out_names = [f"out{k}" for k in range(outputs)]
    node = helper.make_node(op, names, out_names, **attrs)
    outs = [onnx.ValueInfoProto(name=o) for o in out_names]  # types left to onnxruntime's inference
    graph = helper.make_graph([node], "g", graph_inputs, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return np.asarray(session.run(None, feeds)[index])
    except Exception as exc:  # onnxruntime/onnx refusing the node is the evidence, kept as its message
        raise Invalid(f"{op}: {exc}") from exc


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Distinct values: a coincidence cannot make the sides agree."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def chunks(x: np.ndarray, d: int, n: int) -> list[np.ndarray]:
    """Partition: piece i of n equal contiguous chunks along d."""
    if x.shape[d] % n:
        raise Invalid(f"dim {d} of size {x.shape[d]} does not split into {n}")
    return list(np.split(x, n, axis=d))


def gather(pieces: list[np.ndarray], d: int) -> np.ndarray:
    """Combine: the all-gather, pieces concatenated in axis order."""
    try:
        return np.concatenate(pieces, axis=d)
    except (ValueError, np.exceptions.AxisError) as exc:
        raise Invalid(f"Combine along {d}: {exc}") from exc


def differ(lhs: Side, rhs: Side) -> str:
    """Why the sides differ ('' when they agree). The left-hand side must evaluate."""
    want = lhs()
    try:
        got = rhs()
    except Invalid as exc:
        return f"right-hand side invalid: {exc}"
    if want.shape != got.shape:
        return f"shapes {want.shape} vs {got.shape}"
    if not np.allclose(want, got, equal_nan=False):
        return f"values {want.ravel()[:6]} vs {got.ravel()[:6]}"
    return ""


# ---------------------------------------------------------------------------------------------- rank > 4
@counterexample("adv-rank5-transpose-swap01-twice")
def _transpose_swap01() -> tuple[Side, Side]:
    a, p = f32((2, 3, 4, 5, 6)), [1, 0, 3, 4, 2]
    return (lambda: run("Transpose", run("Transpose", a, perm=p), perm=p)), (lambda: a)


@counterexample("adv-rank5-global-avgpool-as-mean")
def _gap_rank5() -> tuple[Side, Side]:
    a = f32((1, 1, 2, 1, 2))
    return (lambda: run("GlobalAveragePool", a)), (lambda: run("ReduceMean", a, i64(2, 3), keepdims=1))


@counterexample("adv-rank4-bcast-transpose-add")
def _transpose_add() -> tuple[Side, Side]:
    a, b, p = f32((2, 2, 1, 1)), f32((2, 1, 1), 1), [1, 0, 2, 3]
    return (lambda: run("Add", run("Transpose", a, perm=p), b)), (lambda: run("Transpose", run("Add", a, b), perm=p))


# ------------------------------------------------------------------------------------------ negative axes
@counterexample("adv-negaxis-softmax-split")
def _softmax_neg() -> tuple[Side, Side]:
    a = f32((2, 2))
    return (lambda: run("Softmax", a, axis=-1)), (
        lambda: gather([run("Softmax", p, axis=-1) for p in chunks(a, 1, 2)], 1)
    )


@counterexample("adv-negaxis-layernorm-split")
def _layernorm_neg() -> tuple[Side, Side]:
    a, s, b = f32((2, 2)), f32((2,), 1), f32((2,), 2)
    return (lambda: run("LayerNormalization", a, s, b, axis=-1)), (
        lambda: gather([run("LayerNormalization", p, s, b, axis=-1) for p in chunks(a, 1, 2)], 1)
    )


@counterexample("adv-negaxis-concat-split")
def _concat_neg() -> tuple[Side, Side]:
    a, b = f32((1, 2)), f32((1, 2), 1)
    pieces = zip(chunks(a, 1, 2), chunks(b, 1, 2), strict=True)
    return (lambda: run("Concat", a, b, axis=-1)), (
        lambda: gather([run("Concat", x, y, axis=-1) for x, y in pieces], 1)
    )


@counterexample("adv-negaxis-slice-split")
def _slice_neg() -> tuple[Side, Side]:
    x, st, en, ax = f32((4,)), i64(1), i64(3), i64(-1)
    return (lambda: run("Slice", x, st, en, ax)), (
        lambda: gather([run("Slice", p, st, en, ax) for p in chunks(x, 0, 2)], 0)
    )


@counterexample("adv-negaxis-gather-split-data-inner")
def _gather_neg() -> tuple[Side, Side]:
    a, i = f32((2, 4)), i64(1)
    return (lambda: run("Gather", a, i, axis=-1)), (
        lambda: gather([run("Gather", p, i, axis=-1) for p in chunks(a, 1, 2)], 1 + 1 - 1)
    )


@counterexample("adv-negaxis-reducemax-split")
def _reducemax_neg() -> tuple[Side, Side]:
    a, axes = f32((2, 2)), i64(-1)
    return (lambda: run("ReduceMax", a, axes, keepdims=1)), (
        lambda: gather([run("ReduceMax", p, axes, keepdims=1) for p in chunks(a, 1, 2)], 1)
    )


# ------------------------------------------------------------------------------------ Transpose / Reshape
@counterexample("adv-transpose-unit-front-as-reshape")
def _transpose_reshape() -> tuple[Side, Side]:
    x, p = f32((2, 2, 1)), [2, 1, 0]
    return (lambda: run("Transpose", x, perm=p)), (lambda: run("Reshape", x, i64(1, 2, 2)))


@counterexample("adv-reshape-reshape-zero-copies")
def _reshape_reshape() -> tuple[Side, Side]:
    x = f32((2, 3))
    return (lambda: run("Reshape", run("Reshape", x, i64(3, 2)), i64(0, -1))), (lambda: run("Reshape", x, i64(0, -1)))


@counterexample("adv-reshape-allowzero-flip")
def _allowzero() -> tuple[Side, Side]:
    x = f32((2, 3))
    return (lambda: run("Reshape", x, i64(0, 3), allowzero=0)), (lambda: run("Reshape", x, i64(0, 3), allowzero=1))


# ---------------------------------------------------------------------------------- Concat / Split, uneven
@counterexample("adv-concat-block-swap-uneven")
def _block_swap() -> tuple[Side, Side]:
    a, b, c, d = f32((1, 1)), f32((1, 2), 1), f32((1, 2), 2), f32((1, 1), 3)
    return (lambda: run("Concat", run("Concat", a, b, axis=1), run("Concat", c, d, axis=1), axis=0)), (
        lambda: run("Concat", run("Concat", a, c, axis=0), run("Concat", b, d, axis=0), axis=1)
    )


@counterexample("adv-split-concat-equal-halves")
def _split_halves() -> tuple[Side, Side]:
    a, b = f32((1,)), f32((3,), 1)
    return (lambda: run("Split", run("Concat", a, b, axis=0), i64(2, 2), axis=0, outputs=2)), (lambda: a)


@counterexample("adv-split-concat-first-two-parts")
def _split_first_two() -> tuple[Side, Side]:
    x = f32((4,))
    parts = lambda: [run("Split", x, i64(1, 1, 2), axis=0, outputs=3, index=k) for k in (0, 1)]  # noqa: E731
    return (lambda: run("Concat", *parts(), axis=0)), (lambda: x)


@counterexample("adv-gather-concat-axis-shift")
def _gather_concat() -> tuple[Side, Side]:
    a, b, i = f32((2, 2)), f32((2, 2), 1), np.array(0, dtype=np.int64)
    return (lambda: run("Gather", run("Concat", a, b, axis=1), i, axis=0)), (
        lambda: run("Concat", run("Gather", a, i, axis=0), run("Gather", b, i, axis=0), axis=1)
    )


# ---------------------------------------------------------------------------------------- Gather / Slice
@counterexample("adv-slice-slice-compose-negative")
def _slice_slice() -> tuple[Side, Side]:
    x = f32((4,))
    return (lambda: run("Slice", run("Slice", x, i64(1), i64(4), i64(0)), i64(-2), i64(3), i64(0))), (
        lambda: run("Slice", x, i64(1 - 2), i64(1 + 3), i64(0))
    )


@counterexample("adv-split-as-slice-drop-last")
def _split_drop_last() -> tuple[Side, Side]:
    x = f32((3,))
    return (lambda: run("Split", x, i64(1, 1, 1), axis=0, outputs=3)), (
        lambda: run("Slice", x, i64(0), i64(-1), i64(0))
    )


@counterexample("adv-gather-gather-commute")
def _gather_gather() -> tuple[Side, Side]:
    x, i, j = f32((2, 2)), i64(1), np.array(0, dtype=np.int64)
    return (lambda: run("Gather", run("Gather", x, i, axis=1), j, axis=0)), (
        lambda: run("Gather", run("Gather", x, j, axis=0), i, axis=1)
    )


@counterexample("adv-gather-scalar-index-split-inner")
def _gather_scalar() -> tuple[Side, Side]:
    a, i = f32((2, 2)), np.array(0, dtype=np.int64)
    return (lambda: run("Gather", a, i, axis=0)), (
        lambda: gather([run("Gather", p, i, axis=0) for p in chunks(a, 1, 2)], 1)
    )


# ----------------------------------------------------------------------------------------- broadcasting
@counterexample("adv-where-same-branches")
def _where_same() -> tuple[Side, Side]:
    c, x = np.array([[True], [False]]), f32((3,))
    return (lambda: run("Where", c, x, x)), (lambda: x)


@counterexample("adv-sub-add-cancel-bcast")
def _sub_add() -> tuple[Side, Side]:
    a, b = f32((3,)), f32((2, 3), 1)
    return (lambda: run("Sub", run("Add", a, b), b)), (lambda: a)


@counterexample("adv-reducesum-pull-factor-keepdims0")
def _pull_factor() -> tuple[Side, Side]:
    a, b, axes = f32((2, 2)), f32((2, 1), 1), i64(1)
    return (lambda: run("ReduceSum", run("Mul", a, b), axes, keepdims=0)), (
        lambda: run("Mul", run("ReduceSum", a, axes, keepdims=0), b)
    )


@counterexample("adv-expand-softmax-axis-shift")
def _expand_softmax() -> tuple[Side, Side]:
    x, s = f32((2, 2)), i64(2, 2, 2)
    return (lambda: run("Softmax", run("Expand", x, s), axis=1)), (lambda: run("Expand", run("Softmax", x, axis=1), s))


@counterexample("adv-expand-expand-fuse")
def _expand_expand() -> tuple[Side, Side]:
    x = f32((1,))
    return (lambda: run("Expand", run("Expand", x, i64(3)), i64(1))), (lambda: run("Expand", x, i64(1)))


# ------------------------------------------------------------------------------------ Where / Clip bounds
def scalar(v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


@counterexample("adv-clip-clip-intersect")
def _clip_clip() -> tuple[Side, Side]:
    x, l1, h1, l2, h2 = scalar(0.5), scalar(0), scalar(1), scalar(2), scalar(3)
    return (lambda: run("Clip", run("Clip", x, l1, h1), l2, h2)), (
        lambda: run("Clip", x, run("Max", l1, l2), run("Min", h1, h2))
    )


@counterexample("adv-clip-as-max-of-min")
def _clip_max_min() -> tuple[Side, Side]:
    x, lo, hi = scalar(0), scalar(2), scalar(1)
    return (lambda: run("Clip", x, lo, hi)), (lambda: run("Max", run("Min", x, hi), lo))


@counterexample("adv-clip-as-min-of-max-one-element-bound")
def _clip_min_max_shape() -> tuple[Side, Side]:
    # Clip keeps the scalar's shape (); Max and Min broadcast it with the [1] bounds to [1]
    x, lo, hi = scalar(5), np.array([1.0], np.float32), np.array([2.0], np.float32)
    return (lambda: run("Clip", x, lo, hi)), (lambda: run("Min", run("Max", x, lo), hi))


@counterexample("adv-where-partial-one-branch")
def _where_partial() -> tuple[Side, Side]:
    c, y = np.array([True, False]), f32((2,), 1)
    pieces = [f32((2,), 2), f32((2,), 3)]  # x is a pending sum over 2 devices: x = pieces[0] + pieces[1]
    return (lambda: run("Where", c, pieces[0] + pieces[1], y)), (lambda: sum(run("Where", c, p, y) for p in pieces))


# -------------------------------------------------------------------------------------------- keepdims
@counterexample("adv-keepdims0-reducesum-fuse")
def _sum_sum() -> tuple[Side, Side]:
    x = f32((2, 3, 4))
    return (lambda: run("ReduceSum", run("ReduceSum", x, i64(0), keepdims=0), i64(1), keepdims=0)), (
        lambda: run("ReduceSum", x, i64(0, 1), keepdims=0)
    )


@counterexample("adv-unsqueeze-unsqueeze-fuse")
def _unsqueeze() -> tuple[Side, Side]:
    x = f32((2, 3))
    return (lambda: run("Unsqueeze", run("Unsqueeze", x, i64(1)), i64(0))), (lambda: run("Unsqueeze", x, i64(1, 0)))


@counterexample("adv-reducesum-empty-axes-split")
def _sum_empty_axes() -> tuple[Side, Side]:
    x, axes = f32((2, 2)), np.zeros((0,), dtype=np.int64)
    return (lambda: run("ReduceSum", x, axes, keepdims=1, noop_with_empty_axes=0)), (
        lambda: gather([run("ReduceSum", p, axes, keepdims=1, noop_with_empty_axes=0) for p in chunks(x, 0, 2)], 0)
    )


# ---------------------------------------------------------------------------------------- MatMul rank 1
@counterexample("adv-matmul-assoc-vector-middle")
def _assoc() -> tuple[Side, Side]:
    a, b, c = f32((2, 2)), f32((2,), 1), f32((2, 2), 2)
    return (lambda: run("MatMul", run("MatMul", a, b), c)), (lambda: run("MatMul", a, run("MatMul", b, c)))


@counterexample("adv-matmul-cols-vector-b")
def _cols_vector() -> tuple[Side, Side]:
    a, b = f32((2, 2)), f32((2,), 1)
    return (lambda: run("MatMul", a, b)), (lambda: gather([run("MatMul", a, p) for p in chunks(b, 0, 2)], 0))


@counterexample("adv-matmul-rows-vector-a")
def _rows_vector() -> tuple[Side, Side]:
    a, b = f32((2,)), f32((2, 3), 1)
    return (lambda: run("MatMul", a, b)), (lambda: gather([run("MatMul", p, b) for p in chunks(a, 0, 2)], 0))


# ------------------------------------------------------------------------------------- Conv groups, pads
@counterexample("adv-conv-group-out-channels")
def _conv_group() -> tuple[Side, Side]:
    a, w, b = f32((1, 2, 1, 1)), f32((2, 1, 1, 1), 1), f32((2,), 2)
    pieces = zip(chunks(w, 0, 2), chunks(b, 0, 2), strict=True)
    return (lambda: run("Conv", a, w, b, group=2)), (
        lambda: gather([run("Conv", a, wp, bp, group=2) for wp, bp in pieces], 1)
    )


@counterexample("adv-conv-hw-swap-asymmetric-pads")
def _conv_pads() -> tuple[Side, Side]:
    a, w, p, pads = f32((1, 1, 2, 2)), f32((1, 1, 1, 1), 1), [0, 1, 3, 2], [1, 0, 0, 0]
    conv = lambda x, k: run("Conv", x, k, kernel_shape=[1, 1], pads=pads)  # noqa: E731
    return (lambda: conv(run("Transpose", a, perm=p), run("Transpose", w, perm=p))), (
        lambda: run("Transpose", conv(a, w), perm=p)
    )


@counterexample("adv-lrn-channel-split-small-window")
def _lrn() -> tuple[Side, Side]:
    a = f32((1, 2, 1, 1))
    lrn = lambda x: run("LRN", x, alpha=1.0, beta=0.75, bias=1.0, size=3)  # noqa: E731
    return (lambda: lrn(a)), (lambda: gather([lrn(p) for p in chunks(a, 1, 2)], 1))


def batchnorm_training(x: np.ndarray, s: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """BatchNormalization's Y with training_mode 1 (ONNX: the batch's mean and biased variance over every axis
    but the channel axis 1). onnxruntime's CPU kernel for training_mode 1 is not in the inference build, so
    this is the formula of the ONNX spec (and its reference implementation)."""
    axes = tuple(k for k in range(x.ndim) if k != 1)
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return ((x - mean) / np.sqrt(var + eps) * s.reshape(shape) + b.reshape(shape)).astype(np.float32)


@counterexample("adv-batchnorm-training-split-batch")
def _bn_training() -> tuple[Side, Side]:
    a = np.array([0.0, 2.0], dtype=np.float32).reshape(2, 1, 1, 1)
    s, b = np.ones(1, np.float32), np.zeros(1, np.float32)
    return (lambda: batchnorm_training(a, s, b, 1e-5)), (
        lambda: gather([batchnorm_training(p, s, b, 1e-5) for p in chunks(a, 0, 2)], 0)
    )


@counterexample("adv-maxpool-split-h-kernel-divides-h")
def _maxpool() -> tuple[Side, Side]:
    a = f32((1, 1, 6, 1))
    pool = lambda x: run("MaxPool", x, kernel_shape=[2, 1], strides=[2, 1])  # noqa: E731
    return (lambda: pool(a)), (lambda: gather([pool(p) for p in chunks(a, 2, 2)], 2))


# ------------------------------------------------------------------------------------ Pow / Div / dtypes
@counterexample("adv-div-mul-cancel")
def _div_mul() -> tuple[Side, Side]:
    a, b = np.array([1.0], np.float32), np.array([0.0], np.float32)
    return (lambda: a), (lambda: run("Div", run("Mul", a, b), b))


@counterexample("adv-pow-distribute-mul")
def _pow_mul() -> tuple[Side, Side]:
    a, b, c = np.array([-1.0], np.float32), np.array([-1.0], np.float32), np.array([0.5], np.float32)
    return (lambda: run("Pow", run("Mul", a, b), c)), (lambda: run("Mul", run("Pow", a, c), run("Pow", b, c)))


@counterexample("adv-int-div-distribute")
def _int_div() -> tuple[Side, Side]:
    a, b, c = np.array([1], np.int32), np.array([1], np.int32), np.array([2], np.int32)
    return (lambda: run("Div", run("Add", a, b), c)), (lambda: run("Add", run("Div", a, c), run("Div", b, c)))


# -------------------------------------------------------------------------------- Softmax axes, perms
@counterexample("adv-softmax-transpose-inverse-perm")
def _softmax_perm() -> tuple[Side, Side]:
    # p = (1 2 0), j = 0: the input dim that lands on output dim 0 is p[0] = 1; the rule uses d with p[d] = 0
    x, p = f32((2, 3, 4)), [1, 2, 0]
    return (lambda: run("Softmax", run("Transpose", x, perm=p), axis=0)), (
        lambda: run("Transpose", run("Softmax", x, axis=2), perm=p)
    )


# ------------------------------------------------------------------------------------- two-axis meshes
@counterexample("adv-2axis-matmul-2d-no-replicate")
def _matmul_2d() -> tuple[Side, Side]:
    """Training: the gradient of b. On a 2 x 2 mesh device (i, j) holds a's row block i and b's column block
    j and computes y[i, j] = a_i @ b_j (forward values are right). The backward of MatMul gives b_j's gradient
    a_i^T g[i, j] on device (i, j); only a Replicate of b's piece on a1 all-reduces it over i. Without it the
    device keeps its own term: compared here with the true gradient a^T g restricted to column block j."""
    a, g = f32((2, 2)), f32((2, 2), 2)  # g: the loss gradient arriving at y = a @ b (b does not enter it)
    true_grad_b0 = lambda: (a.T @ g)[:, :1]  # noqa: E731
    device_00 = lambda: run("MatMul", chunks(a, 0, 2)[0].T.copy(), chunks(chunks(g, 0, 2)[0], 1, 2)[0])  # noqa: E731
    return true_grad_b0, device_00


@counterexample("adv-2axis-combine-order-same-dim")
def _combine_order() -> tuple[Side, Side]:
    """x [4] split along 0 on a1 then a2 (2 x 2): device (i, j) holds block 2 i + j (a sound e-graph's
    pieces: Partition(Partition(G, 0, a1), 0, a2)). The left-hand side gathers on a2 first, then a1: G."""
    g = f32((4,))
    piece = {(i, j): chunks(chunks(g, 0, 2)[i], 0, 2)[j] for i in range(2) for j in range(2)}
    lhs = lambda: gather([gather([piece[i, j] for j in range(2)], 0) for i in range(2)], 0)  # noqa: E731
    rhs = lambda: gather([gather([piece[i, j] for i in range(2)], 0) for j in range(2)], 0)  # noqa: E731
    return lhs, rhs


@counterexample("adv-negaxis-split-split")
def _split_neg() -> tuple[Side, Side]:
    a, s = f32((4,)), i64(2, 2)
    return (lambda: run("Split", a, s, axis=-1, outputs=2)), (
        lambda: gather([run("Split", p, s // 2, axis=-1, outputs=2) for p in chunks(a, 0, 2)], 0)
    )


# ------------------------------------------------------------------------ analysis rules, wrong facts
# Each returns (the fact onnxruntime computes, the fact the analysis rule derives).
def shape_of(x: np.ndarray) -> np.ndarray:
    return np.array(x.shape, dtype=np.int64)


@counterexample("adv-analysis-transpose-shape-unpermuted")
def _an_transpose() -> tuple[Side, Side]:
    x = f32((2, 3))
    return (lambda: shape_of(run("Transpose", x, perm=[1, 0]))), (lambda: shape_of(x))


@counterexample("adv-analysis-reducemean-keepdims0-shape")
def _an_mean() -> tuple[Side, Side]:
    x = f32((2, 3))
    return (lambda: shape_of(run("ReduceMean", x, i64(0), keepdims=0))), (lambda: i64(1, 3))


@counterexample("adv-analysis-matmul-vector-shape")
def _an_matmul() -> tuple[Side, Side]:
    a, b = f32((2, 3)), f32((3,), 1)
    return (lambda: shape_of(run("MatMul", a, b))), (lambda: shape_of(a))


@counterexample("adv-analysis-mm-row-vector-a")
def _an_mm_row() -> tuple[Side, Side]:
    # what matmul-split-rows builds from the fact: a split along "row" dim 0 of a, gathered along output dim 0
    a, b = f32((2,)), f32((2, 3), 1)
    return (lambda: run("MatMul", a, b)), (lambda: gather([run("MatMul", p, b) for p in chunks(a, 0, 2)], 0))


@counterexample("adv-analysis-reducesum-of-shard-is-shard")
def _an_sum_shard() -> tuple[Side, Side]:
    # S(0) on the result says that gathering the devices' pieces along 0 gives the global sum; each device
    # holds the sum of its own piece
    x, axes = f32((2,)), i64(0)
    return (lambda: run("ReduceSum", x, axes, keepdims=1)), (
        lambda: gather([run("ReduceSum", p, axes, keepdims=1) for p in chunks(x, 0, 2)], 0)
    )


@counterexample("adv-analysis-relu-of-partial")
def _an_relu_partial() -> tuple[Side, Side]:
    pieces = [np.array([1.0], np.float32), np.array([-2.0], np.float32)]
    return (lambda: run("Relu", pieces[0] + pieces[1])), (lambda: sum(run("Relu", p) for p in pieces))


@counterexample("adv-analysis-concat3-shape-first-two")
def _an_concat3() -> tuple[Side, Side]:
    a, b, c = f32((1,)), f32((1,), 1), f32((1,), 2)
    return (lambda: shape_of(run("Concat", a, b, c, axis=0))), (lambda: i64(2))


# ----------------------------------------------------------------------------------------- more, various
@counterexample("adv-rank4-mask-add-split-leading-dims")
def _mask_add() -> tuple[Side, Side]:
    x, m = f32((1, 2, 2, 2)), f32((2, 2, 2), 1)
    return (lambda: run("Add", x, m)), (lambda: gather([run("Add", p, m) for p in chunks(x, 1, 2)], 1))


@counterexample("adv-flatten-as-reshape-zero-minus-one")
def _flatten() -> tuple[Side, Side]:
    x = f32((2, 3, 4))
    return (lambda: run("Flatten", x, axis=2)), (lambda: run("Reshape", x, i64(0, -1)))


@counterexample("adv-nan-where-greater-as-max")
def _nan_max() -> tuple[Side, Side]:
    a, b = np.array([np.nan], np.float32), np.array([1.0], np.float32)
    return (lambda: run("Where", run("Greater", a, b), a, b)), (lambda: run("Max", a, b))


@counterexample("adv-float-cancel-addend-in-compare")
def _float_compare() -> tuple[Side, Side]:
    a, b, c = np.array([1.0], np.float32), np.array([0.0], np.float32), np.array([1e8], np.float32)
    as_float = lambda t: t.astype(np.float32)  # noqa: E731  (booleans compared as 0/1)
    return (lambda: as_float(run("Greater", run("Add", a, c), run("Add", b, c)))), (
        lambda: as_float(run("Greater", a, b))
    )


@counterexample("adv-slice-split-first-axis-only")
def _slice_two_axes() -> tuple[Side, Side]:
    x, st, en, ax = f32((2, 4)), i64(0, 1), i64(2, 3), i64(0, 1)
    return (lambda: run("Slice", x, st, en, ax)), (
        lambda: gather([run("Slice", p, st, en, ax) for p in chunks(x, 1, 2)], 1)
    )


# ------------------------------------------------------------------- rank-4 Where, attention head dims
@counterexample("adv-rank4-where-split-condition-unchecked")
def _where_rank4_condition() -> tuple[Side, Side]:
    # the condition broadcasts along the split dim (size 1 there): it has no two equal pieces to partition
    c, x, y = np.array([[[[True]]]]), f32((2, 1, 1, 1)), f32((2, 1, 1, 1), 1)
    pieces = lambda: zip(chunks(c, 0, 2), chunks(x, 0, 2), chunks(y, 0, 2), strict=True)  # noqa: E731
    return (lambda: run("Where", c, x, y)), (lambda: gather([run("Where", *p) for p in pieces()], 0))


@counterexample("adv-rank4-where-split-all-three-mixed-ranks")
def _where_rank4_mixed_ranks() -> tuple[Side, Side]:
    # x has rank 3: its dim 2 is the output's dim 3, so its pieces are cut along another dim than c's and y's
    c, x, y = np.ones((1, 1, 2, 2), bool), f32((1, 2, 2)), f32((1, 1, 2, 2), 1)
    pieces = lambda: zip(chunks(c, 2, 2), chunks(x, 2, 2), chunks(y, 2, 2), strict=True)  # noqa: E731
    return (lambda: run("Where", c, x, y)), (lambda: gather([run("Where", *p) for p in pieces()], 2))


def _attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The fused op's composition without mask, fill or causal mask: Softmax(Q·KT, last axis)·V."""
    return run("MatMul", run("Softmax", run("MatMul", q, kt), axis=-1), v)


@counterexample("adv-attention-feature-scale-to-keys-untransposed")
def _attention_feature_scale() -> tuple[Side, Side]:
    # head dim 2 and two keys: c scales Q's features on the left, KT's keys (its last dim) on the right
    q, c, kt, v = f32((1, 1, 1, 2)), np.array([[[[1.0, 3.0]]]], np.float32), f32((1, 1, 2, 2), 1), f32((1, 1, 2, 1), 2)
    return (lambda: _attention(run("Mul", q, c), kt, v)), (lambda: _attention(q, run("Mul", kt, c), v))


@counterexample("adv-attention-feature-scale-transposed-widening")
def _attention_feature_scale_widening() -> tuple[Side, Side]:
    # c (two features) widens Q's head dim of 1: the right-hand side contracts Q's 1 with KT's 2
    q, c, kt, v = f32((1, 1, 1, 1)), np.array([[[[1.0, 3.0]]]], np.float32), f32((1, 1, 2, 2), 1), f32((1, 1, 2, 1), 2)
    ct = run("Transpose", c, perm=[0, 1, 3, 2])
    return (lambda: _attention(run("Mul", q, c), kt, v)), (lambda: _attention(q, run("Mul", kt, ct), v))


# ------------------------------------------------------------------------ nonzero-values (a divisor)
@counterexample("adv-nz-div-twice")
def _nz_div_twice() -> tuple[Side, Side]:
    a, x = np.array(-1.0, np.float32), np.array(0.5, np.float32)
    return (lambda: run("Div", run("Div", a, x), x)), (lambda: a)


@counterexample("adv-nz-div-mul-cancel-broadcast")
def _nz_div_mul_broadcast() -> tuple[Side, Side]:
    a, x = np.array(2.0, np.float32), np.array([3.0], np.float32)
    return (lambda: run("Div", run("Mul", a, x), x)), (lambda: a)


@counterexample("adv-nz-div-vector-through-matmul")
def _nz_div_vector() -> tuple[Side, Side]:
    q, c, kt = np.array([[1.0, 2.0]], np.float32), np.array([1.0, 2.0], np.float32), np.ones((2, 1), np.float32)
    return (lambda: run("MatMul", run("Div", q, c), kt)), (lambda: run("Div", run("MatMul", q, kt), c))


@counterexample("adv-nz-int-div-through-matmul")
def _nz_int_div() -> tuple[Side, Side]:
    q, c, kt = np.array([[3]], np.int64), np.array(2, np.int64), np.array([[2]], np.int64)
    return (lambda: run("MatMul", run("Div", q, c), kt)), (lambda: run("Div", run("MatMul", q, kt), c))


@counterexample("adv-div-over-sub-no-nonzero")
def _div_over_sub() -> tuple[Side, Side]:
    a, b, x = np.array([2.0], np.float32), np.array([1.0], np.float32), np.array([0.0], np.float32)
    return (lambda: run("Div", run("Sub", a, b), x)), (lambda: run("Sub", run("Div", a, x), run("Div", b, x)))


# ------------------------------------------------------- rank guards spelled many ways (case pruning)
def _transpose_keep0_twice() -> tuple[Side, Side]:
    a, p = f32((1, 2, 1, 1)), [0, 2, 3, 1]
    return (lambda: run("Transpose", run("Transpose", a, perm=p), perm=p)), (lambda: a)


for _name in ("rank-var", "rank-arith", "rank-ne"):
    counterexample(f"adv-rank4-transpose-keep0-twice-{_name}")(_transpose_keep0_twice)


@counterexample("adv-rank4-add-transpose-equal-ranks")
def _add_transpose_equal_ranks() -> tuple[Side, Side]:
    a, b, p = f32((1, 1, 2, 1)), f32((1, 1, 1, 2), 1), [0, 3, 1, 2]
    return (lambda: run("Add", run("Transpose", a, perm=p), b)), (
        lambda: run("Transpose", run("Add", a, run("Transpose", b, perm=p)), perm=p)
    )


@counterexample("adv-rank-matmul-batch-split-rank-of-output")
def _matmul_batch_rank_of_output() -> tuple[Side, Side]:
    a, b = f32((2, 1, 1)), f32((2, 2, 1, 1), 1)
    return (lambda: run("MatMul", a, b)), (
        lambda: gather([run("MatMul", pa, pb) for pa, pb in zip(chunks(a, 0, 2), chunks(b, 0, 2), strict=True)], 0)
    )


# ------------------------------------------------ third adversary: attribute, shape-form and dtype gaps
@counterexample("adv-rank4-2axis-add-same-dim-combine-order")
def _add_2axis_same_dim() -> tuple[Side, Side]:
    """x, y [1, 4, 1, 1] cut along 1 on a1 then on a2 (2 x 2): device (i, j) holds block 2 i + j of each. The
    right-hand side gathers on a1 first (blocks (0, j), (1, j) of column j), then on a2."""
    x, y = f32((1, 4, 1, 1)), f32((1, 4, 1, 1), 1)
    block = lambda t, i, j: chunks(chunks(t, 1, 2)[i], 1, 2)[j]  # noqa: E731
    piece = {(i, j): run("Add", block(x, i, j), block(y, i, j)) for i in range(2) for j in range(2)}
    rhs = lambda: gather([gather([piece[i, j] for i in range(2)], 1) for j in range(2)], 1)  # noqa: E731
    return (lambda: run("Add", x, y)), rhs


@counterexample("adv-maxpool-patchify-split-h-torch-pads-order")
def _maxpool_patchify_pads() -> tuple[Side, Side]:
    a = np.array([0.0, 3.0, 1.0, 2.0], np.float32).reshape(1, 1, 4, 1)  # x1 > x2: the window [x1 x2] reads x1
    pool = lambda t: run("MaxPool", t, kernel_shape=[2, 1], strides=[2, 1], pads=[1, 0, 0, 0])  # noqa: E731
    return (lambda: pool(a)), (lambda: gather([pool(p) for p in chunks(a, 2, 2)], 2))


@counterexample("adv-avgpool-patchify-count-include-pad-padded")
def _avgpool_patchify_cip() -> tuple[Side, Side]:
    a = f32((1, 1, 2, 1))
    pool = lambda cip: run(  # noqa: E731
        "AveragePool", a, kernel_shape=[2, 1], strides=[2, 1], pads=[1, 0, 1, 0], count_include_pad=cip
    )
    return (lambda: pool(1)), (lambda: pool(0))


@counterexample("adv-conv-kernel1-split-h-pads-wrong-index")
def _conv_kernel1_pads() -> tuple[Side, Side]:
    a, w = f32((1, 1, 2, 1)), f32((1, 1, 1, 1), 1)
    conv = lambda t: run("Conv", t, w, kernel_shape=[1, 1], pads=[0, 0, 1, 0])  # noqa: E731
    return (lambda: conv(a)), (lambda: gather([conv(p) for p in chunks(a, 2, 2)], 2))


@counterexample("adv-int-div-add-multiple")
def _int_div_add_multiple() -> tuple[Side, Side]:
    a, b, c = np.array([-1], np.int64), np.array([2], np.int64), np.array([1], np.int64)
    return (lambda: run("Div", run("Add", a, run("Mul", b, c)), b)), (lambda: run("Add", run("Div", a, b), c))


@counterexample("adv-keepdims0-as-squeeze-of-keepdims1")
def _keepdims0_squeeze() -> tuple[Side, Side]:
    x, axes = f32((1, 2)), np.zeros((0,), np.int64)
    reduce = lambda k: run("ReduceSum", x, axes, keepdims=k, noop_with_empty_axes=1)  # noqa: E731
    return (lambda: reduce(0)), (lambda: run("Squeeze", reduce(1), axes))


@counterexample("adv-reshape-to-expand-target-shorter")
def _reshape_expand_target() -> tuple[Side, Side]:
    x, s = f32((1, 2)), i64(2)
    return (lambda: run("Reshape", run("Expand", x, s), s)), (lambda: run("Expand", x, s))


@counterexample("adv-keepdims1-as-unsqueeze-of-keepdims0")
def _keepdims1_unsqueeze() -> tuple[Side, Side]:
    x, axes = f32((2, 2)), np.zeros((0,), np.int64)
    reduce = lambda k: run("ReduceSum", x, axes, keepdims=k, noop_with_empty_axes=0)  # noqa: E731
    return (lambda: reduce(1)), (lambda: run("Unsqueeze", reduce(0), axes))


@counterexample("adv-rank3-split-last-part-as-negative-slice")
def _split_last_part_negative_slice() -> tuple[Side, Side]:
    x = f32((1, 1, 2))
    return (lambda: run("Split", x, i64(2, 0), axis=2, outputs=2, index=1)), (
        lambda: run("Slice", x, i64(-0), i64(2**63 - 1), i64(2), i64(1))
    )


@counterexample("adv-slice2-normalize-negative-start-unclamped")
def _slice2_negative_start() -> tuple[Side, Side]:
    x, en, axes = f32((2, 2)), i64(2, 2), i64(0, 1)
    return (lambda: run("Slice", x, i64(-3, 0), en, axes)), (lambda: run("Slice", x, i64(-3 + 2, 0), en, axes))


@counterexample("adv-gemm-split-cols-rank1-bias-broadcast")
def _gemm_rank1_bias() -> tuple[Side, Side]:
    a, b, c = f32((1, 1)), f32((1, 2), 1), f32((1,), 2)  # c [1]: one bias for both columns
    pieces = lambda: zip(chunks(b, 1, 2), chunks(c, 0, 2), strict=True)  # noqa: E731
    return (lambda: run("Gemm", a, b, c)), (lambda: gather([run("Gemm", a, bp, cp) for bp, cp in pieces()], 1))


@counterexample("adv-gather-from-prefix-slice-negative-index")
def _gather_prefix_slice() -> tuple[Side, Side]:
    x, i = f32((3,)), i64(-1)
    return (lambda: run("Gather", run("Slice", x, i64(0), i64(2), i64(0)), i, axis=0)), (
        lambda: run("Gather", x, i, axis=0)
    )


@counterexample("adv-maxpool-patchify-ceil-mode-padded")
def _maxpool_patchify_ceil_mode() -> tuple[Side, Side]:
    a = f32((1, 1, 2, 2))
    pool = lambda cm: run(  # noqa: E731
        "MaxPool", a, kernel_shape=[2, 2], strides=[2, 2], pads=[1, 0, 0, 0], ceil_mode=cm
    )
    return (lambda: pool(1)), (lambda: pool(0))


@counterexample("adv-analysis-slice-shape-empty")
def _an_slice_shape_empty() -> tuple[Side, Side]:
    # start 1, end 0, step 1 on x [2]: ceil((0 - 1) / 1) = -1 elements by the derived formula
    x = f32((2,))
    return (lambda: shape_of(run("Slice", x, i64(1), i64(0), i64(0)))), (lambda: i64((0 - 1 + (1 - 1)) // 1))


@counterexample("adv-maxpool-patchify-ceil-mode-dilated")
def _maxpool_patchify_ceil_mode_dilated() -> tuple[Side, Side]:
    a = f32((1, 1, 4, 1))
    pool = lambda cm: run(  # noqa: E731
        "MaxPool", a, kernel_shape=[2, 1], strides=[2, 1], dilations=[2, 1], ceil_mode=cm
    )
    return (lambda: pool(1)), (lambda: pool(0))


@counterexample("adv-clip-fuse-tensor-bounds")
def _clip_fuse_tensor_bounds() -> tuple[Side, Side]:
    x, lo, hi = f32((2,)), np.array([0.0, 0.1], np.float32), scalar(1.0)
    return (lambda: run("Min", run("Max", x, lo), hi)), (lambda: run("Clip", x, lo, hi))


@counterexample("adv-maxpool-explicit-pads-as-same-upper-dilated")
def _maxpool_same_upper_dilated() -> tuple[Side, Side]:
    a = f32((1, 1, 6))
    return (lambda: run("MaxPool", a, kernel_shape=[3], dilations=[2], pads=[2, 2])), (
        lambda: run("MaxPool", a, kernel_shape=[3], dilations=[2], auto_pad="SAME_UPPER")
    )


@counterexample("adv-analysis-expand-shape-is-target")
def _an_expand_shape() -> tuple[Side, Side]:
    x, s = f32((2, 3)), i64(3)
    return (lambda: shape_of(run("Expand", x, s))), (lambda: s)


# ----------------------------------------------------------------------------------------------------------
# The fourth adversary (same rules of engagement): default attribute forms (Slice and Squeeze with no axes),
# an axiom group leaking into integer proofs, dims beyond the constants, rank-4 odd dims, a step function
# under float rounding, four-part Splits, three new Expand dims, rank-3 Gather indices, a KV cache under a
# causal mask, unsigned wraparound and float16 overflow.

BIG = np.iinfo(np.int64).max


def _attention_plain(q, kt, v):
    """Attention(q, kt, v, none, none, 1, 0): MatMul(Softmax(MatMul(q, kt), -1), v)."""
    return run("MatMul", run("Softmax", run("MatMul", q, kt), axis=-1), v)


# ------------------------------------------------------------------------------------------- Slice axes
@counterexample("adv4-slice-split-one-axis-default-axes")
def _slice_default_axes() -> tuple[Side, Side]:
    # axes left out (the IVec is empty): ONNX slices dims 0 .. len(starts) - 1, here dim 0, the split dim
    a = f32((4,))

    def sl(x):
        return run("Slice", x, i64(1), i64(3))

    return (lambda: sl(a)), (lambda: gather([sl(p) for p in chunks(a, 0, 2)], 0))


# ---------------------------------------------------------------------------------- integer Div, MatMul
@counterexample("adv4-int-div-through-matmul-attention-guard")
def _int_div_matmul() -> tuple[Side, Side]:
    # the guard holds: attention over (q, kt, kt^T) has q's shape [1, 1]
    q, kt, c = np.array([[3]], np.int64), np.array([[2]], np.int64), np.array(2, np.int64)
    return (lambda: run("MatMul", run("Div", q, c), kt)), (lambda: run("Div", run("MatMul", q, kt), c))


# ------------------------------------------------------------------------------ Reshape, dims past 4
@counterexample("adv4-reshape-pairs-split-at-least-one-pair-each")
def _reshape_pairs() -> tuple[Side, Side]:
    # x [6], mesh 2: 6 is even and >= 2 * 2, but each device's 3 elements are no whole number of pairs
    x = f32((6,))
    return (lambda: run("Reshape", x, i64(-1, 2))), (
        lambda: gather([run("Reshape", p, i64(-1, 2)) for p in chunks(x, 0, 2)], 0)
    )


# ------------------------------------------------------------------------------- rank 4, odd dims
@counterexample("adv4-rank4-sum-as-two-halves")
def _sum_halves() -> tuple[Side, Side]:
    # x [1, 1, 1, 3] (RGB last): h = 1, the halves [0:1] and [1:2] leave x[..., 2] out
    x = f32((1, 1, 1, 3))

    def s(t):
        return run("ReduceSum", t, i64(3), keepdims=1)

    return (lambda: s(x)), (
        lambda: run(
            "Add",
            s(run("Slice", x, i64(0), i64(1), i64(3), i64(1))),
            s(run("Slice", x, i64(1), i64(2), i64(3), i64(1))),
        )
    )


# ---------------------------------------------------------------------------------- unsigned Sub
@counterexample("adv4-uint-sub-compare-antisymmetric")
def _uint_sub() -> tuple[Side, Side]:
    a, b = np.array([2], np.uint8), np.array([1], np.uint8)  # 2 - 1 = 1, 1 - 2 = 255
    return (lambda: run("Greater", run("Sub", a, b), run("Sub", b, a))), (lambda: run("Greater", a, b))


# ------------------------------------------------------------------- rank-4 Where on a 2 x 2 mesh
@counterexample("adv4-rank4-2axis-where-same-dim-combine-order")
def _where_2axis() -> tuple[Side, Side]:
    # mesh a1 = 2 x a2 = 2, d = 1: device (i, j) holds block 2 i + j of each operand (Partition on a1, then a2)
    c = np.array([True, False, True, False]).reshape(1, 4, 1, 1)
    x, y = f32((1, 4, 1, 1)), f32((1, 4, 1, 1), 1)
    blocks = {(i, j): [t[:, 2 * i + j : 2 * i + j + 1] for t in (c, x, y)] for i in range(2) for j in range(2)}
    out = {k: run("Where", *v) for k, v in blocks.items()}
    # Combine on a1 first (over i, for each j), then on a2 (over j)
    by_j = [gather([out[(i, j)] for i in range(2)], 1) for j in range(2)]
    return (lambda: run("Where", c, x, y)), (lambda: gather(by_j, 1))


# --------------------------------------------------------------------- grouped Conv, input channels
@counterexample("adv4-conv-grouped-input-channel-split")
def _conv_grouped_k() -> tuple[Side, Side]:
    a, w = f32((1, 4, 1, 1)), f32((2, 2, 1, 1), 1)
    pieces = zip(chunks(a, 1, 2), chunks(w, 1, 2), strict=True)
    return (lambda: run("Conv", a, w, group=2)), (lambda: sum(run("Conv", ap, wp, group=2) for ap, wp in pieces))


# ----------------------------------------------------- float rounding into a step function (not "discrete")
@counterexample("adv4-float-thresholded-relu-cancel-addend")
def _thresholded_relu() -> tuple[Side, Side]:
    # float32: 1e8 + 1000001 rounds to 101000000 (spacing 8), so (a + c) - c = 1000000 <= alpha: the step flips
    a, c, alpha = np.array([1000001.0], np.float32), np.array([1e8], np.float32), 1000000.5
    return (lambda: run("ThresholdedRelu", run("Sub", run("Add", a, c), c), alpha=alpha)), (
        lambda: run("ThresholdedRelu", a, alpha=alpha)
    )


# ----------------------------------------------------------------------- Split into more than 3 parts
@counterexample("adv4-split-concat-first-three-parts")
def _split_four() -> tuple[Side, Side]:
    x, s = f32((4,)), i64(1, 1, 1, 1)
    parts = lambda: [run("Split", x, s, axis=0, outputs=4, index=j) for j in range(3)]  # noqa: E731
    return (lambda: run("Concat", *parts(), axis=0)), (lambda: x)


# ------------------------------------------------------------------------- float16 overflow (inf)
@counterexample("adv4-fp16-doubled-compare-overflow")
def _fp16_double() -> tuple[Side, Side]:
    a, b = np.array([40000], np.float16), np.array([50000], np.float16)  # 2 a and 2 b overflow to inf
    return (lambda: run("Less", run("Add", a, a), run("Add", b, b))), (lambda: run("Less", a, b))


# ------------------------------------------------------------------ causal attention, 3 keys (KV cache)
def _attention_causal(q, kt, v, causal):
    scores = run("MatMul", q, kt)
    if causal:
        sq, skv = scores.shape[-2:]
        mask = np.where(np.tril(np.ones((sq, skv), bool)), 0.0, -np.inf).astype(np.float32)
        scores = run("Add", scores, mask)
    return run("MatMul", run("Softmax", scores, axis=-1), v)


def _causal_rows_after_the_first(queries: int) -> tuple[Side, Side]:
    """The queries after the first of a causal Attention over 3 keys, taken as if unmasked: query 1 sees keys 0
    and 1 of 3, not key 2 (q [1, 1, queries, 1], kt [1, 1, 1, 3], v [1, 1, 3, 1])."""
    q, kt, v = f32((1, 1, queries, 1)), f32((1, 1, 1, 3), 1), f32((1, 1, 3, 1), 2)
    sz = i64(1, queries - 1)
    return (lambda: run("Split", _attention_causal(q, kt, v, 1), sz, axis=2, outputs=2, index=1)), (
        lambda: _attention_causal(run("Split", q, sz, axis=2, outputs=2, index=1), kt, v, 0)
    )


@counterexample("adv4-attention-causal-second-query-unmasked")
def _causal_second_query() -> tuple[Side, Side]:
    return _causal_rows_after_the_first(2)


# ---------------------------------------------------------------- Expand adding three leading dims
@counterexample("adv4-expand-split-two-new-leading-dims")
def _expand_three_new() -> tuple[Side, Side]:
    # x [4], s = (1, 1, 4, 4), mesh 2: the core's output is S(2) with local shape (1, 1, 2, 4) (lowering's
    # local target); each device's x piece [2] does not broadcast to it
    x = f32((4,))
    return (lambda: run("Expand", x, i64(1, 1, 4, 4))), (
        lambda: gather([run("Expand", p, i64(1, 1, 2, 4)) for p in chunks(x, 0, 2)], 2)
    )


# ------------------------------------------------------------------------- Gather, indices of rank 3
@counterexample("adv4-gather-split-last-index-dim-rank3")
def _gather_rank3_indices() -> tuple[Side, Side]:
    a, i = f32((4, 1)), np.array([[[0, 3]]], np.int64)  # output [1, 1, 2, 1]: the index dim 2 is output dim 2
    return (lambda: run("Gather", a, i, axis=0)), (
        lambda: gather([run("Gather", a, p, axis=0) for p in chunks(i, 2, 2)], 1)
    )


# --------------------------------------------------------- dtype guard spelled as an exclusion (refuted)
@counterexample("adv4-div-distribute-excluding-int64")
def _div_int32() -> tuple[Side, Side]:
    a = b = np.array([1], np.int32)
    c = np.array([2], np.int32)
    return (lambda: run("Div", run("Add", a, b), c)), (lambda: run("Add", run("Div", a, c), run("Div", b, c)))


# ------------------------------------------------------- Squeeze with no axes (squeeze every size-1 dim)
@counterexample("adv4-squeeze-split-rank2-default-axes")
def _squeeze_all_split() -> tuple[Side, Side]:
    # a [2, 3] has no size-1 dim (Squeeze is the identity); each device's chunk [1, 3] squeezes to [3]
    a = f32((2, 3))
    return (lambda: run("Squeeze", a)), (lambda: gather([run("Squeeze", p) for p in chunks(a, 0, 2)], 0))


# ----------------------------------------------------------------------------------------------------------
# The fifth adversary: guards admitting rank >= 3 only (negative axes, Reshape targets with 0), a literal Slice
# end, signed zeros, a Gather index range widened by Expand, an odd dim at rank 3.


# ---------------------------------------------------------------------- rank 3, axes spelled negative
@counterexample("adv5-rank3-reducemax-split-batch-negative-axes")
def _reducemax_rank3_negative_axes() -> tuple[Side, Side]:
    # axes (-3) is dim 0 at rank 3, the split dim: each device keeps the max of its own batch row
    a, axes = f32((2, 2, 2)), i64(-3)
    return (lambda: run("ReduceMax", a, axes, keepdims=1)), (
        lambda: gather([run("ReduceMax", p, axes, keepdims=1) for p in chunks(a, 0, 2)], 0)
    )


@counterexample("adv5-rank3-slice-split-negative-axis")
def _slice_rank3_negative_axis() -> tuple[Side, Side]:
    # axes (-3) is dim 0 at rank 3, the split dim: the pieces cut [1:3] of each half
    x, st, en, ax, sp = f32((4, 1, 1)), i64(1), i64(3), i64(-3), i64(1)
    return (lambda: run("Slice", x, st, en, ax, sp)), (
        lambda: gather([run("Slice", p, st, en, ax, sp) for p in chunks(x, 0, 2)], 0)
    )


# ---------------------------------------------------------------------- rank 3, Reshape targets with 0
@counterexample("adv5-rank3-reshape-reshape-zero-copies")
def _reshape_reshape_rank3() -> tuple[Side, Side]:
    x = f32((2, 3, 4))
    return (lambda: run("Reshape", run("Reshape", x, i64(4, 3, 2)), i64(0, -1))), (
        lambda: run("Reshape", x, i64(0, -1))
    )


@counterexample("adv5-rank3-reshape-allowzero-flip")
def _allowzero_rank3() -> tuple[Side, Side]:
    x = f32((2, 3, 4))
    return (lambda: run("Reshape", x, i64(0, 12), allowzero=0)), (lambda: run("Reshape", x, i64(0, 12), allowzero=1))


# ------------------------------------------------------------------------------------ signed zeros
@counterexample("adv5-signed-zero-neg-sub")
def _signed_zero_neg_sub() -> tuple[Side, Side]:
    # -(a - b) is -0 and b - a is +0: equal as numbers (np.allclose too), so each side is read through
    # onnxruntime's Reciprocal, the division that shows the sign of a zero (-inf against +inf)
    a = b = np.array([1.5], np.float32)
    return (lambda: run("Reciprocal", run("Neg", run("Sub", a, b)))), (lambda: run("Reciprocal", run("Sub", b, a)))


@counterexample("adv5-signed-zero-neg-sub-through-div")
def _signed_zero_through_div() -> tuple[Side, Side]:
    a = b = np.array([1.5], np.float32)
    c = np.array([1.0], np.float32)
    return (lambda: run("Tanh", run("Div", c, run("Neg", run("Sub", a, b))))), (
        lambda: run("Tanh", run("Div", c, run("Sub", b, a)))
    )


# ----------------------------------------------------------------------------- Slice, a literal end
@counterexample("adv5-slice-literal-end6-identity")
def _slice_end6() -> tuple[Side, Side]:
    x = f32((8,))
    return (lambda: run("Slice", x, i64(0), i64(6), i64(0), i64(1))), (lambda: x)


# --------------------------------------------------------------------------- Gather through an Expand
@counterexample("adv5-gather-through-expand-out-of-range")
def _gather_through_expand() -> tuple[Side, Side]:
    # index 2 is a row of the expanded [4, 3]; y has one row, and onnxruntime refuses the index there
    y, s, i = f32((1, 3)), i64(4, 3), i64(2)
    return (lambda: run("Gather", run("Expand", y, s), i, axis=0)), (lambda: run("Gather", y, i, axis=0))


# --------------------------------------------------------------------------- rank 3, an odd last dim
@counterexample("adv5-rank3-add-sum-as-two-halves")
def _sum_halves_rank3() -> tuple[Side, Side]:
    # a, b [1, 1, 3]: h = 1, the halves [0:1] and [1:2] leave element 2 out
    a, b = f32((1, 1, 3)), f32((1, 1, 3), 1)

    def s(t):
        return run("ReduceSum", t, i64(2), keepdims=1)

    return (lambda: s(run("Add", a, b))), (
        lambda: run(
            "Add",
            s(run("Slice", run("Add", a, b), i64(0), i64(1), i64(2), i64(1))),
            s(run("Slice", run("Add", a, b), i64(1), i64(2), i64(2), i64(1))),
        )
    )


# ----------------------------------------------------------------------------------------------------------
# The sixth adversary: empty tensors (a dim of 0), float32 rounding the stressed pool does not hit (a comparison,
# a negative base under Pow), sizes the instances lack (three-operand Concat, a rank 2 -> 3 Reshape, an odd
# rank-4 head dim, three causal queries), a broadcast operand under a dim cut on both axes of a 2-D mesh, a
# Concat list's element rank, one dim named twice in axes.


# ------------------------------------------------------------------------------ empty tensors (a dim of 0)
@counterexample("adv6-empty-reducesum-singleton-le1")
def _empty_reducesum() -> tuple[Side, Side]:
    # x [0, 3] (an empty KV cache): the sum over dim 0 is [1, 3] of zeros
    x = np.zeros((0, 3), np.float32)
    return (lambda: run("ReduceSum", x, i64(0), keepdims=1)), (lambda: x)


@counterexample("adv6-empty-matmul-k-le1-as-outer")
def _empty_matmul() -> tuple[Side, Side]:
    # K = 0: MatMul gives zeros [2, 3]; Mul of [2, 0] and [0, 3] does not broadcast, onnxruntime refuses it
    a, b = np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32)
    return (lambda: run("MatMul", a, b)), (lambda: run("Mul", a, b))


# ------------------------------------------------------------------ float32 rounding into a comparison
@counterexample("adv6-f32-equal-cancel-nonzero-factor")
def _f32_equal_factor() -> tuple[Side, Side]:
    # a = 2 - 2^-23, b = 2 - 2^-22 (neighbouring floats), c = 1 + 2^-23: both products round to 2
    a, b, c = (np.array([v], np.float32) for v in (2 - 2**-23, 2 - 2**-22, 1 + 2**-23))
    return (lambda: run("Equal", run("Mul", a, c), run("Mul", b, c))), (lambda: run("Equal", a, b))


@counterexample("adv6-f32-equal-cancel-nonzero-divisor")
def _f32_equal_divisor() -> tuple[Side, Side]:
    # neighbouring floats a, b (exact float32 values): a / c and b / c both round to 1.5877151
    a, b, c = (np.array([v], np.float32) for v in (1.9315895, 1.9315896, 1.2165844))
    return (lambda: run("Equal", run("Div", a, c), run("Div", b, c))), (lambda: run("Equal", a, b))


# ------------------------------------------------------------------ float32 rounding into Pow's exponent
@counterexample("adv6-f32-pow-exponent-cancel-addend")
def _f32_pow_exponent() -> tuple[Side, Side]:
    # (2 + 0.1) - 0.1 is 1.9999999 in float32, and (-2) ** 1.9999999 is NaN where (-2) ** 2 = 4
    a, b, c = (np.array([v], np.float32) for v in (-2.0, 2.0, 0.1))
    return (lambda: run("Pow", a, run("Sub", run("Add", b, c), c))), (lambda: run("Pow", a, b))


# ------------------------------------------------------------------ three-operand Concat, sizes above 2
@counterexample("adv6-concat3-rank3-middle-third")
def _concat3_middle_third() -> tuple[Side, Side]:
    # a, c [1, 1, 1], b [1, 1, 4], k = 2: the Concat is 6 long, and its middle third (2, 2, 2) is [b1, b2]
    a, b, c = f32((1, 1, 1)), f32((1, 1, 4), 1), f32((1, 1, 1), 2)
    return (lambda: run("Split", run("Concat", a, b, c, axis=2), i64(2, 2, 2), axis=2, outputs=3, index=1)), (lambda: b)


# ------------------------------------------------------- a dim cut on both axes, a broadcast operand
@counterexample("adv6-2axis-residual-sum-split-both-operands")
def _residual_sum_2axis() -> tuple[Side, Side]:
    # mesh dp = 2 x tp = 2, d = 1, axes (2): y [1, 4, 1, 1] is broadcast along dim 2 of x [1, 4, 2, 1], so the
    # left-hand side adds it twice per row and the right-hand side's own sum of y once
    x, y, axes = f32((1, 4, 2, 1)), f32((1, 4, 1, 1), 1), i64(2)

    def side(t):
        # device (i, j) holds chunk j (on tp) of chunk i (on dp); Combine on tp, then on dp
        blocks = [[run("ReduceSum", q, axes, keepdims=1) for q in chunks(p, 1, 2)] for p in chunks(t, 1, 2)]
        return gather([gather(row, 1) for row in blocks], 1)

    return (lambda: run("ReduceSum", run("Add", x, y), axes, keepdims=1)), (lambda: run("Add", side(x), side(y)))


# ------------------------------------------------------------------ RoPE pairs: rank 2 -> 3 Reshape
@counterexample("adv6-rope-pairs-reshape-split-features")
def _rope_pairs_split() -> tuple[Side, Side]:
    # x [1, 6], mesh 2: 6 is even and >= 2 * 2, but each device's [1, 3] holds 1.5 pairs
    x, t = f32((1, 6)), i64(1, -1, 2)
    return (lambda: run("Reshape", x, t)), (lambda: gather([run("Reshape", p, t) for p in chunks(x, 1, 2)], 1))


# ------------------------------------------------------------------ rank-4 MatMul, an odd head dim
@counterexample("adv6-rank4-scores-matmul-head-dim-halves")
def _matmul_head_dim_halves() -> tuple[Side, Side]:
    # head dim 3: h = 1, and a Split (1, 1) of a dim of 3 is refused (read as the first 2 h columns, it would
    # leave the third term out)
    a, b, s = f32((1, 1, 1, 3)), f32((1, 1, 3, 1), 1), i64(1, 1)

    def half(k):
        return run(
            "MatMul", run("Split", a, s, axis=3, outputs=2, index=k), run("Split", b, s, axis=2, outputs=2, index=k)
        )

    return (lambda: run("MatMul", a, b)), (lambda: run("Add", half(0), half(1)))


# ------------------------------------------------------------------ causal attention, three queries
@counterexample("adv6-attention-causal-rows-after-first-unmasked")
def _causal_rows_after_first() -> tuple[Side, Side]:
    return _causal_rows_after_the_first(3)  # s_kv 3 <= s_q 3, split (1, 2)


# ----------------------------------------------------------------- a Concat list's element rank
@counterexample("adv6-tlist-rank5-concat-axis3-is-last")
def _concat_rank5_axis3() -> tuple[Side, Side]:
    # two [1, 1, 1, 1, 2]: axis 3 is not the last at rank 5 ([1, 1, 1, 2, 2] against [1, 1, 1, 1, 4])
    a, b = f32((1, 1, 1, 1, 2)), f32((1, 1, 1, 1, 2), 1)
    return (lambda: run("Concat", a, b, axis=3)), (lambda: run("Concat", a, b, axis=-1))


# ------------------------------------------------------------------ one dim named twice in axes
@counterexample("adv6-dupaxes-unsqueeze-squeeze-roundtrip")
def _dupaxes_roundtrip() -> tuple[Side, Side]:
    # x [2, 3, 1], axes (2, -1): Squeeze removes dim 2 once, Unsqueeze inserts two dims ([2, 3, 1, 1])
    x, axes = f32((2, 3, 1)), i64(2, -1)
    return (lambda: run("Unsqueeze", run("Squeeze", x, axes), axes)), (lambda: x)


@counterexample("adv6-dupaxes-keepdims1-as-unsqueeze-of-keepdims0")
def _dupaxes_keepdims() -> tuple[Side, Side]:
    # x [2, 3], axes (1, -1): the sum keeps [2, 1]; Unsqueeze of the [2] by two axes gives [2, 1, 1]
    x, axes = f32((2, 3)), i64(1, -1)
    return (lambda: run("ReduceSum", x, axes, keepdims=1)), (
        lambda: run("Unsqueeze", run("ReduceSum", x, axes, keepdims=0), axes)
    )


@counterexample("adv6-dupaxes-reducesum-split-keepdims0")
def _dupaxes_reduce_split() -> tuple[Side, Side]:
    # x [2, 2, 4], axes (0, -3) (dim 0 twice), d = 2, mesh 2: reduce-map counted two removed dims and Combines
    # along 0, where onnxruntime removes dim 0 once and dim 2 lands on output dim 1 ([2, 4] against [4, 2])
    x, axes = f32((2, 2, 4)), i64(0, -3)
    return (lambda: run("ReduceSum", x, axes, keepdims=0)), (
        lambda: gather([run("ReduceSum", p, axes, keepdims=0) for p in chunks(x, 2, 2)], 0)
    )

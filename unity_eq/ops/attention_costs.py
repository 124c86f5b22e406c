"""What the Attention term costs (unity_eq/ops/attention.py): a flash kernel's arithmetic and what it keeps for
the backward pass, and, where lowering writes the composition instead (a bfloat16 plan: onnxruntime has no such
kernel), the composition's memory traffic, which an inference plan's device program pays."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from unity_eq.ops.family import Work

__all__ = [
    "FUSED_LOWERING_DTYPES",
    "attention_flops",
    "attention_saved_bytes",
    "backward_work",
    "flops",
    "fused_lowering_fits",
    "lowered_work",
]


def attention_flops(q: Sequence[int], kt: Sequence[int], out: Sequence[int]) -> float:
    """A flash kernel's arithmetic: the two products (2·s_q·s_kv·d and 2·s_q·s_kv·d_v per batch and head) and
    the softmax (about 5 operations per score: scale/mask, max, exp, sum, divide), nothing else: the scores
    are never written to memory, which the roofline's byte term sees (inputs and output only)."""
    d, s_kv = kt[-2], kt[-1]
    batch_heads = math.prod(out[:-2])
    s_q, d_v = out[-2], out[-1]
    return float(batch_heads * s_q * s_kv * (2 * d + 2 * d_v + 5))


def flops(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> float:
    """:func:`attention_flops` on local shapes."""
    q, kt = in_shapes[0], in_shapes[1]
    if q is None or kt is None:
        return 0.0
    return attention_flops(q, kt, out_shape)


#: The dtypes whose Attention lowering writes ONNX's fused op (``_fused_lowering_fits``): onnxruntime has no
#: bfloat16 Attention kernel on the CPU (measured: NOT_IMPLEMENTED), so a bfloat16 one is written as its composition.
FUSED_LOWERING_DTYPES = ("float32", "float16")


def lowered_work(
    op: str,
    in_shapes: Sequence[Sequence[int] | None],
    out_shape: Sequence[int],
    dtype: str,
    attrs: Mapping[str, Any],
) -> Work | None:
    """The device program's forward where lowering writes the composition (:func:`fused_lowering_fits` says
    where it does not): the scores' MatMul writes the ``s_q × s_kv`` scores, the scale's Mul (``scale`` not 1)
    reads and writes them, the mask's Add (when there is a mask) and the causal Add (``causal``: a constant
    ``s_q × s_kv`` bias) read and write them, Softmax reads them and writes the probabilities, the fill's IsNaN
    and Where (when there is a fill) read and write them, and the last MatMul reads them; None where the fused
    op is written (its flash price, the default). Streaming kernels: priced at the ``memory`` class's
    efficiency, not the fused kernel's."""
    q, kt = in_shapes[0], in_shapes[1]
    if q is None or kt is None:
        return None
    v, mask, fill = (in_shapes[i] if len(in_shapes) > i else None for i in (2, 3, 4))
    if fused_lowering_fits(dtype, q, kt, v, mask is not None):
        return None
    scores = float(math.prod((*out_shape[:-1], kt[-1])))
    size = [float(math.prod(s)) if s is not None else 0.0 for s in (q, kt, v, mask)]
    read = size[0] + size[1] + scores + scores + size[2]  # the two MatMuls and Softmax
    written = scores + scores + float(math.prod(out_shape))
    kernels = 3.0
    if float(attrs.get("scale", 1.0)) != 1.0:
        read, written, kernels = read + scores, written + scores, kernels + 1
    if mask is not None:
        read, written, kernels = read + scores + size[3], written + scores, kernels + 1
    if int(attrs.get("causal", 0)):
        read, written, kernels = read + scores + float(out_shape[-2] * kt[-1]), written + scores, kernels + 1
    if fill is not None:
        read, written, kernels = read + 2 * scores, written + 2 * scores, kernels + 2
    return Work(attention_flops(q, kt, out_shape), read, written, kernels, compute_class="memory")


def fused_lowering_fits(dtype: str, q: Sequence[int], kt: Sequence[int], v: Sequence[int] | None, masked: bool) -> bool:
    """Where lowering writes ONNX's fused ``Attention`` (onnxruntime's kernel, opset 23) for local shapes: a
    dtype of :data:`FUSED_LOWERING_DTYPES`, (b, h, s, d) operands whose batch agrees and whose query heads are
    a multiple of the key/value heads (grouped-query attention), and no mask (attention.py's
    ``_fused_lowering_fits`` asks this of the device graph it writes)."""
    if dtype not in FUSED_LOWERING_DTYPES or masked or v is None or not len(q) == len(kt) == len(v) == 4:
        return False
    return q[0] == kt[0] == v[0] and kt[1] == v[1] and q[1] % kt[1] == 0


def backward_work(op: str, in_shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]) -> Work | None:
    """A flash kernel's backward pass (what PyTorch's ``scaled_dot_product_attention`` runs): it recomputes the
    scores block by block (``2·d`` per score), forms dV (``2·d_v``), dP (``2·d_v``), dS (about 5 per score),
    dQ and dK (``2·d`` each), so about 2.5 times the forward's arithmetic, never writing an ``s_q × s_kv``
    tensor; it reads Q, Kᵀ, V, the output, its gradient and a mask, writes dQ, dK and dV, in about three
    kernels (the ``rowsum(dO·O)`` pre-pass, the main one, dQ's conversion). A fill changes nothing here: the
    torch backend runs the kernel and fills a fully masked row apart (``attention._kernel_mask``)."""
    q, kt, v = (in_shapes[i] if len(in_shapes) > i else None for i in range(3))
    if q is None or kt is None or v is None:
        return None
    mask = in_shapes[3] if len(in_shapes) > 3 else None
    d, s_kv = kt[-2], kt[-1]
    batch_heads = math.prod(out_shape[:-2])
    s_q, d_v = out_shape[-2], out_shape[-1]
    flops = float(batch_heads * s_q * s_kv * (6 * d + 4 * d_v + 5))
    out = float(math.prod(out_shape))
    operands = float(math.prod(q) + math.prod(kt) + math.prod(v))
    read = operands + 2 * out + (float(math.prod(mask)) if mask is not None else 0.0)
    return Work(flops, read, operands, kernels=3.0)


def attention_saved_bytes(out: Sequence[int]) -> int:
    """The row statistics a flash kernel keeps for its backward pass beside Q, K, V and the output: one float32
    log-sum-exp per (batch, head, query) row: ``b·h·s_q`` floats (PyTorch's ``logsumexp``)."""
    return 4 * math.prod(out[:-1])

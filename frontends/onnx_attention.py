"""ONNX's own ``Attention`` op (opset 23) read into unity-eq's ``Attention`` term (unity_eq/ops/attention.py).

The two share a name and not a signature. ONNX's takes the keys as ``K`` ``(b, h_kv, s_kv, d)``, a default scale
of ``1/sqrt(d)``, ``is_causal``, a boolean or additive mask, grouped-query heads, 3-D inputs with head counts,
a KV cache and a soft cap. The term takes the keys *transposed* (``KT``, as exported graphs hold them before a
MatMul), ``scale`` (default 1), ``causal``, an additive mask and a fill. Read by name, an ONNX ``Attention``
node would be planned as attention over its keys' transpose: a wrong plan, which ``check`` failed on with
onnxruntime's shape error where ``s_kv != d`` and would have failed on values where they are equal.

So the frontend rewrites the node into what the term means: ``Transpose(K, [0, 1, 3, 2])`` then
``Attention(Q, KT, V, mask, scale=<ONNX's scale or 1/sqrt(d)>, causal=is_causal)``, for the forms whose meaning
the term has: 4-D inputs, one key/value head or as many as the queries, an additive float mask, no KV cache,
no soft cap, one output. Any other form is refused with one error naming the node and what to change; it is
never planned as something else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from unity_eq.dtypes import as_dtype
from unity_eq.dtypes import lowest as lowest_value
from unity_eq.errors import ModelError
from unity_eq.frontends.onnx_fold import unique_name
from unity_eq.ir import Node, TensorType

__all__ = ["attention_nodes"]


def _refuse(where: str, name: str, why: str) -> ModelError:
    return ModelError(
        f"{where}: node {name!r}: ONNX Attention {why}; unity-eq plans ONNX's Attention with 4-D Q, K, V, one key/"
        "value head or as many as the query heads, a rank-4 additive mask of Q's type, no KV cache, window or "
        "softcap, and one output. Export the attention unfused (opset 22 or below, or without torch's fused "
        "attention) instead."
    )


#: ONNX Attention's attributes whose every value (or the value given here) the term means: the head counts
#: matter only for 3-D inputs (refused), ``softmax_precision`` only for rounding, ``qk_matmul_output_mode`` only
#: for the extra output (refused); a window or a soft cap changes the values and is refused.
_NEUTRAL = {"q_num_heads", "kv_num_heads", "softmax_precision", "qk_matmul_output_mode", "scale", "is_causal"}
_DEFAULTS = {"softcap": 0.0, "left_window_size": -1, "right_window_size": -1}


def _check_attrs(attrs: Mapping[str, Any], where: str, name: str) -> None:
    for attr, value in sorted(attrs.items()):
        if attr in _NEUTRAL:
            continue
        if attr not in _DEFAULTS:
            raise _refuse(where, name, f"with attribute {attr}={value!r}, which unity-eq does not know")
        if value != _DEFAULTS[attr]:
            raise _refuse(where, name, f"with {attr} {value!r}")


def _check_mask(mask: TensorType, q: TensorType, k: TensorType, where: str, name: str) -> None:
    """The term adds its mask to the (b, h, s_q, s_kv) scores, broadcasting it; ONNX also pads a short last
    dim with -inf (opset 24) and reads a boolean one as "attend": only a float mask of Q's type and rank 4 whose
    dims are each 1 or the scores' means the same in both (a lower rank would meet the sharding rules, written
    for rank 4, with its dims in other places)."""
    scores = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if mask.dtype == "bool":
        raise _refuse(where, name, "with a boolean mask (True = attend; the term adds a float one)")
    if mask.dtype != q.dtype:
        raise _refuse(where, name, f"with a {mask.dtype} mask for {q.dtype} Q (a float mask of Q's type is added)")
    if len(mask.shape) != 4 or any(m not in (1, s) for m, s in zip(mask.shape, scores, strict=True)):
        raise _refuse(
            where,
            name,
            f"with a mask of shape {list(mask.shape)} for scores {list(scores)} (give it rank 4, each dim 1 or the "
            "scores')",
        )


def attention_nodes(
    name: str,
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
    attrs: Mapping[str, Any],
    types: dict[str, TensorType],
    constants: dict[str, np.ndarray],
    where: str,
) -> list[Node]:
    """The IR nodes of ONNX ``Attention`` node ``name``: the keys' Transpose (its output typed in ``types``) and
    the term; with a mask, a zero fill (``constants``): ONNX gives a row whose every key is masked zeros, the
    term without a fill NaN. Refuses (one :class:`ModelError`) a form the term does not mean."""
    present = [i for i in inputs if i]
    if len(inputs) > 4 and any(inputs[4:]):
        raise _refuse(where, name, "with a KV cache (past_key, past_value) or nonpad_kv_seqlen")
    if len([o for o in outputs if o]) > 1 or not outputs or not outputs[0]:
        raise _refuse(where, name, "with outputs beyond Y (present_key, present_value, qk_matmul_output)")
    _check_attrs(attrs, where, name)
    q, k, v = (types[i] for i in present[:3])
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        raise _refuse(where, name, f"with {len(q.shape)}-D inputs (3-D ones carry their head counts as attributes)")
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads not in (1, heads) or v.shape[1] != kv_heads:
        raise _refuse(where, name, f"with {kv_heads} key/value heads for {heads} query heads (grouped-query)")
    if not q.shape[0] == k.shape[0] == v.shape[0] or k.shape[2] != v.shape[2] or q.shape[3] != k.shape[3]:
        raise _refuse(where, name, f"with Q {list(q.shape)}, K {list(k.shape)}, V {list(v.shape)}")
    mask = inputs[3] if len(inputs) > 3 else ""
    fill = ""
    nodes: list[Node] = []
    if mask:
        _check_mask(types[mask], q, k, where, name)
        fill = unique_name(f"{name}/masked_row_fill", set(types) | set(constants))
        constants[fill] = np.zeros((), as_dtype(q.dtype))
        types[fill] = TensorType((), q.dtype)
        nodes, mask = _lowest_as_minus_infinity(name, mask, types, constants)
    causal = int(attrs.get("is_causal", 0))
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(q.shape[3])
    term_attrs = {"scale": scale, "causal": causal}
    keys_t = unique_name(f"{inputs[1]}/transposed_for_{name}", set(types) | set(constants))
    types[keys_t] = TensorType((k.shape[0], k.shape[1], k.shape[3], k.shape[2]), k.dtype)
    return [
        *nodes,
        Node(f"{name}/keys_transposed", "Transpose", (inputs[1],), (keys_t,), {"perm": [0, 1, 3, 2]}, ""),
        Node(name, "Attention", (inputs[0], keys_t, inputs[2], mask, fill), (outputs[0],), term_attrs, ""),
    ]


def _lowest_as_minus_infinity(
    name: str, mask: str, types: dict[str, TensorType], constants: dict[str, np.ndarray]
) -> tuple[list[Node], str]:
    """``Where(mask <= lowest, -inf, mask)``: onnxruntime's Attention reads a mask entry of the type's lowest
    value (what torch's exporters write for "masked") as -inf, so a row whose every key is so masked gives zeros
    there (measured, onnxruntime 1.31), where the term's softmax of equal finite scores would give the mean of V.
    As -inf the row's probabilities are NaN and the term's zero fill gives the zeros onnxruntime gives."""
    mtype = types[mask]
    dtype = as_dtype(mtype.dtype)
    taken = set(types) | set(constants)
    lowest, minus_inf = (unique_name(f"{name}/mask_{w}", taken | {mask}) for w in ("lowest", "minus_inf"))
    constants[lowest] = np.asarray(lowest_value(dtype), dtype=dtype)
    constants[minus_inf] = np.asarray(-np.inf, dtype=dtype)
    types[lowest] = types[minus_inf] = TensorType((), mtype.dtype)
    below = unique_name(f"{mask}/is_lowest", set(types) | set(constants))
    types[below] = TensorType(mtype.shape, "bool")
    out = unique_name(f"{mask}/lowest_as_minus_inf", set(types) | set(constants))
    types[out] = mtype
    return [
        Node(f"{name}/mask_is_lowest", "LessOrEqual", (mask, lowest), (below,), {}, ""),
        Node(f"{name}/mask_lowest_as_minus_inf", "Where", (below, minus_inf, mask), (out,), {}, ""),
    ], out

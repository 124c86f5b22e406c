"""ONNX ops as PyTorch ops: what the torch backend runs, for the original model and for a plan's ranks alike.

An op family may carry its own PyTorch semantics (``OpFamily.torch``, unity_eq/ops/family.py: one room per
family); they come first. Otherwise one table, :data:`TORCH_OPS`, maps an ONNX op type to a function
``(inputs, attrs) -> outputs`` over torch tensors (``None`` for an absent optional input), grouped by the op
families of ``unity_eq/ops`` (elementwise, matmul, normalization, reshape, slicing, reduce; the reshape and slicing
ones, which move elements without computing on them, are :mod:`unity_eq.train.torch_layout`'s) and then the ops
the families carry opaquely (Cast, Shape, Where…). Every function is differentiable where the op is, through
autograd's own kernels, so a plan's backward pass is autograd's. An op with neither is refused before any rank
starts (:func:`refuse_unknown`), naming the op and the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from unity_eq.errors import ModelError, PlanError
from unity_eq.train.torch_layout import LAYOUT_OPS, MULTI_OUTPUT_OPS, OpFn, Tensor, ints, op_axes

__all__ = ["TORCH_OPS", "refuse_unknown", "run_op", "torch_dtype"]

_ONNX_DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.uint8,
    3: torch.int8,
    5: torch.int16,
    6: torch.int32,
    7: torch.int64,
    9: torch.bool,
    10: torch.float16,
    11: torch.float64,
    16: torch.bfloat16,
}


def torch_dtype(dtype: str | np.dtype[Any]) -> torch.dtype:
    """The torch dtype of a numpy dtype name (``float32``)."""
    name = np.dtype(dtype).name if not (isinstance(dtype, str) and dtype == "bfloat16") else "bfloat16"
    return getattr(torch, name)


def _is_bfloat16(dtype: np.dtype[Any]) -> bool:
    return dtype.name == "bfloat16"  # ml_dtypes' bfloat16, which onnx's numpy_helper returns


def tensor_of(array: Any, device: torch.device | str | None = None) -> Tensor:
    """A torch tensor holding a copy of numpy ``array``, bfloat16 included (torch cannot read ml_dtypes'
    bfloat16 arrays: their bits are moved as uint16 and viewed as torch's bfloat16)."""
    value = np.array(array, order="C")  # not ascontiguousarray: it makes a 0-d array (a scalar Gather index) 1-d
    if value.dtype.type.__module__ == "ml_dtypes" and not _is_bfloat16(value.dtype):
        raise ModelError(f"the torch backend has no {value.dtype.name} tensors (bfloat16 is the narrow float it takes)")
    if _is_bfloat16(value.dtype):
        tensor = torch.from_numpy(value.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(value.copy())
    return tensor if device is None else tensor.to(device)


def array_of(tensor: Tensor) -> np.ndarray:
    """A numpy copy of ``tensor`` on the host; bfloat16 as ml_dtypes' bfloat16 (numpy has none)."""
    value = tensor.detach().cpu()
    if value.dtype == torch.bfloat16:
        import ml_dtypes

        return value.view(torch.uint16).numpy().copy().view(ml_dtypes.bfloat16)
    return value.numpy().copy()


def _one(fn: Callable[..., Tensor]) -> OpFn:
    """An op with one output computed from its present inputs."""
    return lambda inputs, attrs: [fn(*inputs)]


# --- elementwise (unity_eq/ops/elementwise.py) ----------------------------------------------------------------
def _pow(a: Tensor, b: Tensor) -> Tensor:
    return torch.pow(a, b.to(a.dtype) if b.is_floating_point() else b)


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.is_floating_point():
        return a / b
    return torch.div(a, b, rounding_mode="trunc")


def _gelu(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [torch.nn.functional.gelu(inputs[0], approximate=str(attrs.get("approximate", "none")))]


def _clip(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else attrs.get("max")
    return [torch.clamp(x, low, high)]


def _softmax_like(fn: Callable[..., Tensor]) -> OpFn:
    return lambda inputs, attrs: [fn(inputs[0], dim=int(attrs.get("axis", -1)))]


def _cast(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [inputs[0].to(_ONNX_DTYPES[int(attrs["to"])])]


def _cast_like(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    return [inputs[0].to(inputs[1].dtype)]


def _where(c: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(c.to(torch.bool), a, b)


def _variadic(fn: Callable[[Tensor, Tensor], Tensor]) -> OpFn:
    def run(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
        out = inputs[0]
        for other in inputs[1:]:
            out = fn(out, other)
        return [out]

    return run


# --- matmul (unity_eq/ops/matmul.py) ------------------------------------------------------------------------
def _gemm(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    a, b = inputs[0], inputs[1]
    if int(attrs.get("transA", 0)):
        a = a.transpose(0, 1)
    if int(attrs.get("transB", 0)):
        b = b.transpose(0, 1)
    out = float(attrs.get("alpha", 1.0)) * (a @ b)
    if len(inputs) > 2 and inputs[2] is not None:
        out = out + float(attrs.get("beta", 1.0)) * inputs[2]
    return [out]


# --- normalization (unity_eq/ops/normalization.py) --------------------------------------------------------------
def _layer_norm(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = int(attrs.get("axis", -1)) % x.dim()
    shape = tuple(x.shape[axis:])
    eps = float(attrs.get("epsilon", 1e-5))
    if scale.shape != shape or (bias is not None and bias.shape != shape):  # broadcast scale/bias: compose
        mean = x.mean(dim=tuple(range(axis, x.dim())), keepdim=True)
        var = ((x - mean) ** 2).mean(dim=tuple(range(axis, x.dim())), keepdim=True)
        out = (x - mean) / torch.sqrt(var + eps) * scale
        return [out + bias if bias is not None else out]
    return [torch.nn.functional.layer_norm(x, shape, scale, bias, eps)]


def _rms_norm(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    x, scale = inputs[0], inputs[1]
    axis = int(attrs.get("axis", -1)) % x.dim()
    eps = float(attrs.get("epsilon", 1e-5))
    var = (x * x).mean(dim=tuple(range(axis, x.dim())), keepdim=True)
    return [x / torch.sqrt(var + eps) * scale]


# --- reductions (unity_eq/ops/reduce.py) ---------------------------------------------------------------------
def _reduce(fn: str) -> OpFn:
    def run(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
        x = inputs[0]
        axes = op_axes(inputs, attrs)
        keep = bool(int(attrs.get("keepdims", 1)))
        if not axes:
            if int(attrs.get("noop_with_empty_axes", 0)):
                return [x]
            axes = list(range(x.dim()))
        dims = tuple(a % x.dim() for a in axes) if x.dim() else ()
        if fn == "sum":
            return [x.sum(dim=dims, keepdim=keep) if dims else x]
        if fn == "mean":
            return [x.mean(dim=dims, keepdim=keep) if dims else x]
        if fn == "sumsquare":
            return [(x * x).sum(dim=dims, keepdim=keep) if dims else x * x]
        if fn == "l2":
            return [torch.sqrt((x * x).sum(dim=dims, keepdim=keep))]
        out = x
        for d in sorted(dims, reverse=True):
            out = (out.amax if fn == "max" else out.amin)(dim=d, keepdim=keep)
        return [out]

    return run


def _arg(fn: Callable[..., Tensor]) -> OpFn:
    def run(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
        return [fn(inputs[0], dim=int(attrs.get("axis", 0)), keepdim=bool(int(attrs.get("keepdims", 1))))]

    return run


# --- ops carried opaquely that PyTorch has ---------------------------------------------------------------------
def _shape(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    dims = list(inputs[0].shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end")
    return [torch.tensor(dims[start : None if end is None else int(end)], dtype=torch.int64)]


def _constant(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in attrs:
            value = attrs[key]
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
            if key.startswith("value_float"):
                array = array.astype(np.float32)
            elif key.startswith("value_int"):
                array = array.astype(np.int64)
            return [tensor_of(array)]
    raise PlanError(f"Constant: no value among {sorted(attrs)}")


def _constant_of_shape(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    value = attrs.get("value")
    array = np.asarray(value) if value is not None else np.zeros(1, np.float32)
    fill = tensor_of(array.reshape(-1)[:1])
    return [fill.reshape(()).expand(ints(inputs[0])).clone()]


def _range(start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
    return torch.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype)


def _cumsum(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    """ONNX CumSum: the running sum along ``axis`` (an input), ``exclusive`` leaving out each element itself,
    ``reverse`` from the end (the exporters' position ids: ``cumsum(mask) - 1``)."""
    x, axis = inputs[0], int(inputs[1].reshape(-1)[0].item())
    if int(attrs.get("reverse", 0)):
        x = x.flip(axis)
    out = torch.cumsum(x, dim=axis, dtype=x.dtype)  # ONNX keeps the input's type (torch widens int32)
    if int(attrs.get("exclusive", 0)):
        out = out - x
    return [out.flip(axis) if int(attrs.get("reverse", 0)) else out]


def _trilu(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    k = int(inputs[1].item()) if len(inputs) > 1 and inputs[1] is not None else 0
    return [torch.triu(inputs[0], k) if int(attrs.get("upper", 1)) else torch.tril(inputs[0], k)]


def _sdpa(inputs: list[Any], attrs: Mapping[str, Any]) -> list[Tensor]:
    """ONNX ``Attention`` (opset 23) for 4-d q, k, v: torch's scaled_dot_product_attention, grouped-query heads
    each read by their group of query heads (ONNX's layout); a KV cache or 3-d inputs are refused."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    if (len(inputs) > 4 and any(i is not None for i in inputs[4:])) or q.dim() != 4:
        raise PlanError("ONNX Attention with a KV cache or 3-d inputs has no PyTorch semantics in unity-eq yet")
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    mask = inputs[3] if len(inputs) > 3 else None
    if mask is not None and mask.dtype != torch.bool:
        # onnxruntime reads the type's lowest value as -inf (a row so masked gives zeros: below)
        mask = mask.to(q.dtype)
        mask = mask.masked_fill(mask <= torch.finfo(mask.dtype).min, float("-inf"))
    causal = bool(int(attrs.get("is_causal", 0)))
    if causal and mask is not None:  # ONNX applies both: the causal bias added to (or anded with) the mask
        seen = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = mask & seen if mask.dtype == torch.bool else mask.masked_fill(~seen, float("-inf"))
    scale = attrs.get("scale")
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=None if scale is None else float(scale)
    )
    if mask is not None:  # a row whose every key is masked: NaN in torch, zeros in onnxruntime's kernel
        dead = (~mask).all(-1, keepdim=True) if mask.dtype == torch.bool else (mask == float("-inf")).all(-1, True)
        out = out.masked_fill(dead, 0.0)
    return [out]


TORCH_OPS: dict[str, OpFn] = {
    # elementwise
    "Add": _one(torch.add),
    "Sub": _one(torch.sub),
    "Mul": _one(torch.mul),
    "Div": _one(_div),
    "Pow": _one(_pow),
    "Neg": _one(torch.neg),
    "Abs": _one(torch.abs),
    "Sqrt": _one(torch.sqrt),
    "Reciprocal": _one(torch.reciprocal),
    "Exp": _one(torch.exp),
    "Log": _one(torch.log),
    "Erf": _one(torch.erf),
    "Tanh": _one(torch.tanh),
    "Sigmoid": _one(torch.sigmoid),
    "Relu": _one(torch.relu),
    "Sin": _one(torch.sin),
    "Cos": _one(torch.cos),
    "Floor": _one(torch.floor),
    "Ceil": _one(torch.ceil),
    "Gelu": _gelu,
    "Clip": _clip,
    "Max": _variadic(torch.maximum),
    "Min": _variadic(torch.minimum),
    "Sum": _variadic(torch.add),
    "Equal": _one(torch.eq),
    "Less": _one(torch.lt),
    "LessOrEqual": _one(torch.le),
    "Greater": _one(torch.gt),
    "GreaterOrEqual": _one(torch.ge),
    "Not": _one(torch.logical_not),
    "IsNaN": _one(torch.isnan),
    "IsInf": _one(torch.isinf),
    "And": _one(torch.logical_and),
    "Or": _one(torch.logical_or),
    "Where": _one(_where),
    "Identity": _one(lambda x: x),
    "Cast": _cast,
    "CastLike": _cast_like,
    # matmul
    "MatMul": _one(torch.matmul),
    "Gemm": _gemm,
    # normalization
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _rms_norm,
    "SimplifiedLayerNormalization": _rms_norm,
    "Softmax": _softmax_like(torch.softmax),
    "LogSoftmax": _softmax_like(torch.log_softmax),
    # reshape and layout, slicing and indexing (torch_layout.py)
    **LAYOUT_OPS,
    # reductions
    "ReduceSum": _reduce("sum"),
    "ReduceMean": _reduce("mean"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "ReduceSumSquare": _reduce("sumsquare"),
    "ReduceL2": _reduce("l2"),
    "ArgMax": _arg(torch.argmax),
    "ArgMin": _arg(torch.argmin),
    # carried opaquely by the e-graph, present in PyTorch
    "Shape": _shape,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Range": _one(_range),
    "Trilu": _trilu,
    "CumSum": _cumsum,
    "Attention": _sdpa,
}


def run_op(
    op: str, inputs: list[Any], attrs: Mapping[str, Any], outputs: int = 1, domain: str = "", onnx: bool = False
) -> list[Tensor]:
    """The outputs of op ``op`` on torch ``inputs`` (``None`` for an absent optional input): a plan step's term,
    or with ``onnx`` a model file's node (``unity_eq.ops.registry.ONNX_NAMESAKES``)."""
    if domain not in ("", "ai.onnx"):
        raise PlanError(f"op {domain}::{op} has no PyTorch semantics in unity-eq's torch backend")
    hook = _family_hook(op, onnx)
    if hook is not None:
        return list(hook(op, inputs, attrs))
    if op in MULTI_OUTPUT_OPS:
        return MULTI_OUTPUT_OPS[op](inputs, attrs, outputs)
    return TORCH_OPS[op](inputs, attrs)


def _family_hook(op: str, onnx: bool = False) -> Callable[..., Any] | None:
    """The op family's own PyTorch semantics (``OpFamily.torch``), which come before this table's; none for a
    model file's node (``onnx``) whose op only shares its name with the family's term."""
    from unity_eq.ops.registry import ONNX_NAMESAKES, family_for

    if onnx and op in ONNX_NAMESAKES:
        return None

    family = family_for(op)
    return family.torch if family is not None else None


def refuse_unknown(nodes: Iterable[tuple[str, str, str]], where: str) -> None:
    """Refuse, before any rank starts, the first op with no PyTorch semantics here: ``nodes`` are
    ``(op, domain, node name)``."""
    for op, domain, node in nodes:
        known = op in TORCH_OPS or op in MULTI_OUTPUT_OPS or _family_hook(op) is not None
        if domain not in ("", "ai.onnx") or not known:
            name = f"{domain}::{op}" if domain not in ("", "ai.onnx") else op
            raise PlanError(
                f"{where}: op {name} (node {node or '?'}) has no PyTorch semantics in the torch backend "
                "(unity_eq/train/torch_ops.py), so the plan cannot train. Add the op there, or export the model "
                "without it."
            )

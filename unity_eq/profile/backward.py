"""Backward times: each profiled op built in PyTorch at its local shapes and timed forward, and forward + backward.

Why torch and not onnxruntime: onnxruntime runs the plans' forward pass, and ``profile`` times the forward there,
but it has no backward for an arbitrary op (its gradient builder ships only with onnxruntime-training, a separate
build, and derives gradients of whole training graphs). The backward pass of a training step is what PyTorch's
autograd runs, the kernels the cost model's ``backward_work`` hooks describe, so torch measures it: the op's
forward with autograd recording, then ``autograd.backward`` with a random output gradient into every
floating-point operand with more than one element (one-element operands are constants: a scale, an epsilon, as
the cost model assumes). ``backward_s`` = median(forward + backward) − median(forward), at least 0.

An op this module cannot build in torch (Conv, LRN, opaque ops…) gets no backward entry; the cost model then
scales its measured forward by the roofline's backward / forward ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.dtypes import as_dtype, is_float
from unity_eq.profile.instances import ProfiledOp

__all__ = ["BackwardRunner", "BackwardTiming", "torch_device_for"]

TorchFn = Callable[..., Any]


@dataclass(frozen=True)
class BackwardTiming:
    """Medians of the op in torch: forward alone and forward + backward; ``backward_s`` their difference."""

    forward_s: float
    forward_backward_s: float
    repeats: int

    @property
    def backward_s(self) -> float:
        return max(self.forward_backward_s - self.forward_s, 0.0)


def torch_device_for(cuda: bool, device_id: int = 0) -> tuple[str | None, str]:
    """The torch device for the backward pass and a note when there is none: with onnxruntime on CUDA, torch's
    CUDA device (or none, with the reason: a forward on the GPU and a backward on the CPU would not add up);
    on the CPU, the CPU."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed: no backward measured (the roofline's ratio scales the forward)"
    if not cuda:
        return "cpu", ""
    if not torch.cuda.is_available():
        return None, "this PyTorch has no CUDA: no backward measured (the roofline's ratio scales the forward)"
    return f"cuda:{device_id}", ""


def _unary(name: str, attrs: Mapping[str, Any]) -> TorchFn | None:
    import torch
    import torch.nn.functional as F

    alpha = float(attrs.get("alpha", 0.01 if name == "LeakyRelu" else 1.0))
    table: dict[str, TorchFn] = {
        "Relu": torch.relu,
        "Sigmoid": torch.sigmoid,
        "Tanh": torch.tanh,
        "Exp": torch.exp,
        "Log": torch.log,
        "Neg": torch.neg,
        "Sqrt": torch.sqrt,
        "Reciprocal": torch.reciprocal,
        "Erf": torch.erf,
        "Abs": torch.abs,
        "Identity": lambda x: x,
        "Softplus": F.softplus,
        "Softsign": F.softsign,
        "Sin": torch.sin,
        "Cos": torch.cos,
        "HardSwish": F.hardswish,
        "Mish": F.mish,
        "LeakyRelu": lambda x: F.leaky_relu(x, alpha),
        "Elu": lambda x: F.elu(x, alpha),
        "Celu": lambda x: F.celu(x, alpha),
        "Selu": F.selu,
        "Gelu": lambda x: F.gelu(x, approximate="tanh" if attrs.get("approximate") == "tanh" else "none"),
    }
    return table.get(name)


def _binary(name: str) -> TorchFn | None:
    import torch

    table: dict[str, TorchFn] = {
        "Add": torch.add,
        "Sub": torch.sub,
        "Mul": torch.mul,
        "Div": torch.div,
        "Pow": torch.pow,
        "Max": torch.maximum,
        "Min": torch.minimum,
        "PRelu": lambda a, b: torch.where(a >= 0, a, a * b),
        "MatMul": torch.matmul,
    }
    return table.get(name)


def _constants(instance: ProfiledOp) -> list[tuple[int, ...] | None]:
    """The integer-list inputs of the op (Slice's starts…, Split's sizes), in order; None for absent ones."""
    return [s.value if s.kind == "constant" else None for s in instance.inputs if s.kind in ("constant", "absent")]


def _shaped(instance: ProfiledOp) -> TorchFn | None:
    """Ops whose torch form follows from attributes, constants or the output shape."""
    import torch
    import torch.nn.functional as F

    op, attrs, out = instance.op, dict(instance.attrs), tuple(instance.out_shape)
    consts = _constants(instance)
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        return lambda x: x.reshape(out)
    if op == "Expand":
        return lambda x: x.expand(out).contiguous()  # onnxruntime materializes it
    if op == "Transpose":
        perm = tuple(attrs["perm"])
        return lambda x: x.permute(perm).contiguous()
    if op in ("Softmax", "LogSoftmax"):
        axis = int(attrs.get("axis", -1))
        return (lambda x: torch.softmax(x, axis)) if op == "Softmax" else (lambda x: torch.log_softmax(x, axis))
    if op == "LayerNormalization":
        axis, eps = int(attrs.get("axis", -1)), float(attrs.get("epsilon", 1e-5))
        return lambda x, w, b=None: F.layer_norm(x, x.shape[axis:], w.expand(x.shape[axis:]), b, eps)
    if op == "Concat":
        axis = int(attrs["axis"])
        return lambda *xs: torch.cat(xs, axis)
    if op == "Split":
        axis, sizes = int(attrs["axis"]), consts[0]
        return lambda x: torch.split(x, list(sizes) if sizes else x.shape[axis] // instance.outputs, axis)
    if op == "Gather":
        axis = int(attrs.get("axis", 0))
        return lambda x, i: torch.index_select(x, axis, i.reshape(-1)).reshape(out)
    if op == "Slice":
        return _slice(consts)
    if op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"):
        return _reduce(op, consts, attrs)
    if op == "Where":
        return lambda c, a, b: torch.where(c, a, b)
    if op == "Cast":
        return lambda x: x.to(getattr(torch, np.dtype(instance.output_dtypes[0]).name))
    if op == "Gemm":
        ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))

        def gemm(a: Any, b: Any, c: Any = None) -> Any:
            y = alpha * ((a.t() if ta else a) @ (b.t() if tb else b))
            return y if c is None else y + beta * c

        return gemm
    return None


def _slice(consts: Sequence[tuple[int, ...] | None]) -> TorchFn:
    starts, ends = consts[0] or (), consts[1] or ()
    axes = consts[2] if len(consts) > 2 and consts[2] is not None else tuple(range(len(starts)))
    steps = consts[3] if len(consts) > 3 and consts[3] is not None else (1,) * len(starts)

    def run(x: Any) -> Any:
        index = [slice(None)] * x.dim()
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
            index[axis] = slice(start, end, step)
        return x[tuple(index)].contiguous()

    return run


def _reduce(op: str, consts: Sequence[tuple[int, ...] | None], attrs: Mapping[str, Any]) -> TorchFn:
    import torch

    axes = consts[0] if consts and consts[0] is not None else None
    keep = bool(int(attrs.get("keepdims", 1)))

    def run(x: Any) -> Any:
        dims = tuple(axes) if axes else tuple(range(x.dim()))
        if op == "ReduceSum":
            return x.sum(dims, keepdim=keep)
        if op == "ReduceMean":
            return x.mean(dims, keepdim=keep)
        return torch.amax(x, dims, keepdim=keep) if op == "ReduceMax" else torch.amin(x, dims, keepdim=keep)

    return run


def _present(spec: Any) -> bool:
    """Whether an input is a tensor the op is called with (not a constant list, not absent or untyped)."""
    return spec.kind not in ("constant", "absent") and spec.dtype not in ("", "none")


def _family_semantics(instance: ProfiledOp) -> TorchFn | None:
    """The op family's own torch semantics (``OpFamily.torch``, what ``unity-eq train`` runs: Attention as
    ``scaled_dot_product_attention``), called with None for absent inputs; None without such a hook or with
    constant-list inputs (those ops are built above)."""
    from unity_eq.ops.registry import family_for

    family = family_for(instance.op)
    hook = family.torch if family is not None else None
    if hook is None or any(s.kind == "constant" for s in instance.inputs):
        return None
    present = [_present(s) for s in instance.inputs]
    attrs = dict(instance.attrs)

    def run(*tensors: Any) -> Any:
        given = iter(tensors)
        args = [next(given) if here else None for here in present]
        while args and args[-1] is None:
            args.pop()
        outs = list(hook(instance.op, args, attrs))
        return outs[0] if len(outs) == 1 else tuple(outs)

    return run


def torch_function(instance: ProfiledOp) -> TorchFn | None:
    """The op as a torch function of its tensor inputs (None: not built here; no backward is measured)."""
    if instance.domain not in ("", "ai.onnx"):
        return None
    attrs = dict(instance.attrs)
    return _unary(instance.op, attrs) or _binary(instance.op) or _shaped(instance) or _family_semantics(instance)


class BackwardRunner:
    """Times ops forward and forward + backward in torch on one device (as :class:`~unity_eq.profile.timing.
    Runner` does in onnxruntime: warm-up runs, then at least ``repeats``, more while under ``min_time``)."""

    def __init__(self, device: str, threads: int, warmup: int, repeats: int, min_time: float) -> None:
        import torch

        self.device = device
        self.warmup, self.repeats, self.min_time = warmup, repeats, min_time
        if device == "cpu":
            torch.set_num_threads(max(threads, 1))

    def _sync(self) -> None:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def tensors(self, instance: ProfiledOp, weights: Mapping[int, np.ndarray], rng: np.random.Generator) -> list[Any]:
        """The op's tensor inputs on the device: floating ones (but one-element constants) require gradients;
        integer ones (Gather's indices) hold known values or valid random ones; boolean ones random."""
        from unity_eq.train.torch_ops import tensor_of

        tensors: list[Any] = []
        for position, spec in enumerate(instance.inputs):
            if not _present(spec):
                continue
            value = weights.get(position)
            dtype = as_dtype(spec.dtype)
            if dtype.kind in "iu" and instance.op == "Gather":  # valid row numbers of the table
                high = max(instance.inputs[0].shape[int(dict(instance.attrs).get("axis", 0))], 1)
                value = rng.integers(0, high, size=spec.shape) if value is None else np.mod(value, high)
            if value is None:
                if dtype.kind in "iu":
                    value = rng.integers(0, 2, size=spec.shape)
                elif dtype.kind == "b":
                    value = rng.random(spec.shape) < 0.5
                else:
                    value = rng.standard_normal(spec.shape).astype(dtype)
            tensor = tensor_of(value, self.device)
            if is_float(dtype) and tensor.numel() > 1:
                tensor.requires_grad_(True)
            tensors.append(tensor)
        return tensors

    def samples(self, run: Callable[[], Any]) -> list[float]:
        """Seconds of each timed run of ``run`` (synchronized with the device), after the warm-up runs: at least
        ``repeats``, more while the total is under ``min_time`` (short ops are noisy), at most 20×."""
        for _ in range(self.warmup):
            run()
        self._sync()
        samples: list[float] = []
        started = time.perf_counter()
        while len(samples) < self.repeats or (
            time.perf_counter() - started < self.min_time and len(samples) < 20 * self.repeats
        ):
            begin = time.perf_counter()
            run()
            self._sync()
            samples.append(time.perf_counter() - begin)
        return samples

    def _median(self, run: Callable[[], None]) -> tuple[float, int]:
        samples = self.samples(run)
        return statistics.median(samples), len(samples)

    def measure(
        self, instance: ProfiledOp, weights: Mapping[int, np.ndarray], rng: np.random.Generator
    ) -> BackwardTiming | None:
        """Forward and forward + backward medians of the op, or None when torch cannot build it or nothing of it
        has a gradient. Errors from torch (an op it refuses on these shapes) propagate to the caller."""
        import torch

        fn = torch_function(instance)
        if fn is None:
            return None
        tensors = self.tensors(instance, weights, rng)
        leaves = [t for t in tensors if t.requires_grad]
        if not leaves:
            return None
        first = fn(*tensors)
        outputs = first if isinstance(first, tuple | list) else (first,)
        if not any(o.requires_grad for o in outputs):
            return None
        grads = [torch.randn_like(o) for o in outputs]

        def forward() -> None:
            fn(*tensors)

        def forward_backward() -> None:
            for leaf in leaves:
                leaf.grad = None
            out = fn(*tensors)
            outs = out if isinstance(out, tuple | list) else (out,)
            torch.autograd.backward(list(outs), grads)

        fwd, _ = self._median(forward)
        both, repeats = self._median(forward_backward)
        return BackwardTiming(fwd, both, repeats)

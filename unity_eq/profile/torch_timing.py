"""The forward pass timed in PyTorch, and the device calibrated in PyTorch: ``profile --framework torch``.

Why a second forward timer: ``profile`` times the forward pass in onnxruntime, the runtime ``run`` and ``check``
use, but onnxruntime runs on a GPU only in its CUDA build (onnxruntime-gpu, a separate wheel of several hundred
MB). A machine whose PyTorch has CUDA and whose onnxruntime has not (the common case on training machines, and
the lent GPU machines here) can still time every op on the GPU: forward and backward both in torch, the kernels
the torch backend (``unity-eq train``) runs. ``--framework auto`` chooses this when ``--device cuda|auto`` finds
no CUDA in onnxruntime but finds it in torch, and says so.

The calibration is the same measurements as :func:`unity_eq.profile.timing.calibrate` (a large float32 MatMul, a
large elementwise Add of a scalar, a one-element Add, fused attention: here scaled_dot_product_attention forward
and backward), run in torch, so the calibrated roofline and the ops are timed by one framework.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping

import numpy as np

from unity_eq.ops.attention_costs import attention_flops
from unity_eq.ops.attention_costs import backward_work as attention_backward_work
from unity_eq.profile.backward import BackwardRunner, torch_function
from unity_eq.profile.instances import ProfiledOp
from unity_eq.profile.timing import ATTENTION_SHAPE, Progress, Timers, Timing, run_calibration
from unity_eq.profile_table import Calibration

__all__ = ["calibrate_torch", "describe_torch_device", "forward_timing"]


def _timing(samples: list[float]) -> Timing:
    return Timing(statistics.median(samples), min(samples), len(samples))


def forward_timing(
    runner: BackwardRunner, instance: ProfiledOp, weights: Mapping[int, np.ndarray], rng: np.random.Generator
) -> Timing | None:
    """The op's forward in torch without autograd (None: the torch timer does not build this op)."""
    import torch

    fn = torch_function(instance)
    if fn is None:
        return None
    tensors = [t.detach() for t in runner.tensors(instance, weights, rng)]
    with torch.no_grad():
        return _timing(runner.samples(lambda: fn(*tensors)))


def describe_torch_device(device: str, threads: int) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (PyTorch {torch.__version__})"
    from unity_eq.profile.timing import describe_local_device
    from unity_eq.runtime.devices import DeviceChoice

    return f"{describe_local_device(DeviceChoice(['CPUExecutionProvider']), threads)} (PyTorch {torch.__version__})"


def _matmul_peak(runner: BackwardRunner, device: str, dtype: str, say: Progress) -> float:
    """FLOP/s of an 8192³ MatMul in ``dtype`` (its fastest run)."""
    import torch

    n = 8192
    a = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, device=device, dtype=getattr(torch, dtype))
    with torch.no_grad():
        timing = _timing(runner.samples(functools.partial(torch.matmul, a, b)))
    peak = 2.0 * n**3 / timing.min_s
    say(f"calibration (torch): {dtype} MatMul {n}³ in {timing.min_s * 1e3:.2f} ms → {peak / 1e12:.1f} TFLOP/s")
    return peak


def calibrate_torch(runner: BackwardRunner, threads: int, progress: Progress | None = None) -> Calibration:
    """Peak float32 FLOP/s, memory bandwidth and per-op floor of ``runner``'s device, measured in torch with the
    sizes onnxruntime's calibration uses (:func:`~unity_eq.profile.timing.run_calibration`); on a GPU also the
    16-bit types' MatMul peaks (tensor cores), which the calibrated machine prices those dtypes with."""
    import torch

    say = progress or (lambda _m: None)
    device = runner.device

    def matmul(n: int) -> Timing:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        with torch.no_grad():
            return _timing(runner.samples(functools.partial(torch.matmul, a, b)))

    def add(elements: int) -> Timing:
        x = torch.randn(elements, device=device)
        y = torch.empty_like(x)  # written in place: a fresh 64 MiB block per run times the CPU's page faults
        with torch.no_grad():
            return _timing(runner.samples(functools.partial(torch.add, x, 1.0, out=y)))

    def floor() -> Timing:
        one = torch.randn(1, device=device)
        with torch.no_grad():
            return _timing(runner.samples(functools.partial(torch.add, one, 1.0)))

    def attention(s: int) -> tuple[Timing, float, str]:
        """scaled_dot_product_attention forward and backward, as the torch backend trains the Attention term."""
        b, h, d = ATTENTION_SHAPE
        q, k, v = (torch.randn(b, h, s, d, device=device, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, s, d, device=device)

        def step() -> None:
            torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)

        shapes = ((b, h, s, d), (b, h, d, s), (b, h, s, d))
        backward = attention_backward_work("Attention", shapes, shapes[0])
        flops = attention_flops(*shapes) + (backward.flops if backward is not None else 0.0)
        return _timing(runner.samples(step)), flops, "forward and backward"

    timers = Timers(matmul, add, floor, attention)
    peak, bandwidth, floor_s, details = run_calibration(timers, say, "calibration (torch)")
    if device.startswith("cuda"):
        details["peak_flops"] = {name: _matmul_peak(runner, device, name, say) for name in ("bfloat16", "float16")}
        memory = float(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    else:
        import os

        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return Calibration(describe_torch_device(device, threads), peak, bandwidth, floor_s, memory, details)

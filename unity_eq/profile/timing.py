"""Timing one-node models on this machine's device (:class:`Runner`: I/O bound to the device, warm-up, the median
of repeats) and calibrating the device as a roofline spec (peak FLOP/s, bandwidth, per-op floor)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from unity_eq.lower.onnxrt import make_session
from unity_eq.machine import DeviceSpec, LinkSpec, Machine
from unity_eq.ops.attention_costs import attention_flops
from unity_eq.profile.models import add_model, attention_model, matmul_model
from unity_eq.profile_table import Calibration
from unity_eq.runtime.devices import DeviceChoice

Progress = Callable[[str], None]


@dataclass
class Timing:
    median_s: float
    min_s: float
    repeats: int


class Runner:
    """Runs one-node models on the chosen device with I/O bound to it, and times them."""

    def __init__(self, choice: DeviceChoice, threads: int, warmup: int, repeats: int, min_time: float) -> None:
        self.choice = choice
        self.threads = threads
        self.warmup = warmup
        self.repeats = repeats
        self.min_time = min_time
        self.device = ("cuda", int(dict(choice.providers[0][1])["device_id"])) if choice.cuda else ("cpu", 0)

    def session(self, model: onnx.ModelProto) -> Any:
        return make_session(model, self.choice.providers, self.threads)

    def time(self, session: Any, feeds: Mapping[str, np.ndarray]) -> Timing:
        import onnxruntime as ort

        kind, device_id = self.device
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, kind, device_id))
        for out in session.get_outputs():
            binding.bind_output(out.name, kind, device_id)
        for _ in range(self.warmup):
            session.run_with_iobinding(binding)
        samples: list[float] = []
        started = time.perf_counter()
        # at least `repeats` runs, more while the total is under `min_time` (short ops are noisy), at most 20×
        while len(samples) < self.repeats or (
            time.perf_counter() - started < self.min_time and len(samples) < 20 * self.repeats
        ):
            begin = time.perf_counter()
            session.run_with_iobinding(binding)
            samples.append(time.perf_counter() - begin)
        return Timing(statistics.median(samples), min(samples), len(samples))


def measure(runner: Runner, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> Timing:
    return runner.time(runner.session(model), feeds)


def describe_local_device(choice: DeviceChoice, threads: int) -> str:
    if choice.cuda:
        return f"{choice.description} (onnxruntime CUDAExecutionProvider)"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {cpu}, {threads} thread{'s' if threads != 1 else ''}"


def _memory_bytes(choice: DeviceChoice) -> float:
    if choice.cuda:  # onnxruntime does not say; torch does when it has CUDA (machine files carry it anyway)
        try:
            import torch

            return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0.0
        except ImportError:
            return 0.0
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0.0


@dataclass(frozen=True)
class Timers:
    """How one framework times the calibration's ops: an n×n×n float32 MatMul, an Add of a scalar to
    ``elements`` floats, a one-element Add, and (where the framework has a fused kernel) float32 attention of
    :data:`ATTENTION_SHAPE` at a sequence length ``s``, answering its timing and the FLOPs the cost model counts
    for what it ran (forward, or forward and backward)."""

    matmul: Callable[[int], Timing]
    add: Callable[[int], Timing]
    floor: Callable[[], Timing]
    attention: Callable[[int], tuple[Timing, float, str]] | None = None


#: (batch, heads, head dim) of the calibration's attention; its sequence length doubles from 128
ATTENTION_SHAPE = (1, 8, 64)


def _calibrate_attention(timers: Timers, peak: float, say: Progress, label: str, details: dict[str, Any]) -> None:
    """The fused attention kernel's efficiency (the cost model's ``attention`` class): the FLOPs it counts over
    the fastest run's time and the float32 peak, the sequence doubled from 128 while a run is under 10 ms (at
    most 4096). A flash kernel reaches far less of the peak than a GEMM (measured on an H200: 0.40 against
    0.76), so the calibrated machine prices it with its own."""
    if timers.attention is None:
        return
    s = 128
    while True:
        timing, flops, passes = timers.attention(s)
        if timing.min_s >= 0.01 or s >= 4096:
            break
        s *= 2
    efficiency = min(1.0, flops / timing.min_s / peak)
    b, h, d = ATTENTION_SHAPE
    details["attention"] = {
        "shape": [b, h, s, d],
        "passes": passes,
        "flops": flops,
        "min_s": timing.min_s,
        "median_s": timing.median_s,
        "repeats": timing.repeats,
        "efficiency": efficiency,
    }
    say(f"{label}: attention {passes} (b={b}, {h} heads, s={s}, d={d}) in {timing.min_s * 1e3:.2f} ms → "
        f"{efficiency:.2f} of the float32 peak")  # fmt: skip


def run_calibration(
    timers: Timers, say: Progress, label: str = "calibration"
) -> tuple[float, float, float, dict[str, Any]]:
    """Peak FLOP/s (MatMul n×n×n, n doubled from 1024 while it runs under 20 ms), bandwidth (Add of a scalar
    to 2^24 floats, doubled while under 5 ms) and the per-op floor (Add on one element), with the details.

    Peaks are what the device achieves at best, so each uses the fastest of its runs (a run slowed by
    another process says nothing about the device); op entries keep the median."""
    details: dict[str, Any] = {}
    n = 1024
    while True:
        timing = timers.matmul(n)
        if timing.min_s >= 0.02 or n >= 8192:
            break
        n *= 2
    peak = 2.0 * n**3 / timing.min_s
    details["matmul"] = {"n": n, "min_s": timing.min_s, "median_s": timing.median_s, "repeats": timing.repeats}
    say(f"{label}: MatMul {n}×{n}×{n} in {timing.min_s * 1e3:.2f} ms → {peak / 1e9:.1f} GFLOP/s")
    elements = 1 << 24
    while True:
        timing = timers.add(elements)
        if timing.min_s >= 0.005 or elements >= 1 << 28:
            break
        elements *= 2
    bandwidth = 2.0 * 4 * elements / timing.min_s
    details["add"] = {
        "elements": elements,
        "min_s": timing.min_s,
        "median_s": timing.median_s,
        "repeats": timing.repeats,
    }
    say(f"{label}: Add over {elements * 4 >> 20} MiB in {timing.min_s * 1e3:.2f} ms → {bandwidth / 1e9:.1f} GB/s")
    floor = timers.floor()
    details["floor"] = {"min_s": floor.min_s, "median_s": floor.median_s, "repeats": floor.repeats}
    say(f"{label}: one-element Add in {floor.median_s * 1e6:.1f} µs (per-op floor, median)")
    _calibrate_attention(timers, peak, say, label, details)
    return peak, bandwidth, floor.median_s, details


def calibrate(runner: Runner, progress: Progress | None = None) -> Calibration:
    """The device as a roofline spec, timed in onnxruntime (:func:`run_calibration`)."""

    def attention(s: int) -> tuple[Timing, float, str]:
        b, h, d = ATTENTION_SHAPE
        flops = attention_flops((b, h, s, d), (b, h, d, s), (b, h, s, d))
        return measure(runner, *attention_model(b, h, s, d)), flops, "forward"

    timers = Timers(
        matmul=lambda n: measure(runner, *matmul_model(n)),
        add=lambda elements: measure(runner, *add_model(elements)),
        floor=lambda: measure(runner, *add_model(1)),
        attention=attention,
    )
    peak, bandwidth, floor, details = run_calibration(timers, progress or (lambda _m: None))
    device = describe_local_device(runner.choice, runner.threads)
    return Calibration(device, peak, bandwidth, floor, _memory_bytes(runner.choice), details)


def calibrated_machine(calibration: Calibration, devices: int = 1) -> Machine:
    """``devices`` copies of the calibrated device as a :class:`Machine` (efficiency 1: the calibration
    measured what is achievable; fused attention its own, where the calibration measured it), so that the
    roofline can be compared with measurements."""
    spec = DeviceSpec(
        calibration.device,
        # float32's peak, and the 16-bit types' where the calibration measured them (tensor cores)
        {"float32": calibration.peak_flops, **calibration.details.get("peak_flops", {})},
        calibration.memory_bandwidth,
        calibration.memory_bytes,
    )
    link = LinkSpec(bandwidth=calibration.memory_bandwidth, latency=calibration.launch_overhead_s)
    attention = calibration.details.get("attention", {}).get("efficiency")
    return Machine(
        f"{devices}x calibrated {calibration.device}",
        (spec,) * devices,
        (0,) * devices,
        link,
        launch_overhead=calibration.launch_overhead_s,
        efficiency=1.0,
        efficiencies={} if attention is None else {"attention": float(attention)},
    )

"""Where a rank runs: CPU threads, CUDA devices, and the onnxruntime sessions on them.

Kept apart from the runners because lowering (validating device files) and profiling open sessions too, and
neither should depend on how plans are run.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from unity_eq.errors import RuntimeBackendError
from unity_eq.lower.onnxrt import make_session


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_here: int) -> int:
    """onnxruntime intra-op threads for each of ``ranks_here`` ranks sharing this machine's cores.

    Every backend uses this, so the same plan runs with the same thread count (and the same float results)
    in the local and the MPI backend on one node.
    """
    return max(1, available_cores() // max(ranks_here, 1))


@dataclass
class DeviceChoice:
    """Which onnxruntime providers a rank uses.

    ``description`` says what the rank runs on (``CPU`` or ``CUDA:<id>``); ``note`` explains a fallback to the
    CPU (shown once to the user); it is empty when the device asked for is the one in use.
    """

    providers: list[Any]
    description: str = "CPU"
    note: str = ""

    @property
    def cuda(self) -> bool:
        return self.description.startswith("CUDA")


_CUDA_PROBES: dict[int, str | None] = {}


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _tiny_model() -> onnx.ModelProto:
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [info("x", onnx.TensorProto.FLOAT, [1])],
        [info("y", onnx.TensorProto.FLOAT, [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Capture what native code writes to file descriptor 2 (onnxruntime's logger) into a list of lines."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(_ANSI.sub("", tmp.read().decode(errors="replace")).splitlines())


def _cuda_failure_reason(log: list[str], providers: list[str] | None, error: str | None) -> str:
    text = "\n".join(log)
    found = re.search(r"Failed to load library \S+ with error: ([^\n]+)", text)
    if found:
        return found.group(1).strip()
    found = re.search(r"Failed to parse provider option \"\w+\": (?:\S+ operator\(\) )?([^\n]+)", text)
    if found:  # onnxruntime's fallback banner: keep the cause, not its source file and line
        return found.group(1).split(" ; GPU=")[0].strip()
    if error:
        return error.strip().splitlines()[-1][:300]
    errors = [line.split("] ", 1)[-1].strip() for line in log if "[E:onnxruntime" in line]
    if errors:
        return errors[-1][:300]
    return f"onnxruntime created the session with providers {providers}, not CUDAExecutionProvider"


def _preload_cuda_libraries(ort: Any) -> list[str]:
    """Load CUDA and cuDNN from the ``nvidia-*`` pip packages (as PyTorch installs them) before the probe.

    onnxruntime-gpu looks for ``libcublasLt.so.N`` and friends on the loader's path only, so on a machine whose
    CUDA came with ``pip install torch`` the provider fails to load unless torch was imported first.
    ``onnxruntime.preload_dlls`` (onnxruntime 1.21 and later) loads them from those packages; what it prints
    is returned as log lines for the failure reason, never shown. Older onnxruntime: nothing to do.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return []
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            preload()
        except (OSError, RuntimeError) as exc:  # no CUDA anywhere: the probe below says why, in one line
            print(f"preload_dlls: {exc}")
    return printed.getvalue().splitlines()


def cuda_problem(device_id: int = 0) -> str | None:
    """None when onnxruntime really runs a session on CUDA device ``device_id``; otherwise why not, in one line.

    onnxruntime-gpu lists ``CUDAExecutionProvider`` in ``get_available_providers()`` even where it cannot load
    CUDA, so this opens a one-node session and reads the providers it actually uses
    (``session.get_providers()``). onnxruntime's own log lines are captured, not shown. Cached per device.
    """
    if device_id in _CUDA_PROBES:
        return _CUDA_PROBES[device_id]
    import onnxruntime as ort

    problem: str | None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        problem = f"this onnxruntime {ort.__version__} has no CUDA provider (install onnxruntime-gpu)"
    else:
        in_use: list[str] | None = None
        error: str | None = None
        printed = io.StringIO()
        with _captured_stderr() as log, contextlib.redirect_stdout(printed):
            log.extend(_preload_cuda_libraries(ort))
            try:  # onnxruntime prints its own fallback banner ("EP Error ... Falling back") on stdout
                session = make_session(_tiny_model(), cuda_providers(device_id))
                in_use = list(session.get_providers())
            except Exception as exc:  # onnxruntime refuses the provider options (e.g. no such device)
                error = str(exc)
        log.extend(printed.getvalue().splitlines())
        used_cuda = in_use is not None and in_use[:1] == ["CUDAExecutionProvider"]
        problem = None if used_cuda else _cuda_failure_reason(log, in_use, error)
    _CUDA_PROBES[device_id] = problem
    return problem


#: Most CUDA devices one process looks for (a node has at most a few dozen).
_MAX_CUDA_DEVICES = 64


def cuda_device_count() -> int:
    """How many CUDA devices onnxruntime can run a session on in this process (0 when none): device ids are
    probed in order until one fails. ``CUDA_VISIBLE_DEVICES`` is respected, since CUDA numbers what it shows."""
    count = 0
    while count < _MAX_CUDA_DEVICES and cuda_problem(count) is None:
        count += 1
    return count


def cuda_device_for(local_rank: int, device_count: int) -> int:
    """The CUDA ``device_id`` of a rank: its local rank, wrapped round the node's devices. One rank per GPU
    gets its own GPU; more ranks than GPUs (all ranks of the local backend, or ``mpiexec -n 8`` on a 4-GPU
    node) share them round-robin instead of falling back to the CPU. A launcher that gives each rank one GPU
    (``CUDA_VISIBLE_DEVICES=3``, as Slurm's ``--gpus-per-task=1`` does) leaves one device: id 0."""
    return local_rank % device_count


def cuda_providers(device_id: int) -> list[Any]:
    """onnxruntime's providers for CUDA device ``device_id``, with the CPU for the ops CUDA lacks.

    TF32 is off (``use_tf32: 0``; onnxruntime turns it on by default): a float32 MatMul on TF32 differs from
    the model by about 2e-4 relative (measured on an H100), which is a wrong answer for a plan that claims to
    compute the model, and twice `check`'s tolerance."""
    return [("CUDAExecutionProvider", {"device_id": device_id, "use_tf32": 0}), "CPUExecutionProvider"]


def choose_device(device: str, local_rank: int) -> DeviceChoice:
    """``cpu``, ``cuda`` or ``auto``: CUDA device :func:`cuda_device_for` when onnxruntime can use one, else
    the CPU with a note saying why."""
    if device == "cpu":
        return DeviceChoice(["CPUExecutionProvider"])
    if device not in ("cuda", "auto"):
        raise RuntimeBackendError(f"`--device`: expected cpu, cuda or auto, got {device!r}.")
    count = cuda_device_count()
    if count == 0:
        return DeviceChoice(
            ["CPUExecutionProvider"],
            "CPU",
            f"CUDA is not usable by onnxruntime ({cuda_problem(0)}); running on the CPU",
        )
    device_id = cuda_device_for(local_rank, count)
    return DeviceChoice(cuda_providers(device_id), f"CUDA:{device_id}")


def describe_devices(choices: Sequence[DeviceChoice], hosts: Sequence[str] | None = None) -> str:
    """One line saying where every rank runs, e.g. ``ranks run on CUDA:0, CUDA:1 (host a)``."""
    where = []
    for rank, choice in enumerate(choices):
        host = f"@{hosts[rank]}" if hosts and len(set(hosts)) > 1 else ""
        where.append(f"{rank}→{choice.description}{host}")
    if all(not c.cuda for c in choices):
        return f"all {len(choices)} ranks run on the CPU"
    return "ranks run on " + ", ".join(where)


def device_notes(choices: Sequence[DeviceChoice]) -> list[str]:
    """The distinct fallback notes, each once, naming the ranks when not all of them fell back."""
    by_note: dict[str, list[int]] = {}
    for rank, choice in enumerate(choices):
        if choice.note:
            by_note.setdefault(choice.note, []).append(rank)
    out = []
    for note, ranks in by_note.items():
        out.append(note if len(ranks) == len(choices) else f"ranks {ranks}: {note}")
    return out


#: onnxruntime's session option naming the folder of a model's external data when the model comes as bytes.
def _onnx_type_of(dtype: np.dtype) -> int | None:
    """The ONNX element type of an ml_dtypes type (bfloat16, float8), which onnxruntime's numpy bridge lacks."""
    if dtype.type.__module__ != "ml_dtypes":
        return None
    return int(helper.np_dtype_to_tensor_dtype(dtype))


def run_session(session: Any, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """``session.run``, also for bfloat16 and float8 inputs and outputs.

    onnxruntime's Python binding maps numpy types only ("Numpy_type 256 can't be converted", "No corresponding
    Numpy type for Tensor Type. bfloat16"): such inputs go in as OrtValues made from their bytes, such outputs
    come back as their bytes viewed as the ml_dtypes type. Other sessions take the plain path unchanged."""
    wide = {name: _onnx_type_of(np.asarray(v).dtype) for name, v in feeds.items()}
    outputs = {o.name: o.type for o in session.get_outputs()}
    if not any(wide.values()) and not any(_ML_TYPES.get(outputs.get(n, "")) for n in output_names):
        return list(session.run(list(output_names), dict(feeds)))
    import onnxruntime as ort

    values = {}
    for name, value in feeds.items():
        array = np.ascontiguousarray(value)
        kind = wide[name]
        values[name] = (
            ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(f"u{array.dtype.itemsize}"), kind)
            if kind
            else ort.OrtValue.ortvalue_from_numpy(array)
        )
    results = session.run_with_ort_values(list(output_names), values)
    kinds = [_ML_TYPES.get(outputs.get(name, "")) for name in output_names]
    return [_to_numpy(value, kind) for value, kind in zip(results, kinds, strict=True)]


#: onnxruntime's type strings of the ml_dtypes types it may return.
_ML_TYPES = {
    "tensor(bfloat16)": "bfloat16",
    "tensor(float8e4m3fn)": "float8_e4m3fn",
    "tensor(float8e4m3fnuz)": "float8_e4m3fnuz",
    "tensor(float8e5m2)": "float8_e5m2",
    "tensor(float8e5m2fnuz)": "float8_e5m2fnuz",
}


def _to_numpy(value: Any, ml_type: str | None) -> np.ndarray:
    """An OrtValue on the CPU as numpy: its bytes copied and viewed as ``ml_type`` when numpy lacks the type."""
    if ml_type is None:
        return np.asarray(value.numpy())
    import ctypes

    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, ml_type))
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(value.data_ptr()) if count else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(shape)


def run_in_batches(session: Any, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """:func:`run_session`, a chunk of the model's own batch at a time when the feeds hold several
    (:func:`static_batch`), the chunks' outputs joined along dimension 0."""
    chunk = static_batch(session, feeds)
    if chunk is None:
        return run_session(session, output_names, feeds)
    total = next(iter(feeds.values())).shape[0]
    parts = [
        run_session(session, output_names, {n: v[start : start + chunk] for n, v in feeds.items()})
        for start in range(0, total, chunk)
    ]
    return [np.concatenate(outs, axis=0) for outs in zip(*parts, strict=True)]


def static_batch(session: Any, inputs: Mapping[str, np.ndarray]) -> int | None:
    """The model's own batch when the inputs hold several of them: every input's declared dimension 0 is the
    same number b, the inputs' is a multiple B of it, and the other dimensions are the declared ones. A pipeline
    plan made with `--batch B` from a model exported at batch b (its microbatch) takes B samples; the original
    then runs on B / b chunks, each of its own shape, and their outputs are joined along dimension 0 as the
    pipeline joins its microbatches. None: run the inputs as they are."""
    declared = {i.name: i.shape for i in session.get_inputs()}
    firsts = {dims[0] if dims and isinstance(dims[0], int) else None for dims in declared.values()}
    if len(firsts) != 1 or None in firsts or not inputs:
        return None
    (own,) = firsts
    sizes = {np.shape(v)[0] if np.ndim(v) else None for v in inputs.values()}
    (total,) = sizes if len(sizes) == 1 else (None,)
    if own is None or total is None or total == own or total % own:
        return None
    same_rest = all(
        name in declared
        and len(declared[name]) == np.ndim(value)
        and all(not isinstance(d, int) or d == s for d, s in zip(declared[name][1:], np.shape(value)[1:], strict=True))
        for name, value in inputs.items()
    )
    return own if same_rest else None

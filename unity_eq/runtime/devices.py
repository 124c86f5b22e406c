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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from unity_eq.errors import RuntimeBackendError


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
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def make_session(
    model: onnx.ModelProto | bytes | str,
    providers: list[Any],
    threads: int = 0,
    external_folder: Path | None = None,
    prepack: bool = True,
) -> Any:
    """An onnxruntime session of a model (a proto, its bytes or a path). A model given in memory whose
    weights are external data reads them from ``external_folder`` (its files are read by onnxruntime, never
    copied through Python). ``prepack=False`` keeps onnxruntime from copying weights into its packed
    layouts: external weights then stay memory-mapped and unread, for a session that only checks a model
    loads (a 256 MiB device file costs 8 MiB instead of 300)."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # warnings of the process-wide logger (e.g. about plugin EPs) are noise
    options = ort.SessionOptions()
    options.log_severity_level = 4  # errors come back as exceptions; onnxruntime's own log lines are noise
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if external_folder is not None:
        options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_folder))
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    payload = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return ort.InferenceSession(payload, options, providers=providers)

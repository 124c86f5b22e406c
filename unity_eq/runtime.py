"""Running a plan directory, and checking it against the original model.

Every rank runs the same program (SPMD): its ``device_<rank>.onnx`` cut into *segments* at the collectives
(the stage numbers in ``plan.json``), with the collectives done by a :class:`Communicator` between segments.
Backends differ only in the communicator and in where ranks live:

* ``local`` (default): every rank is a thread of this process; collectives exchange numpy arrays in memory.
* ``mpi``: one process per rank under ``mpiexec`` (see ``unity_eq.runtime_mpi``).

Reductions sum the pieces in the order of the ranks of the group, in every backend, so results agree
bit for bit where the reduction order is the same.

Collectives and their reference semantics (``pieces`` are the ranks' arrays in group order, ``i`` is this
rank's index in the group, ``chunk(x, d, k)`` the k-th of n equal contiguous chunks of x along d):

==================  ==========================================  =============================================
collective          result on rank i                            plan.json ``kind`` (fields)
==================  ==========================================  =============================================
all_gather          concat(pieces, dim)                         ``all_gather`` (dim)
all_reduce          pieces[0] + pieces[1] + … (in group order)  ``all_reduce``
reduce_scatter      chunk(all_reduce, dim, i)                   ``reduce_scatter`` (dim)
all_to_all          concat([chunk(p, split_dim, i) for p], cd)  ``all_to_all`` (split_dim, concat_dim)
send / recv         point to point, by tag                      not in plans
==================  ==========================================  =============================================

Plans written today use only ``all_gather`` and ``all_reduce``; the runtime accepts the others.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import helper

from unity_eq.errors import CheckFailed, OptionError, PlanError, RuntimeBackendError, UnityEqError
from unity_eq.files import raise_if_stopped, stop_requested
from unity_eq.planfile import read_plan_json
from unity_eq.progress import Tracker

__all__ = [
    "CheckResult",
    "Communicator",
    "DeviceChoice",
    "InputDraw",
    "LocalCommunicator",
    "PlanDir",
    "RankProgram",
    "check",
    "choose_device",
    "cuda_problem",
    "default_draws",
    "load_plan_dir",
    "make_session",
    "random_inputs",
    "run_plan",
]

COLLECTIVE_TIMEOUT_S = float(os.environ.get("UNITY_EQ_COLLECTIVE_TIMEOUT", "300"))


# ----------------------------------------------------------------------------------------------------------
# Plan directories


@dataclass
class PlanDir:
    path: Path
    meta: dict[str, Any]

    @property
    def world_size(self) -> int:
        return len(self.meta["mesh"]["ranks"])

    def model_path(self, rank: int) -> Path:
        return self.path / self.meta["files"][rank]

    @property
    def input_specs(self) -> dict[str, dict[str, Any]]:
        return self.meta["model"]["inputs"]

    @property
    def output_names(self) -> list[str]:
        return list(self.meta["model"]["outputs"])

    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        for collective in self.meta["collectives"]:
            if collective["axis"] == axis:
                for group in collective["groups"]:
                    if rank in group:
                        return tuple(group)
        raise PlanError(f"{self.path}: rank {rank} is in no group of axis {axis}")


def load_plan_dir(path: str | Path, check_files: bool = True) -> PlanDir:
    """Read and sanity-check a plan directory written by ``unity-eq optimize``.

    ``check_files=False`` skips checking that every rank's ``device_<rank>.onnx`` exists: an MPI rank loads
    (and checks) only its own.
    """
    root = Path(path)
    if not root.exists():
        raise PlanError(f"{root}: plan directory not found. Create one with `unity-eq optimize MODEL -o {root}`.")
    if not root.is_dir():
        raise PlanError(f"{root}: not a directory. Pass the directory written by `unity-eq optimize`.")
    meta_path = root / "plan.json"
    if not meta_path.exists():
        raise PlanError(f"{root}: no plan.json. Pass the directory written by `unity-eq optimize`.")
    meta = read_plan_json(meta_path, need=("collectives",))
    plan = PlanDir(root, meta)
    for rank in range(plan.world_size if check_files else 0):
        check_rank_file(plan, rank)
    return plan


def check_rank_file(plan: PlanDir, rank: int) -> None:
    if not plan.model_path(rank).exists():
        raise PlanError(
            f"{plan.path}: {plan.meta['files'][rank]} (rank {rank}) is missing. Re-run `unity-eq optimize`."
        )


# ----------------------------------------------------------------------------------------------------------
# Sessions


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


# ----------------------------------------------------------------------------------------------------------
# Segments


@dataclass
class Segment:
    inputs: list[str]
    outputs: list[str]
    session: Any = None


@dataclass
class RankProgram:
    """One rank's device graph, cut into segments, with the collectives after each segment."""

    rank: int
    segments: list[Segment]
    collectives_after: list[list[dict[str, Any]]]
    outputs: list[str]
    providers_in_use: list[str] = field(default_factory=list)


def _segment_models(model: onnx.ModelProto, collectives: list[dict[str, Any]]) -> list[onnx.ModelProto | None]:
    """Split a device graph by stage: a node runs in the stage of its latest collective input."""
    graph = model.graph
    stage_of: dict[str, int] = {}
    for c in collectives:
        stage_of[c["dst"]] = c["stage"] + 1
    node_stage: list[int] = []
    for node in graph.node:
        stage = max((stage_of.get(name, 0) for name in node.input if name), default=0)
        node_stage.append(stage)
        for out in node.output:
            if out:
                stage_of[out] = stage
    last = max([*node_stage, *(c["stage"] for c in collectives), 0])
    needed_later: dict[str, int] = {}  # tensor -> latest stage that reads it
    for node, stage in zip(graph.node, node_stage, strict=True):
        for name in node.input:
            if name:
                needed_later[name] = max(needed_later.get(name, -1), stage)
    for c in collectives:  # a collective reads its source right after its stage
        needed_later[c["src"]] = max(needed_later.get(c["src"], -1), c["stage"] + 1)
    model_outputs = {o.name for o in graph.output} - {c["src"] for c in collectives}
    infos = {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    segments: list[onnx.ModelProto | None] = []
    for s in range(last + 1):
        nodes = [n for n, st in zip(graph.node, node_stage, strict=True) if st == s]
        produced = {o for n in nodes for o in n.output if o}
        outputs = [name for name in produced if name in model_outputs or needed_later.get(name, -1) > s]
        consumed = {i for n in nodes for i in n.input if i}
        inputs = sorted(name for name in consumed - produced if name not in initializers)
        inits = [initializers[name] for name in sorted(consumed & set(initializers))]
        if not nodes:
            segments.append(None)
            continue
        missing = [name for name in inputs if name not in infos and name not in graph_inputs]
        if missing:
            raise PlanError(f"device graph {graph.name}: no type recorded for {missing[0]}; re-run `unity-eq optimize`")
        seg_graph = helper.make_graph(
            nodes,
            f"{graph.name}.stage{s}",
            [infos[name] for name in inputs],
            [infos[name] for name in sorted(outputs)],
            initializer=inits,
        )
        segments.append(
            helper.make_model(seg_graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
        )
    return segments


def build_rank_program(plan: PlanDir, rank: int, providers: list[Any], threads: int = 0) -> RankProgram:
    """Load a rank's device model and open one onnxruntime session per segment.

    External weights (``device_<rank>.onnx.data``) are not loaded here: the segments point at them and
    onnxruntime reads them from the plan folder, so no copy of a weight passes through Python."""
    path = plan.model_path(rank)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf/IO errors of a damaged plan file
        raise PlanError(f"{path}: cannot load device model ({exc}). Re-run `unity-eq optimize`.") from None
    check_identity(plan, rank, model, path)
    check_external_data(model, path, plan.meta["plan_hash"], rank)
    collectives = plan.meta["collectives"]
    segment_models = _segment_models(model, collectives)
    segments: list[Segment] = []
    in_use: list[str] = []
    for seg_model in segment_models:
        if seg_model is None:
            segments.append(Segment([], []))
            continue
        try:
            session = make_session(seg_model, providers, threads, external_folder=path.parent)
        except Exception as exc:  # onnxruntime rejects the segment
            raise RuntimeBackendError(f"rank {rank}: onnxruntime cannot load {path.name}: {exc}") from None
        in_use = session.get_providers()
        segments.append(
            Segment([i.name for i in seg_model.graph.input], [o.name for o in seg_model.graph.output], session)
        )
    after: list[list[dict[str, Any]]] = [[] for _ in segments]
    for c in collectives:
        after[c["stage"]].append(c)
    return RankProgram(rank, segments, after, plan.output_names, in_use)


def check_external_data(model: onnx.ModelProto, path: Path, plan_hash: str, rank: int) -> None:
    """Refuse external weights anywhere but the rank's own data file (``device_<rank>.onnx.data`` beside
    it, as ``optimize`` writes them): a plan must not make ``run`` read other files. A missing or short
    data file (a partial copy), or one whose header names another rank or plan (a swapped copy), is refused
    here too, with what to do, before onnxruntime reads it."""
    from onnx import external_data_helper

    from unity_eq.weightfile import read_identity

    own = f"{path.name}.data"
    size: int | None = None
    for tensor in model.graph.initializer:
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = external_data_helper.ExternalDataInfo(tensor)
        if info.location != own:
            raise PlanError(
                f"{path}: weight {tensor.name!r} is stored in {info.location!r}; a device file keeps its weights "
                f"in itself or in {own!r} beside it. Re-run `unity-eq optimize`."
            )
        if size is None:
            if not (path.parent / own).is_file():
                raise PlanError(f"{path}: its weight file {own} is missing. Re-run `unity-eq optimize`.")
            size = (path.parent / own).stat().st_size
            _check_data_identity(path.parent / own, plan_hash, rank, read_identity(path.parent / own))
        end = int(info.offset or 0) + int(info.length or 0)
        if end > size:
            raise PlanError(
                f"{path}: its weight file {own} has {size} bytes, weight {tensor.name!r} needs {end}; the file "
                "is cut short (an incomplete copy?). Copy it again or re-run `unity-eq optimize`."
            )


def _check_data_identity(data: Path, plan_hash: str, rank: int, found: dict[str, str] | None) -> None:
    """Refuse a data file that is not this rank's of this plan (see ``weightfile.identity_header``)."""
    if found is None:
        raise PlanError(
            f"{data}: no unity-eq header; it was not written for this plan. Restore the plan's own file or "
            "re-run `unity-eq optimize`."
        )
    if found.get("plan_hash") != plan_hash:
        raise PlanError(
            f"{data}: holds the weights of another plan (plan hash {found.get('plan_hash', '?')[:12]}…, plan.json "
            f"has {plan_hash[:12]}…). Restore this plan's own file or re-run `unity-eq optimize`."
        )
    if found.get("rank") != str(rank):
        raise PlanError(
            f"{data}: holds the weights of rank {found.get('rank', '?')}, expected rank {rank}. The plan's files "
            "were swapped or renamed; restore them or re-run `unity-eq optimize`."
        )


def check_identity(plan: PlanDir, rank: int, model: onnx.ModelProto, path: Path) -> None:
    """Refuse a device file that belongs to another rank or another plan (its metadata_props, written by
    lowering, name its rank and the plan's hash; see ``unity_eq.lower.identity_props``)."""
    from unity_eq.lower import META_PLAN_HASH, META_RANK

    props = {p.key: p.value for p in model.metadata_props}
    expected_hash = plan.meta.get("plan_hash")
    if not expected_hash:
        raise PlanError(
            f"{plan.path / 'plan.json'}: no plan_hash (an older unity-eq wrote it). Re-run `unity-eq optimize`."
        )
    if META_RANK not in props or META_PLAN_HASH not in props:
        raise PlanError(
            f"{path}: no unity-eq identity in its metadata; it was not written for this plan. "
            "Re-run `unity-eq optimize`."
        )
    if props[META_PLAN_HASH] != expected_hash:
        raise PlanError(
            f"{path}: belongs to another plan (plan hash {props[META_PLAN_HASH][:12]}…, plan.json has "
            f"{expected_hash[:12]}…). Restore this plan's own file or re-run `unity-eq optimize`."
        )
    if props[META_RANK] != str(rank):
        raise PlanError(
            f"{path}: is the device file of rank {props[META_RANK]}, expected rank {rank}. "
            "The plan's files were swapped or renamed; restore them or re-run `unity-eq optimize`."
        )


# ----------------------------------------------------------------------------------------------------------
# Communicators


class Communicator(Protocol):
    """The collectives a rank needs. ``group`` lists the participating ranks (world ranks) in axis order.

    Every backend must return, bit for bit, what the reference functions below compute from the pieces of the
    group in group order (:func:`gather_pieces`, :func:`sum_pieces`, :func:`reduce_scatter_pieces`,
    :func:`all_to_all_pieces`); pieces of one collective have equal shapes and dtypes.
    """

    rank: int

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray: ...

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray: ...

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray: ...

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray: ...

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None: ...

    def recv(self, source: int, tag: int = 0) -> np.ndarray: ...


def gather_pieces(pieces: Sequence[np.ndarray], dim: int) -> np.ndarray:
    return np.concatenate(pieces, axis=dim)


def sum_pieces(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Sum in group order, one addition at a time: the reduction order every backend uses."""
    total = np.array(pieces[0], copy=True)
    for piece in pieces[1:]:
        total += piece
    return total


def split_chunks(array: np.ndarray, parts: int, dim: int) -> list[np.ndarray]:
    """``parts`` equal contiguous chunks along ``dim`` (each a contiguous copy, ready to send)."""
    if array.ndim == 0 or array.shape[dim] % parts:
        raise RuntimeBackendError(
            f"collective: cannot split shape {list(array.shape)} into {parts} equal chunks along dim {dim}"
        )
    return [np.ascontiguousarray(c) for c in np.split(array, parts, axis=dim)]


def reduce_scatter_pieces(pieces: Sequence[np.ndarray], index: int, dim: int) -> np.ndarray:
    """Chunk ``index`` (along ``dim``) of the group-order sum of ``pieces``."""
    return sum_pieces([split_chunks(p, len(pieces), dim)[index] for p in pieces])


def all_to_all_pieces(pieces: Sequence[np.ndarray], index: int, split_dim: int, concat_dim: int) -> np.ndarray:
    """Chunk ``index`` along ``split_dim`` of every piece, concatenated along ``concat_dim`` in group order."""
    return np.concatenate([split_chunks(p, len(pieces), split_dim)[index] for p in pieces], axis=concat_dim)


class _Board:
    """Where rank threads of one process meet for a collective or a message.

    A wait ends when the others arrive, when a rank fails (:meth:`fail`), after ``timeout`` seconds, or at once
    when SIGTERM/SIGINT asked the process to stop (:func:`unity_eq.files.stop_requested`, looked at every
    ``poll`` seconds): an interrupted run never waits out the collective timeout for ranks that will not come."""

    STOPPED = "the run was interrupted"

    def __init__(self, world: int, timeout: float, poll: float = 0.1) -> None:
        self.cond = threading.Condition()
        self.slots: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}
        self.counters = [0] * world
        self.mail: dict[tuple[int, int, int], deque[np.ndarray]] = {}
        self.failure: str | None = None
        self.timeout = timeout
        self.poll = poll

    def fail(self, message: str) -> None:
        """Stop every wait, now and later: the ranks raise ``rank N stopped because MESSAGE``."""
        with self.cond:
            if self.failure is None:
                self.failure = message
            self.cond.notify_all()

    def _stopped(self, rank: int) -> RuntimeBackendError:
        return RuntimeBackendError(f"rank {rank} stopped because {self.failure}")

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """With ``cond`` held: wait until ``ready()`` or a failure (True), or the timeout (False)."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self.failure is None and stop_requested():
                self.failure = self.STOPPED
                self.cond.notify_all()
            if self.failure is not None or ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.cond.wait(min(left, self.poll))

    def exchange(self, rank: int, group: tuple[int, ...], array: np.ndarray) -> list[np.ndarray]:
        with self.cond:
            seq = self.counters[rank]
            self.counters[rank] += 1
            entry = self.slots.setdefault((seq, group), {"pieces": {}, "readers": 0})
            entry["pieces"][rank] = array
            self.cond.notify_all()
            ready = self._wait(lambda: len(entry["pieces"]) == len(group))
            if self.failure is not None:
                raise self._stopped(rank)
            if not ready:
                missing = sorted(set(group) - set(entry["pieces"]))
                raise RuntimeBackendError(f"rank {rank}: collective #{seq} timed out waiting for ranks {missing}")
            pieces = [entry["pieces"][r] for r in group]
            entry["readers"] += 1
            if entry["readers"] == len(group):
                del self.slots[(seq, group)]
            return pieces

    def post(self, source: int, dest: int, tag: int, array: np.ndarray) -> None:
        with self.cond:
            self.mail.setdefault((source, dest, tag), deque()).append(np.array(array, copy=True))
            self.cond.notify_all()

    def take(self, source: int, dest: int, tag: int) -> np.ndarray:
        with self.cond:
            box = self.mail.setdefault((source, dest, tag), deque())
            ready = self._wait(lambda: bool(box))
            if self.failure is not None:
                raise self._stopped(dest)
            if not ready:
                raise RuntimeBackendError(f"rank {dest}: recv (tag {tag}) timed out waiting for rank {source}")
            return box.popleft()


@dataclass
class LocalCommunicator:
    """A rank thread's view of the in-process board."""

    rank: int
    board: _Board

    def _pieces(self, array: np.ndarray, group: Sequence[int]) -> list[np.ndarray]:
        return self.board.exchange(self.rank, tuple(group), array)

    def all_gather(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return gather_pieces(self._pieces(array, group), dim)

    def all_reduce(self, array: np.ndarray, group: Sequence[int]) -> np.ndarray:
        return sum_pieces(self._pieces(array, group))

    def reduce_scatter(self, array: np.ndarray, group: Sequence[int], dim: int) -> np.ndarray:
        return reduce_scatter_pieces(self._pieces(array, group), list(group).index(self.rank), dim)

    def all_to_all(self, array: np.ndarray, group: Sequence[int], split_dim: int, concat_dim: int) -> np.ndarray:
        pieces = self._pieces(array, group)
        return all_to_all_pieces(pieces, list(group).index(self.rank), split_dim, concat_dim)

    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        self.board.post(self.rank, dest, tag, array)

    def recv(self, source: int, tag: int = 0) -> np.ndarray:
        return self.board.take(source, self.rank, tag)


# ----------------------------------------------------------------------------------------------------------
# Execution


@dataclass
class RankTimes:
    segments_s: list[float] = field(default_factory=list)
    collectives_s: float = 0.0


def execute_rank(
    program: RankProgram,
    inputs: Mapping[str, np.ndarray],
    comm: Communicator,
    times: RankTimes | None = None,
    on_stage: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run one rank's segments and collectives; returns the model outputs as this rank holds them.

    ``on_stage(done, total)`` hears each stage (a segment and the collectives after it) finished."""
    env: dict[str, np.ndarray] = dict(inputs)
    stages = len(program.segments)
    for index, (segment, collectives) in enumerate(zip(program.segments, program.collectives_after, strict=True)):
        if segment.session is not None:
            start = time.perf_counter()
            feeds = {name: env[name] for name in segment.inputs}
            values = segment.session.run(segment.outputs, feeds)
            env.update(zip(segment.outputs, values, strict=True))
            if times is not None:
                times.segments_s.append(time.perf_counter() - start)
        for c in collectives:
            start = time.perf_counter()
            env[c["dst"]] = run_collective(comm, c, env[c["src"]], _group_of(c, program.rank))
            if times is not None:
                times.collectives_s += time.perf_counter() - start
        if on_stage is not None:
            on_stage(index + 1, stages)
    return {name: env[name] for name in program.outputs}


def run_collective(comm: Communicator, c: Mapping[str, Any], array: np.ndarray, group: Sequence[int]) -> np.ndarray:
    """Run one collective of plan.json (``kind`` and its fields) through ``comm``."""
    kind = c["kind"]
    if kind == "all_gather":
        return comm.all_gather(array, group, c["dim"])
    if kind == "all_reduce":
        return comm.all_reduce(array, group)
    if kind == "reduce_scatter":
        return comm.reduce_scatter(array, group, c["dim"])
    if kind == "all_to_all":
        return comm.all_to_all(array, group, c["split_dim"], c["concat_dim"])
    raise PlanError(
        f"plan.json: unknown collective kind {kind!r} (collective {c.get('id')}); expected all_gather, all_reduce, "
        "reduce_scatter or all_to_all. Re-run `unity-eq optimize` with this version."
    )


def _group_of(collective: Mapping[str, Any], rank: int) -> tuple[int, ...]:
    for group in collective["groups"]:
        if rank in group:
            return tuple(group)
    raise PlanError(f"rank {rank} is in no group of collective {collective['id']}")


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (model inputs), or an :class:`OptionError` saying what is wrong."""
    if not path.exists():
        raise OptionError(f"{path}: inputs file not found. Pass an .npz file with one array per model input.")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise OptionError(f"{path}: not a readable .npz file ({exc}). Save inputs with numpy.savez.") from None
    if not isinstance(data, np.lib.npyio.NpzFile):  # a .npy file holds one array with no input name
        raise OptionError(
            f"{path}: expected an .npz file with one named array per model input, got a single array (.npy). "
            "Save inputs with numpy.savez(path, NAME=array, ...)."
        )
    try:
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise OptionError(f"{path}: not a readable .npz file ({exc}). Save inputs with numpy.savez.") from None


def check_inputs(plan: PlanDir, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match user inputs to the plan's model inputs by name, shape and dtype."""
    specs = plan.input_specs
    unknown = sorted(set(inputs) - set(specs))
    if unknown:
        raise RuntimeBackendError(f"inputs: unknown input {unknown[0]!r}; the model's inputs are {sorted(specs)}")
    out = {}
    for name, spec in specs.items():
        if name not in inputs:
            raise RuntimeBackendError(f"inputs: missing input {name!r} {spec['dtype']}{spec['shape']}")
        array = np.asarray(inputs[name])
        if list(array.shape) != list(spec["shape"]):
            raise RuntimeBackendError(
                f"inputs: {name!r} has shape {list(array.shape)}, the plan was made for {spec['shape']}. "
                "Re-run `unity-eq optimize` with `--input-shape`."
            )
        out[name] = array.astype(spec["dtype"], copy=False)
    return out


def run_plan(
    plan_dir: str | Path | PlanDir,
    inputs: Mapping[str, np.ndarray],
    backend: str = "local",
    device: str = "cpu",
    on_note: Callable[[str], None] | None = None,
    timeout: float | None = None,
    tracker: Tracker | None = None,
) -> dict[str, np.ndarray]:
    """Run every rank of a plan in this process (``local`` backend) and return rank 0's outputs.

    All ranks must agree on every (replicated) output; a disagreement is an error, not a silent choice.
    ``timeout`` bounds the wait of one collective (default ``UNITY_EQ_COLLECTIVE_TIMEOUT``, 300 s).
    ``tracker`` (unity_eq.progress) hears the device files loaded and rank 0's stages run (row ``run``).
    """
    tracker = tracker or Tracker()
    plan = plan_dir if isinstance(plan_dir, PlanDir) else load_plan_dir(plan_dir)
    if backend != "local":
        raise RuntimeBackendError(f"backend: `run_plan` runs the local backend; got {backend!r}")
    feeds = check_inputs(plan, inputs)
    world = plan.world_size
    threads = threads_per_rank(world)
    choices = [choose_device(device, rank) for rank in range(world)]
    if on_note:
        for note in device_notes(choices):
            on_note(note)
        if any(c.cuda for c in choices):
            on_note(describe_devices(choices))
    tracker.start("run", f"loading {world} device files")
    programs = []
    for rank in range(world):
        programs.append(build_rank_program(plan, rank, choices[rank].providers, threads))
        tracker.count("run", rank + 1, world, "device files loaded")

    def stage(done: int, total: int) -> None:
        tracker.count("run", done, total, "stages run (rank 0)")

    outputs = execute_local(programs, feeds, timeout, stage)
    tracker.finish("run", f"{world} ranks run")
    return outputs


def execute_local(
    programs: Sequence[RankProgram],
    feeds: Mapping[str, np.ndarray],
    timeout: float | None = None,
    on_stage: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run loaded rank programs once, one thread per rank (``check`` runs the same programs on many inputs).

    ``on_stage(done, total)`` hears rank 0's stages: the ranks wait for each other in every collective, so
    rank 0's progress is the run's."""
    world = len(programs)
    board = _Board(world, COLLECTIVE_TIMEOUT_S if timeout is None else timeout)
    results: list[dict[str, np.ndarray] | None] = [None] * world
    errors: list[BaseException | None] = [None] * world

    def work(rank: int) -> None:
        if board.failure is not None:  # interrupted before this rank started
            return
        try:
            progress = on_stage if rank == 0 else None
            results[rank] = execute_rank(programs[rank], feeds, LocalCommunicator(rank, board), on_stage=progress)
        except BaseException as exc:  # recorded and re-raised in the caller's thread
            errors[rank] = exc
            board.fail(f"rank {rank} failed: {exc}")

    # SIGTERM/SIGINT raise in this (the main) thread, possibly before every rank started: the board is failed,
    # so the ranks that did start stop at their next collective instead of waiting out the timeout for the
    # others, and those that start late do nothing (the interpreter's exit joins them).
    workers = [threading.Thread(target=work, args=(r,), name=f"unity-eq-rank{r}") for r in range(world)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    except BaseException:
        board.fail(_Board.STOPPED)
        raise
    raise_if_stopped()  # a stop seen by the ranks (this function run outside the main thread)
    first = next((e for e in errors if e is not None and not _is_secondary(e)), None) or next(
        (e for e in errors if e is not None), None
    )
    if first is not None:
        if isinstance(first, UnityEqError):
            raise first
        rank = errors.index(first)
        raise RuntimeBackendError(f"rank {rank} failed: {type(first).__name__}: {first}") from first
    outputs = results[0]
    assert outputs is not None
    for rank in range(1, world):
        other = results[rank]
        assert other is not None
        for name, value in outputs.items():
            if not np.array_equal(value, other[name], equal_nan=True):
                raise RuntimeBackendError(f"output {name!r} differs between rank 0 and rank {rank}")
    return outputs


def _is_secondary(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeBackendError) and "stopped because" in str(exc)


# ----------------------------------------------------------------------------------------------------------
# Checking a plan against the original model


@dataclass(frozen=True)
class InputDraw:
    """One set of random inputs for ``check``: how float inputs are drawn, and the seed.

    ``normal``: N(0, scale²); ``uniform``: U(−scale, scale); ``integers``: whole numbers in [−scale, scale]
    (exact in float, so a plan that loses or adds a term shows as an exact error). Integer inputs always take
    values in the ranges that keep the model valid (:mod:`unity_eq.input_ranges`); booleans are fair coins.
    """

    kind: str
    scale: float
    seed: int

    def describe(self) -> str:
        what = {"normal": f"normal σ={self.scale:g}", "uniform": f"uniform ±{self.scale:g}"}
        return f"{what.get(self.kind, f'integers ±{self.scale:g}')}, seed {self.seed}"


def default_draws(seed: int = 0) -> list[InputDraw]:
    """What ``check`` tries by default: several seeds at unit scale, large scales (a rank that clips or
    saturates large values fails), a wide uniform and integer values."""
    return [
        InputDraw("normal", 1.0, seed),
        InputDraw("normal", 1.0, seed + 1),
        InputDraw("normal", 10.0, seed + 2),
        InputDraw("normal", 1000.0, seed + 3),
        InputDraw("uniform", 100.0, seed + 4),
        InputDraw("integers", 8.0, seed + 5),
    ]


def random_inputs(
    specs: Mapping[str, Mapping[str, Any]],
    seed: int = 0,
    int_bounds: Mapping[str, int] | None = None,
    draw: InputDraw | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, np.ndarray]:
    """Deterministic random inputs: floats as ``draw`` says (default N(0, 1) with ``seed``), integers in
    ``int_ranges`` (inclusive) or [0, ``int_bounds``) or [0, 10), booleans.

    ``draw``'s seed replaces ``seed`` when given."""
    draw = draw or InputDraw("normal", 1.0, seed)
    rng = np.random.default_rng(draw.seed)
    out = {}
    for name, spec in specs.items():
        shape, dtype = tuple(spec["shape"]), np.dtype(spec["dtype"])
        if dtype.kind == "f":
            out[name] = _floats(rng, draw, shape).astype(dtype)
        elif dtype.kind in "iu":
            low, high = (int_ranges or {}).get(name, (0, max((int_bounds or {}).get(name, 10), 1) - 1))
            out[name] = rng.integers(low, high, size=shape, endpoint=True).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        else:
            raise RuntimeBackendError(
                f"inputs: cannot make random values of dtype {dtype} for {name!r}; pass `--inputs`"
            )
    return out


def _floats(rng: np.random.Generator, draw: InputDraw, shape: tuple[int, ...]) -> np.ndarray:
    if draw.kind == "normal":
        return rng.standard_normal(shape) * draw.scale
    if draw.kind == "uniform":
        return rng.uniform(-draw.scale, draw.scale, shape)
    if draw.kind == "integers":
        return rng.integers(-int(draw.scale), int(draw.scale), size=shape, endpoint=True).astype(np.float64)
    raise OptionError(f"input draw: expected normal, uniform or integers, got {draw.kind!r}")


@dataclass
class OutputComparison:
    name: str
    passed: bool
    max_abs_error: float
    relative_error: float
    index: tuple[int, ...]
    expected: float
    got: float
    inputs: str = ""  # which inputs gave this (the worst) error


@dataclass
class CheckResult:
    """The worst error of every output of the original model over every set of inputs tried."""

    outputs: list[OutputComparison]
    tolerance: float
    draws: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def worst(self) -> OutputComparison:
        return max(self.outputs, key=lambda o: (not o.passed, o.relative_error))

    def describe(self) -> str:
        w = self.worst
        verdict = "match" if self.passed else "MISMATCH"
        tried = f" over {len(self.draws)} input sets" if len(self.draws) > 1 else ""
        where = f" ({w.inputs})" if w.inputs else ""
        return (
            f"{verdict}: {len(self.outputs)} output(s){tried}; worst {w.name!r} relative error "
            f"{w.relative_error:.2e} (tolerance {self.tolerance:g}){where}, max abs error {w.max_abs_error:.3g} "
            f"at {list(w.index)}: expected {w.expected:.6g}, got {w.got:.6g}"
        )


def compare_outputs(
    expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tolerance: float = 1e-4
) -> CheckResult:
    """Relative error of each output: max |a − b| / max |a|. Integers and booleans must match exactly;
    equal values (infinities included) and NaN against NaN count as equal."""
    results = []
    for name, ref in expected.items():
        ref = np.asarray(ref)
        out = np.asarray(got[name])
        if ref.shape != out.shape:
            results.append(OutputComparison(name, False, float("inf"), float("inf"), (), float("nan"), float("nan")))
            continue
        if ref.size == 0:
            results.append(OutputComparison(name, True, 0.0, 0.0, (), 0.0, 0.0))
            continue
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
        same = (ref == out) | (np.isnan(ref) & np.isnan(out)) if ref.dtype.kind == "f" else ref == out
        diff = np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))
        index = np.unravel_index(int(np.argmax(diff)), ref.shape)
        max_abs = float(diff[index])
        finite = np.isfinite(ref) if ref.dtype.kind == "f" else np.ones(ref.shape, bool)
        scale = float(np.max(np.abs(ref[finite]))) if finite.any() else 1.0
        relative = max_abs / max(scale, 1e-30)
        exact = ref.dtype.kind in "iub"
        passed = max_abs == 0.0 if exact else relative <= _tolerance_for(ref.dtype, tolerance)
        results.append(
            OutputComparison(
                name,
                passed,
                max_abs,
                relative,
                tuple(int(i) for i in index),
                float(ref[index]),
                float(out[index]),
            )
        )
    return CheckResult(results, tolerance)


def _tolerance_for(dtype: np.dtype, tolerance: float) -> float:
    return max(tolerance, 1e-2) if dtype.itemsize <= 2 else tolerance


def _original_session(model_path: str | Path) -> Any:
    try:
        return make_session(str(model_path), ["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime refuses the model
        raise RuntimeBackendError(
            f"{model_path}: onnxruntime cannot load the original model: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else type(exc).__name__


def _run_original(
    session: Any, model_path: str | Path, inputs: Mapping[str, np.ndarray], output_names: list[str], what: str
) -> dict[str, np.ndarray]:
    try:
        values = session.run(output_names, dict(inputs))
    except Exception as exc:  # the original model fails on these inputs: a problem of the inputs, not the plan
        raise RuntimeBackendError(
            f"{model_path}: the original model fails on {what}: {_first_line(exc)}. Pass valid inputs with `--inputs`."
        ) from None
    return dict(zip(output_names, values, strict=True))


def run_original(
    model_path: str | Path, inputs: Mapping[str, np.ndarray], output_names: list[str]
) -> dict[str, np.ndarray]:
    """The reference: the original model in onnxruntime on the CPU."""
    return _run_original(_original_session(model_path), model_path, inputs, output_names, "the inputs given")


def check(
    model_path: str | Path,
    plan_dir: str | Path,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    tolerance: float = 1e-4,
    device: str = "cpu",
    draws: Sequence[InputDraw] | None = None,
    on_progress: Callable[[str], None] | None = None,
    tracker: Tracker | None = None,
) -> CheckResult:
    """Run the original model and the plan on the same inputs and compare every output.

    Without ``inputs``, every draw of ``draws`` (default :func:`default_draws` from ``seed``) is tried and the
    worst error of each output is kept. Raises :class:`RuntimeBackendError` (exit 2) when the original model
    fails on the inputs, and :class:`CheckFailed` (exit 1) when the plan fails to run on inputs the original
    accepts. ``on_progress`` hears a line per input set; ``tracker`` (unity_eq.progress) counts them (row
    ``check``)."""
    tracker = tracker or Tracker()
    plan = load_plan_dir(plan_dir)
    check_plan_is_of(model_path, plan)
    trials: list[tuple[str, Callable[[], dict[str, np.ndarray]]]]
    if inputs is not None:
        given = check_inputs(plan, inputs)
        trials = [("the inputs given", lambda: given)]
    else:
        ranges = default_int_ranges(model_path, plan)
        trials = [(d.describe(), _drawer(plan, d, ranges)) for d in (draws or default_draws(seed))]
    if on_progress:
        on_progress(f"running the original model on {len(trials)} set(s) of inputs")
    expected_by_trial = _expected_outputs(model_path, plan.output_names, trials)
    world = plan.world_size
    choices = [choose_device(device, rank) for rank in range(world)]
    programs = [build_rank_program(plan, r, choices[r].providers, threads_per_rank(world)) for r in range(world)]
    worst: dict[str, OutputComparison] = {}
    tracker.start("check", f"{len(trials)} input set(s) on {world} rank(s)")
    for done, ((what, make), expected) in enumerate(zip(trials, expected_by_trial, strict=True)):
        if on_progress:
            on_progress(f"checking on {what}")
        tracker.update("check", f"{done} of {len(trials)} input sets checked; now {what}")
        feeds = make()
        try:
            got = execute_local(programs, feeds)
        except RuntimeBackendError as exc:
            raise CheckFailed(f"{plan.path}: the plan fails on {what}, where the original model runs: {exc}") from None
        for o in compare_outputs(expected, got, tolerance).outputs:
            o.inputs = what
            old = worst.get(o.name)
            if old is None or (not o.passed, o.relative_error) > (not old.passed, old.relative_error):
                worst[o.name] = o
    tracker.finish("check", f"{len(trials)} input set(s) checked")
    return CheckResult([worst[name] for name in plan.output_names], tolerance, [what for what, _ in trials])


def check_plan_is_of(model_path: str | Path, plan: PlanDir) -> None:
    """Refuse (exit 2) a model the plan was not made from: plan.json's ``model.fingerprint`` (what the model
    computes, weights' values aside) differs from the file's. Plans written before the fingerprint: no check."""
    recorded = plan.meta["model"].get("fingerprint")
    if not recorded:
        return
    from unity_eq.frontends.onnx import file_fingerprint

    if file_fingerprint(model_path) != recorded:
        made_from = plan.meta["model"].get("source") or plan.meta["model"].get("name")
        raise PlanError(
            f"{model_path}: is not the model {plan.path} was made from ({made_from}: other nodes, inputs or "
            "weight shapes). Pass that model, or run `unity-eq optimize` on this one."
        )


def _expected_outputs(
    model_path: str | Path, output_names: list[str], trials: Sequence[tuple[str, Callable[[], dict[str, np.ndarray]]]]
) -> list[dict[str, np.ndarray]]:
    """The original model's outputs on every trial's inputs. Its session is closed before the plan's ranks
    load, so ``check`` holds the model's weights once (the original's, then the plan's), not twice; only
    the outputs are kept, and each trial's inputs are made again (deterministically) for the plan."""
    original = _original_session(model_path)
    expected = [_run_original(original, model_path, make(), output_names, what) for what, make in trials]
    del original
    return expected


def _drawer(
    plan: PlanDir, draw: InputDraw, ranges: Mapping[str, tuple[int, int]]
) -> Callable[[], dict[str, np.ndarray]]:
    """Inputs of one draw, made when needed (one draw's inputs in memory at a time)."""
    return lambda: check_inputs(plan, random_inputs(plan.input_specs, draw=draw, int_ranges=ranges))


def default_int_ranges(model_path: str | Path, plan: PlanDir) -> dict[str, tuple[int, int]]:
    """Integer ranges that keep the original model valid (see :mod:`unity_eq.input_ranges`)."""
    specs = plan.input_specs
    if not any(np.dtype(spec["dtype"]).kind in "iu" for spec in specs.values()):
        return {}
    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.input_ranges import integer_input_ranges

    graph = load_onnx(model_path, {name: tuple(spec["shape"]) for name, spec in specs.items()})
    return integer_input_ranges(graph, str(model_path))


def assert_check(result: CheckResult) -> None:
    if not result.passed:
        raise CheckFailed(result.describe())

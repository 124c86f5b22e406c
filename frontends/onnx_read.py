"""Reading an ONNX file (step 1 of :mod:`unity_eq.frontends.onnx`): every way the file can be wrong becomes a
one-line :class:`~unity_eq.errors.ModelError`; external data is checked to lie in the model's folder and is
memory-mapped, or, where its bytes are absent, stands in as shape-only arrays that planning can use and lowering
refuses; and the fingerprint of what a model computes, which plans record.

Separate from normalizing and folding because it touches the file system and protobuf parsing only; later
steps work on the parsed model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from unity_eq.errors import ModelError

__all__ = ["ReadModel", "file_fingerprint", "model_fingerprint", "one_line", "read_model", "shape_only"]


def model_fingerprint(model: onnx.ModelProto) -> str:
    """A hash of what a model computes apart from its weights' values: every node (op, domain, inputs,
    outputs, attributes), the graph's inputs and outputs, and each initializer's name, dtype and dims.

    A plan records it, so `check` can tell a model the plan was not made from (exit 2) from a wrong plan
    (exit 1): two models with the same input and output shapes otherwise just "mismatch". Weight values are
    left out: they need not be read (external data), and new weights are a real mismatch to report."""
    digest = hashlib.sha256()

    def feed(*parts: bytes | str) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)

    graph = model.graph
    for node in graph.node:
        feed("node", node.op_type, node.domain, *node.input, "->", *node.output)
        for attr in node.attribute:
            feed(attr.SerializeToString(deterministic=True))
    for value in (*graph.input, *graph.output):
        feed("io", value.name, value.type.SerializeToString(deterministic=True))
    for tensor in graph.initializer:
        feed("init", tensor.name, str(tensor.data_type), ",".join(map(str, tensor.dims)))
    return digest.hexdigest()


@dataclass
class ReadModel:
    """A parsed model and its weights that live outside the proto.

    ``external`` holds the external tensors, memory-mapped where their bytes are on disk. ``missing`` names
    each external tensor whose bytes are not there (no data file, a file cut short, a model passed in memory
    without its data) and why: its entry in ``external`` is a shape-only array (:func:`shape_only`), enough to
    plan the model but never to lower it.
    """

    model: onnx.ModelProto
    external: dict[str, np.ndarray]
    missing: dict[str, str] = field(default_factory=dict)


def read_model(source: Path | onnx.ModelProto, where: str) -> ReadModel:
    """Parse the file (or check an in-memory ModelProto) and map its external data, turning each failure into
    a ModelError. External data that is absent is not an error here: planning needs only dtypes and shapes."""
    if isinstance(source, onnx.ModelProto):
        _check_parsed(source, where)
        return ReadModel(source, *_shape_only_external(source, "the model was passed in memory without it"))
    model = _parse_model(source, where)
    _check_external_locations(model, source.parent, where)
    uses_external = any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    external, missing = _map_external_data(model, source, where) if uses_external else ({}, {})
    return ReadModel(model, external, missing)


def shape_only(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array with a weight's dtype and shape that holds no memory (every stride 0, one zero element
    behind it): what the planner reads of a weight whose bytes are absent. Read-only, so nothing writes
    through it."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def _shape_only_external(model: onnx.ModelProto, why: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A shape-only array for every initializer stored outside the proto, each missing for ``why``."""
    external: dict[str, np.ndarray] = {}
    missing: dict[str, str] = {}
    for t in model.graph.initializer:
        if external_data_helper.uses_external_data(t):
            external[t.name] = shape_only(_np_dtype(t), tuple(int(d) for d in t.dims))
            missing[t.name] = why
    return external, missing


def file_fingerprint(path: str | Path) -> str:
    """:func:`model_fingerprint` of an ONNX file, its external data left unread. Raises ModelError."""
    return model_fingerprint(_parse_model(Path(path), str(path)))


def _parse_model(path: Path, where: str) -> onnx.ModelProto:
    """The file's ModelProto without its external data; each failure a ModelError."""
    if not path.exists():
        raise ModelError(f"{where}: no such file. Check the path.")
    if path.is_dir():
        raise ModelError(f"{where}: is a directory, expected an .onnx file. Pass the model file inside it.")
    try:
        with path.open("rb") as f:
            empty = not f.read(1)
        if not empty:
            model = onnx.load(path, load_external_data=False)
    except OSError as e:
        raise ModelError(f"{where}: cannot read the file ({e.strerror}). Check its permissions.") from e
    except Exception as e:  # protobuf/text parsers raise several unrelated types; all mean "not ONNX"
        raise ModelError(
            f"{where}: not an ONNX model ({one_line(e)}). Pass a model saved with `onnx.save` or an exporter."
        ) from e
    if empty:
        raise ModelError(f"{where}: the file is empty, expected an ONNX model. Re-export the model.")
    _check_parsed(model, where)
    return model


def _check_parsed(model: onnx.ModelProto, where: str) -> None:
    """Refuse a proto that parsed but holds no model (a file of another protobuf message, an empty proto)."""
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"{where}: not an ONNX model (no graph or opset found). Pass a model saved with `onnx.save`.")


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor a graph stores: initializers, sparse initializers, and node attributes, subgraphs too."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for sub in attr.graphs:
                yield from _all_tensors(sub)


def _check_external_locations(model: onnx.ModelProto, base: Path, where: str) -> None:
    """Refuse external data that lies outside the model's folder, as onnx and onnxruntime do.

    A location is a path relative to the model's folder; an absolute path, a ``..`` that climbs out, or a
    symlink that resolves outside would let a model file make unity-eq read (and copy into a plan) any file
    the user can read.
    """
    root = base.resolve()
    for t in _all_tensors(model.graph):
        if not external_data_helper.uses_external_data(t):
            continue
        location = _external_info(t, where).location
        resolved = (root / location).resolve()
        if Path(location).is_absolute() or not location or not resolved.is_relative_to(root):
            raise ModelError(
                f"{where}: external tensor {t.name!r} points outside the model's folder ({location!r} is "
                f"{resolved}, not inside {root}). External data must be a relative path inside the model's "
                "folder; move the weight file next to the model and re-save it."
            )


def _external_info(t: onnx.TensorProto, where: str) -> external_data_helper.ExternalDataInfo:
    """The tensor's external data entry (location, offset, length), or a ModelError when it is malformed
    (onnx raises a bare ValueError for an offset or length that is not an integer)."""
    try:
        return external_data_helper.ExternalDataInfo(t)
    except ValueError as exc:
        entries = {e.key: e.value for e in t.external_data}
        raise ModelError(
            f"{where}: external tensor {t.name!r} has a malformed external data entry {entries} ({exc}): offset and "
            "length must be whole numbers of bytes. Re-save the model with onnx."
        ) from None


_PACKED_TYPES = frozenset(
    getattr(onnx.TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")
    if hasattr(onnx.TensorProto, name)
)
"""Element types ONNX packs several to a byte, so their bytes are not a numpy array: loaded through onnx.
Every other type is stored as numpy (with ml_dtypes for bfloat16 and the float8 types) lays it out, little
endian, so its external data is memory-mapped: a bfloat16 model is never read into memory to be planned."""


def _np_dtype(t: onnx.TensorProto) -> np.dtype:
    """The numpy dtype of a tensor's elements (ml_dtypes' for bfloat16, float8 and the packed types)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))


def _map_external_data(model: onnx.ModelProto, path: Path, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Memory-map tensors stored in separate files (relative to the model's directory), read-only; a tensor
    whose file is absent, or whose bytes lie past its end, becomes a shape-only array and is named, with the
    reason, in the second dict.

    Optimizing only reads shapes, and lowering reads each rank's slice, so weights are never loaded whole.
    Types packed several to a byte (4-bit, 2-bit) are loaded through onnx instead.
    """
    base = path.parent
    mapped: dict[str, np.ndarray] = {}
    missing: dict[str, str] = {}
    for t in model.graph.initializer:
        if not external_data_helper.uses_external_data(t):
            continue
        info = _external_info(t, where)
        file = base / info.location
        dtype = _np_dtype(t)
        shape = tuple(int(d) for d in t.dims)
        if not file.is_file():
            mapped[t.name] = shape_only(dtype, shape)
            missing[t.name] = f"external data file {info.location!r} not found in '{base}'"
            continue
        count = int(np.prod(shape, dtype=np.int64))
        offset = int(info.offset or 0)
        if t.data_type in _PACKED_TYPES:
            mapped[t.name] = _load_one_external(t, base, where)
            continue
        if info.length is not None and int(info.length) != count * dtype.itemsize:
            raise ModelError(
                f"{where}: external tensor {t.name!r} has {info.length} bytes, expected "
                f"{count * dtype.itemsize} for {dtype}{list(shape)}. Re-save the model."
            )
        size = file.stat().st_size
        if offset + count * dtype.itemsize > size:
            mapped[t.name] = shape_only(dtype, shape)
            missing[t.name] = f"its bytes lie past the end of {info.location!r} ({size} bytes)"
            continue
        mapped[t.name] = np.memmap(file, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=shape)
    return mapped, missing


def _load_one_external(t: onnx.TensorProto, base: Path, where: str) -> np.ndarray:
    try:
        external_data_helper.load_external_data_for_tensor(t, str(base))
        return numpy_helper.to_array(t)
    except Exception as e:  # onnx raises ValidationError, OSError or ValueError for bad locations/offsets
        raise ModelError(f"{where}: cannot load external data ({one_line(e)}). Re-save the model.") from e


def one_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message collapsed to one line, so CLI errors stay one line."""
    text = " ".join(str(error).split()).rstrip(".") or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"

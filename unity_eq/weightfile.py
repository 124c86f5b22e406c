"""Weights streamed to and from disk, one tensor at a time, so that memory never holds a model's weights.

* **Reading**: the frontend memory-maps external weights (``numpy.memmap``), and lowering slices views of
  them. Pages a process has read stay in its resident set as long as the mapping lives, so once a tensor
  is consumed :func:`release_pages` gives its pages back (the data stays in the OS page cache; a later read
  maps it again). Without that, hashing and slicing a 1 GiB model leaves 1 GiB resident.
* **Writing**: :class:`ExternalWeights` appends each tensor to a device's ``.onnx.data`` file as soon as it
  is computed and returns a ``TensorProto`` that only points at it, so the device model written next holds
  no weight bytes.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "ALIGN_BYTES",
    "EMBED_BYTES",
    "IDENTITY_BYTES",
    "Deferred",
    "ExternalWeights",
    "embedded",
    "identity_header",
    "read_identity",
    "release_pages",
    "value_of",
]

#: Tensors smaller than this stay inside the model file (as ``onnx.save_model`` does by default).
EMBED_BYTES = 1024
#: Tensors of 1 MiB and more start at a multiple of 64 KiB in the data file, so onnxruntime can map them
#: (64 KiB is the allocation granularity on Windows; a multiple of the page size everywhere).
ALIGN_BYTES = 1 << 16
_ALIGN_FROM_BYTES = 1 << 20


#: metadata_props keys of every device file (``run`` refuses a file whose identity is not the plan's).
META_RANK = "unity_eq.rank"
META_PLAN_HASH = "unity_eq.plan_hash"
META_COORDS = "unity_eq.mesh_coords"
META_MESH = "unity_eq.mesh"
META_COLLECTIVES = "unity_eq.collectives"
#: initializer name -> the plan tensor whose piece it holds, for every initializer made from the model's
#: weights: ``check`` recomputes each from the source model and compares the bytes
META_WEIGHTS = "unity_eq.weights"


@dataclass(frozen=True)
class Deferred:
    """A constant that lowering computes from weights only when it writes it: a ``Concat`` of weights is a
    copy, and a rank may hold many (fused q, k, v projections in every layer), so it is made when written,
    one at a time, instead of held for the whole rank."""

    shape: tuple[int, ...]
    dtype: np.dtype
    make: Callable[[], np.ndarray]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def value_of(value: np.ndarray | Deferred) -> np.ndarray:
    """The array itself, or the deferred one made now."""
    return value.make() if isinstance(value, Deferred) else value


def _read_only_mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The memory map that ``array`` (or the array it is a view of) lives in, when a ``numpy.memmap`` opened
    it read-only (as the frontend does); None otherwise. Only those are safe to drop pages of: dropping
    pages of a copy-on-write map (``mode="c"``) would lose the changes made to it."""
    base: object = array
    read_only = False
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            if base.mode != "r":
                return None
            read_only = True
        base = base.base
    return base if read_only and isinstance(base, mmap.mmap) else None


def release_pages(array: np.ndarray) -> None:
    """Drop the resident pages of the read-only file mapping ``array`` is a view of; no-op for other
    arrays and where ``madvise`` is missing. Safe because the mapping is read-only and backed by a file:
    the next read faults the same bytes back in from the page cache."""
    mapping = _read_only_mapping_of(array)
    if mapping is None or not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    if not mapping.closed:
        mapping.madvise(mmap.MADV_DONTNEED)


def _little_endian(array: np.ndarray) -> np.ndarray:
    """``array`` C-contiguous and little-endian (ONNX's byte order); copies only when it is not already."""
    array = np.asarray(array)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and np.little_endian is False):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.flags.c_contiguous else array.copy(order="C")


def embedded(name: str, array: np.ndarray) -> TensorProto:
    """A tensor stored inside the model file."""
    return numpy_helper.from_array(_little_endian(array), name)


class ExternalWeights:
    """Appends tensors to one external data file; :meth:`add` returns the ``TensorProto`` that points at
    the bytes just written (location relative to the model's folder, as ONNX requires)."""

    def __init__(self, path: Path, header: bytes = b"") -> None:
        self.path = path
        self.location = path.name
        self._file: BinaryIO = path.open("wb")
        self._file.write(header)
        self.bytes_written = len(header)

    def __enter__(self) -> ExternalWeights:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if not self._file.closed:
            self._file.truncate(self.bytes_written)  # no trailing alignment padding
            self._file.close()

    def add(self, name: str, array: np.ndarray) -> TensorProto:
        """Write ``array`` now (one copy at most: a non-contiguous slice is made contiguous) and return its
        reference; small, string and empty tensors are embedded instead."""
        array = np.asarray(array)
        if array.dtype.kind == "O" or array.nbytes < EMBED_BYTES:
            return embedded(name, array)
        if not _plain(array.dtype):  # bfloat16, float8, 4-bit: ONNX's layout is onnx's to make
            return self._add_through_onnx(name, array)
        data = _little_endian(array)
        offset = self._write(data.reshape(-1).view(np.uint8))
        del data
        release_pages(array)
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        return self._point(tensor, offset, array.nbytes)

    def _add_through_onnx(self, name: str, array: np.ndarray) -> TensorProto:
        tensor = numpy_helper.from_array(array, name)
        raw = np.frombuffer(tensor.raw_data, dtype=np.uint8)
        offset = self._write(raw)
        tensor.ClearField("raw_data")
        release_pages(array)
        return self._point(tensor, offset, raw.nbytes)

    def _write(self, raw: np.ndarray) -> int:
        """Append bytes (aligned when large); returns their offset."""
        offset = self.bytes_written
        if raw.nbytes >= _ALIGN_FROM_BYTES:
            offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
        self._file.seek(offset)
        self._file.write(raw.data)
        self.bytes_written = offset + raw.nbytes
        return offset

    def _point(self, tensor: TensorProto, offset: int, length: int) -> TensorProto:
        """Make ``tensor`` (without data) point at ``length`` bytes at ``offset`` of this file. (onnx's
        ``set_external_data`` wants the bytes in the proto first: the copy this module avoids.)"""
        del tensor.external_data[:]
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = TensorProto.EXTERNAL
        return tensor


IDENTITY_BYTES = 128


def identity_header(plan_hash: str, rank: int) -> bytes:
    """The first :data:`IDENTITY_BYTES` of a device's data file: which plan and rank its weights are for.

    A device file's metadata names its rank and plan, but its weights live in another file: a data file
    copied from another rank or another plan of the same size would otherwise load and compute garbage. No
    tensor points at these bytes (ONNX offsets are absolute), so onnx and onnxruntime ignore them."""
    text = f"unity-eq weights\nplan_hash={plan_hash}\nrank={rank}\n".encode()
    if len(text) > IDENTITY_BYTES:
        raise ValueError(f"plan hash too long for the data file's header: {plan_hash!r}")
    return text.ljust(IDENTITY_BYTES, b"\0")


def read_identity(path: Path) -> dict[str, str] | None:
    """The ``plan_hash`` and ``rank`` a data file's header names, or None when it has no header."""
    with path.open("rb") as f:
        head = f.read(IDENTITY_BYTES)
    lines = head.rstrip(b"\0").decode("utf-8", errors="replace").splitlines()
    if not lines or lines[0] != "unity-eq weights":
        return None
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def _plain(dtype: np.dtype) -> bool:
    """numpy's own numeric and boolean types: their bytes are ONNX's raw_data as they are."""
    return dtype.kind in "biufc" and dtype.type.__module__ == "numpy"

"""ONNX frontend: read a model file into a :class:`unity_eq.ir.Graph` with static shapes.

Later stages reason about shapes (divisibility guards, roofline costs), so this module's job is to hand them a
graph in which every tensor has a fixed shape and dtype and that uses a small, regular op set. The steps:

1. read the file (every way it can be wrong becomes a one-line :class:`~unity_eq.errors.ModelError`),
   load external data, run ``onnx.checker``;
2. normalize: IR version >= 7, local functions inlined, default-domain opset upgraded to at least 18;
3. split weights (initializers, also IR 3's graph inputs that have one) from model inputs and fix the model
   inputs' shapes (``input_shapes`` overrides; a dynamic dim without one is a
   :class:`~unity_eq.errors.DynamicShapeError`);
4. to a fixpoint: canonicalize (``Dropout`` → ``Identity``, ``Sum`` → ``Add`` chain), infer shapes, fold
   constant subgraphs (``Constant``, ``Shape`` of static tensors, ``ConstantOfShape``, anything deterministic
   whose inputs are all constants) into initializers;
5. drop what no output needs, sort, name every node, and build the Graph.

Weights never go through protobuf again after step 1: they live in a dict of numpy arrays, and the model
handed to onnx's shape inference and version converter carries only the small ones (the large ones become
typed graph inputs). That keeps models over protobuf's 2 GB limit working and the rounds fast.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx.version_converter
from onnx import external_data_helper, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from unity_eq.errors import DynamicShapeError, ModelError, OptionError
from unity_eq.ir import Graph, Node, TensorType

__all__ = ["MIN_OPSET", "load_onnx", "parse_input_shape"]

MIN_OPSET = 18
"""Default-domain opset every model is upgraded to (torch's dynamo exporter writes 18 and above)."""

_MIN_IR_VERSION = 7
_INLINE_LIMIT = 1024
"""Constants with more elements than this reach shape inference as typed inputs, not as initializers."""
_NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)
"""Ops whose result is random (Dropout is, in training mode; inference-mode ones become Identity first)."""
_SUBGRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse the CLI option ``--input-shape name=2x16`` into ``("name", (2, 16))``.

    The name is everything before the last ``=``, so tensor names with ``/`` or ``:`` work as they are.
    """
    name, sep, dims_text = text.rpartition("=")
    usage = f"`--input-shape {text}`: expected NAME=DIMS with positive DIMS joined by x, e.g. `x=2x16`"
    if not sep:
        raise OptionError(f"{usage}, got no '='.")
    if not name.strip():
        raise OptionError(f"{usage}, got no input name.")
    try:
        dims = tuple(int(d) for d in dims_text.strip().split("x"))
    except ValueError:
        raise OptionError(f"{usage}, got dims {dims_text!r}.") from None
    if any(d <= 0 for d in dims):
        raise OptionError(f"{usage}, got non-positive dims {dims_text!r}.")
    return name.strip(), dims


def load_onnx(path: str | Path, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read an ONNX model into a :class:`Graph` in which every tensor has a static shape and a dtype.

    Args:
        path: the ``.onnx`` file; external data files are looked up next to it.
        input_shapes: shapes for model inputs, overriding the declared ones; required for every input with a
            dynamic dimension.

    Returns:
        The graph. Nodes are in topological order and have unique names: a node without a name, or with one
        taken by an earlier node, is named ``"{op_type}_{index}"`` (its index in ``Graph.nodes``). Folded
        constants keep the name of the tensor they replace. ``Sum`` becomes a chain of ``Add`` nodes whose
        intermediate tensors are named ``"{output}_sum{k}"``.

    Raises:
        ModelError: the file is missing or not a valid ONNX model, or a tensor has no static shape.
        DynamicShapeError: a model input has a dynamic dimension and ``input_shapes`` has no entry for it.
        OptionError: ``input_shapes`` names an unknown input or gives a wrong rank or a non-positive dim.
    """
    where = str(path)
    model, external = _read_model(Path(path), where)
    fingerprint = model_fingerprint(model)
    work = _Work.from_model(model, where, external)  # the proto's weights are freed here
    del model
    _check(work, where)
    _upgrade(work)
    work.inputs = _fix_input_shapes(work.inputs, input_shapes or {}, where)
    if input_shapes:
        work.value_info = []  # declared intermediate shapes may contradict the new input shapes
    types = _fold_to_fixpoint(work)
    graph = _build_graph(work, types, path)
    graph.fingerprint = fingerprint
    return graph


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


# ------------------------------------------------------------------------------------------ reading


def _read_model(path: Path, where: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Parse the file and map its external data, turning each failure into a ModelError."""
    model = _parse_model(path, where)
    _check_external_locations(model, path.parent, where)
    uses_external = any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    external = _map_external_data(model, path, where) if uses_external else {}
    return model, external


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
            f"{where}: not an ONNX model ({_one_line(e)}). Pass a model saved with `onnx.save` or an exporter."
        ) from e
    if empty:
        raise ModelError(f"{where}: the file is empty, expected an ONNX model. Re-export the model.")
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"{where}: not an ONNX model (no graph or opset found). Pass a model saved with `onnx.save`.")
    return model


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
        location = external_data_helper.ExternalDataInfo(t).location
        resolved = (root / location).resolve()
        if Path(location).is_absolute() or not location or not resolved.is_relative_to(root):
            raise ModelError(
                f"{where}: external tensor {t.name!r} points outside the model's folder ({location!r} is "
                f"{resolved}, not inside {root}). External data must be a relative path inside the model's "
                "folder; move the weight file next to the model and re-save it."
            )


def _check(work: _Work, where: str) -> None:
    """Run onnx.checker on the model with its large weights as typed inputs.

    The checker serializes the whole model (5 s and another copy of the weights for BERT-Large); the graph's
    validity does not depend on the weights' values, whose sizes were checked when they were converted.
    """
    try:
        onnx.checker.check_model(work.as_model(declared_outputs=True))
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{where}: fails the ONNX checker: {_one_line(e)}. Fix the model or re-export it.") from e


_MAPPABLE_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.BOOL,
    }
)
"""Element types stored exactly as numpy lays them out, so external data can be memory-mapped."""


def _map_external_data(model: onnx.ModelProto, path: Path, where: str) -> dict[str, np.ndarray]:
    """Memory-map tensors stored in separate files (relative to the model's directory), read-only.

    Optimizing only reads shapes, and lowering reads each rank's slice, so weights are never loaded whole.
    Types numpy cannot view directly (bfloat16, float8, 4-bit) are loaded through onnx instead.
    """
    base = path.parent
    mapped: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        if not external_data_helper.uses_external_data(t):
            continue
        info = external_data_helper.ExternalDataInfo(t)
        file = base / info.location
        if not file.is_file():
            raise ModelError(
                f"{where}: external data file {info.location!r} not found in '{base}'. "
                "Keep the weight files next to the model."
            )
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
        shape = tuple(int(d) for d in t.dims)
        count = int(np.prod(shape, dtype=np.int64))
        offset = int(info.offset or 0)
        if t.data_type not in _MAPPABLE_TYPES:
            mapped[t.name] = _load_one_external(t, base, where)
            continue
        if info.length is not None and int(info.length) != count * dtype.itemsize:
            raise ModelError(
                f"{where}: external tensor {t.name!r} has {info.length} bytes, expected "
                f"{count * dtype.itemsize} for {dtype}{list(shape)}. Re-save the model."
            )
        if offset + count * dtype.itemsize > file.stat().st_size:
            raise ModelError(f"{where}: external tensor {t.name!r} runs past the end of {info.location!r}.")
        mapped[t.name] = np.memmap(file, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=shape)
    return mapped


def _load_one_external(t: onnx.TensorProto, base: Path, where: str) -> np.ndarray:
    try:
        external_data_helper.load_external_data_for_tensor(t, str(base))
        return numpy_helper.to_array(t)
    except Exception as e:  # onnx raises ValidationError, OSError or ValueError for bad locations/offsets
        raise ModelError(f"{where}: cannot load external data ({_one_line(e)}). Re-save the model.") from e


def _one_line(error: BaseException, limit: int = 300) -> str:
    """An exception's message collapsed to one line, so CLI errors stay one line."""
    text = " ".join(str(error).split()).rstrip(".") or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------------ working state


@dataclass
class _Work:
    """The model while it is being normalized: protobuf nodes, numpy constants, typed inputs and outputs."""

    where: str
    name: str
    nodes: list[onnx.NodeProto]
    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    consts: dict[str, np.ndarray]
    opsets: dict[str, int]
    ir_version: int
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)
    functions: list[onnx.FunctionProto] = field(default_factory=list)

    @classmethod
    def from_model(cls, model: onnx.ModelProto, where: str, external: Mapping[str, np.ndarray]) -> _Work:
        """Split weights from model inputs: a graph input that has an initializer (IR 3 style) is a weight.

        Each embedded weight is converted to numpy and then cleared from the proto at once, so a large model
        is never held twice.
        """
        g = model.graph
        consts: dict[str, np.ndarray] = {}
        for t in g.initializer:
            if t.name in external:
                consts[t.name] = external[t.name]
                continue
            try:
                consts[t.name] = numpy_helper.to_array(t)
            except Exception as e:  # a tensor whose data does not match its dims or type
                raise ModelError(f"{where}: initializer {t.name!r} is malformed ({_one_line(e)}). Re-export.") from e
            t.Clear()
        return cls(
            where=where,
            name=g.name,
            nodes=list(g.node),
            inputs=[i for i in g.input if i.name not in consts],
            outputs=list(g.output),
            consts=consts,
            opsets=_opsets(model),
            ir_version=max(model.ir_version, _MIN_IR_VERSION),
            value_info=[v for v in g.value_info if _static_type(v.type) is not None],
            functions=list(model.functions),
        )

    def as_model(self, declared_outputs: bool = False) -> onnx.ModelProto:
        """A model for onnx's tools; constants over ``_INLINE_LIMIT`` elements are typed inputs, not data.

        ``declared_outputs`` keeps the outputs as the file declares them (for the checker); otherwise they keep
        only their element type, since declared shapes may predate new input shapes.
        """
        small = [numpy_helper.from_array(a, n) for n, a in self.consts.items() if a.size <= _INLINE_LIMIT]
        large = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in self.consts.items()
            if a.size > _INLINE_LIMIT
        ]
        outputs = list(self.outputs)
        if not declared_outputs:
            outputs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None) for o in outputs]
        graph = helper.make_graph(
            self.nodes, self.name, [*self.inputs, *large], outputs, small, value_info=self.value_info
        )
        opsets = [helper.make_opsetid(d, v) for d, v in self.opsets.items()]
        return helper.make_model(graph, opset_imports=opsets, ir_version=self.ir_version, functions=self.functions)

    def take_model(self, model: onnx.ModelProto) -> None:
        """Adopt the nodes, new constants and opsets of a model produced by ``as_model`` and an onnx tool."""
        for t in model.graph.initializer:
            if t.name not in self.consts:
                self.consts[t.name] = numpy_helper.to_array(t)
        self.nodes = list(model.graph.node)
        self.inputs = [i for i in model.graph.input if i.name not in self.consts]
        self.opsets = _opsets(model)
        self.functions = list(model.functions)


def _opsets(model: onnx.ModelProto) -> dict[str, int]:
    """Opset version per domain, with the default domain spelled ``""`` (never ``"ai.onnx"``)."""
    return {"" if o.domain == "ai.onnx" else o.domain: o.version for o in model.opset_import}


def _upgrade(work: _Work) -> None:
    """Inline local functions and bring the default-domain opset to ``MIN_OPSET``, so rules see one op set."""
    opset = work.opsets.get("", 0)
    if not work.functions and opset >= MIN_OPSET:
        return
    model = work.as_model()
    if work.functions:
        model = onnx.inliner.inline_local_functions(model)
    if opset < MIN_OPSET:
        if "" not in work.opsets:
            model.opset_import.append(helper.make_opsetid("", MIN_OPSET))
        else:
            try:
                model = onnx.version_converter.convert_version(model, MIN_OPSET)
            except Exception as e:  # the converter raises RuntimeError/ConvertError for missing adapters
                raise ModelError(
                    f"{work.where}: cannot convert opset {opset} to {MIN_OPSET} ({_one_line(e)}). "
                    f"Re-export the model at opset >= {MIN_OPSET}."
                ) from e
    work.take_model(model)
    work.ir_version = max(work.ir_version, helper.find_min_ir_version_for(model.opset_import, True))


# ------------------------------------------------------------------------------------------ input shapes


def _fix_input_shapes(
    inputs: list[onnx.ValueInfoProto], overrides: Mapping[str, Sequence[int]], where: str
) -> list[onnx.ValueInfoProto]:
    """Give every model input a static shape: apply ``overrides``, refuse dimensions left dynamic."""
    by_name = {i.name: i for i in inputs}
    valid = ", ".join(repr(n) for n in by_name) or "none"
    unknown = [n for n in overrides if n not in by_name]
    if unknown:
        raise OptionError(
            f"`--input-shape {unknown[0]}=...`: the model has no input {unknown[0]!r}; its inputs are {valid}."
        )
    fixed = []
    for value in inputs:
        if not value.type.HasField("tensor_type"):
            raise ModelError(f"{where}: input {value.name!r} is not a tensor; only tensor inputs are supported.")
        declared = _declared_dims(value)
        if value.name in overrides:
            dims = tuple(overrides[value.name])
            _check_override(value.name, declared, dims)
        else:
            dims = _static_dims(value.name, declared, where)
        fixed.append(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, dims))
    return fixed


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | str] | None:
    """The declared dims (int, or the dim_param / ``"?"`` of a dynamic one); None when the rank is unknown."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]


def _format_dims(dims: Sequence[int | str]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def _check_override(name: str, declared: list[int | str] | None, dims: tuple[int, ...]) -> None:
    option = f"`--input-shape {name}={'x'.join(map(str, dims))}`"
    if declared is not None and len(dims) != len(declared):
        raise OptionError(
            f"{option}: input {name!r} has rank {len(declared)} (shape {_format_dims(declared)}), "
            f"got {len(dims)} dims. Give {len(declared)} dims."
        )
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in dims):
        raise OptionError(f"{option}: every dimension must be a positive integer, got {list(dims)}.")
    for axis, (old, new) in enumerate(zip(declared or [], dims, strict=False)):
        if isinstance(old, int) and old != new:  # the model's weights and reshapes were built for `old`
            raise OptionError(
                f"{option}: input {name!r} dim {axis} is static ({old}) in the model (shape "
                f"{_format_dims(declared or [])}), got {new}. Only dynamic dims can be set; give {old} there."
            )


def _static_dims(name: str, declared: list[int | str] | None, where: str) -> tuple[int, ...]:
    """The declared dims of an input without an override, or a DynamicShapeError that says what to pass."""
    if declared is None:
        raise DynamicShapeError(
            f"{where}: input {name!r} has no declared shape. Pass `--input-shape {name}=<dims>`, "
            f"e.g. `--input-shape {name}=1x16`."
        )
    for d in declared:
        if not isinstance(d, int) or d <= 0:
            example = "x".join(str(e) if isinstance(e, int) and e > 0 else "1" for e in declared)
            problem = f"dynamic dimension {d!r}" if isinstance(d, str) else f"non-positive dimension {d}"
            raise DynamicShapeError(
                f"{where}: input {name!r} has {problem} (shape {_format_dims(declared)}). "
                f"Pass `--input-shape {name}=<dims>`, e.g. `--input-shape {name}={example}`."
            )
    return tuple(int(d) for d in declared)


# ------------------------------------------------------------------------------------------ folding


def _fold_to_fixpoint(work: _Work) -> dict[str, TensorType]:
    """Alternate canonicalization, shape inference and constant folding until nothing changes.

    Returns the static types of the final graph. Each productive round removes a Sum, a Dropout or a folded
    node, so the loop ends; usually after two or three rounds (Constant nodes, then Shape of what the first
    round fixed).
    """
    while True:
        changed = _canonicalize(work)
        types = _infer_types(work)
        changed |= _fold_constants(work, types)
        if not changed:
            _prune(work)
            return types


def _infer_types(work: _Work) -> dict[str, TensorType]:
    """Static types of every tensor onnx's shape inference (with data propagation) can fix."""
    try:
        inferred = onnx.shape_inference.infer_shapes(work.as_model(), data_prop=True)
    except Exception as e:  # InferenceError, or a C++ error for an op whose inference fails
        raise ModelError(f"{work.where}: shape inference failed: {_one_line(e)}. Check the model.") from e
    g = inferred.graph
    types = {v.name: t for v in (*g.input, *g.value_info, *g.output) if (t := _static_type(v.type))}
    for name, array in work.consts.items():
        types[name] = TensorType(tuple(int(d) for d in array.shape), array.dtype.name)
    return types


def _static_type(type_proto: onnx.TypeProto) -> TensorType | None:
    """The TensorType of a fully known tensor type; None for dynamic shapes, unknown dtypes, non-tensors."""
    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    if not tensor.elem_type or not tensor.HasField("shape"):
        return None
    if not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    return TensorType(tuple(d.dim_value for d in tensor.shape.dim), dtype)


def _fold_constants(work: _Work, types: Mapping[str, TensorType]) -> bool:
    """Replace every node whose result is known now by initializers; True if any node was folded."""
    kept = []
    for node in work.nodes:
        values = _constant_outputs(node, work.consts, types, work.opsets.get("", MIN_OPSET))
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values, strict=False):
            if name:
                work.consts[name] = value
    changed = len(kept) != len(work.nodes)
    work.nodes = kept
    return changed


def _constant_outputs(
    node: onnx.NodeProto, consts: Mapping[str, np.ndarray], types: Mapping[str, TensorType], opset: int
) -> list[np.ndarray] | None:
    """The outputs of ``node`` if they are known before running the model, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD:
        return None
    if any(a.type in _SUBGRAPH_ATTRS for a in node.attribute):
        return None
    if node.op_type in ("Shape", "Size") and node.input[0] in types:
        shape = types[node.input[0]].shape
        if node.op_type == "Size":
            return [np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return [np.array(shape[attrs.get("start", 0) : attrs.get("end", len(shape))], dtype=np.int64)]
    if not all(name in consts for name in node.input if name):
        return None
    feeds = {name: consts[name] for name in node.input if name}
    try:
        results = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
    except Exception:  # an op the reference runtime lacks stays in the graph; folding is only an optimization
        return None
    if not all(isinstance(r, (np.ndarray, np.generic)) for r in results):
        return None  # sequences, optionals, sparse tensors: not an initializer
    return [np.asarray(r) for r in results]


# ------------------------------------------------------------------------------------------ canonical forms


def _canonicalize(work: _Work) -> bool:
    """Rewrite ops that have a simpler standard equivalent, so rules need not cover them; True if any did."""
    used = _used_names(work)
    taken = used | {o for n in work.nodes for o in n.output} | set(work.consts)
    rewritten: list[onnx.NodeProto] = []
    changed = False
    for node in work.nodes:
        replacement = None
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type == "Dropout" and _is_inference_dropout(node, work, used):
            replacement = [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
        elif standard and node.op_type == "Sum":
            replacement = _sum_as_adds(node, taken)
        changed |= replacement is not None
        rewritten.extend(replacement if replacement is not None else [node])
    work.nodes = rewritten
    return changed


def _is_inference_dropout(node: onnx.NodeProto, work: _Work, used: set[str]) -> bool:
    """Dropout is the identity when not training (``training_mode`` absent or constant false).

    Only then, and when no one reads the mask, may it become an Identity.
    """
    mask_used = len(node.output) > 1 and node.output[1] in used
    training = node.input[2] if len(node.input) > 2 else ""
    if not training:
        return not mask_used
    return not mask_used and training in work.consts and not bool(work.consts[training])


def _sum_as_adds(node: onnx.NodeProto, taken: set[str]) -> list[onnx.NodeProto]:
    """``Sum(a, b, c) -> y`` as ``Add(Add(a, b), c) -> y``; one input is an Identity."""
    inputs, out = list(node.input), node.output[0]
    if len(inputs) == 1:
        return [helper.make_node("Identity", inputs, [out], name=node.name)]
    adds = []
    acc = inputs[0]
    for k, operand in enumerate(inputs[1:], start=1):
        last = k == len(inputs) - 1
        target = out if last else _unique(f"{out}_sum{k}", taken)
        name = f"{node.name}_add{k}" if node.name else ""
        adds.append(helper.make_node("Add", [acc, operand], [target], name=name))
        acc = target
    return adds


# ------------------------------------------------------------------------------------------ graph structure


def _node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs and the outer-scope names its subgraphs (If, Loop, Scan) use."""
    names = [n for n in node.input if n]
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            names.extend(sorted(_outer_scope_names(g)))
    return names


def _outer_scope_names(graph: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    outer: set[str] = set()
    for node in graph.node:
        outer.update(n for n in _node_reads(node) if n not in defined)
        defined.update(node.output)
    return outer


def _used_names(work: _Work) -> set[str]:
    """Names read by some node or returned by the graph."""
    return {n for node in work.nodes for n in _node_reads(node)} | {o.name for o in work.outputs}


def _prune(work: _Work) -> None:
    """Drop nodes and constants that no graph output depends on (model inputs always stay)."""
    work.nodes = _topological_sort(work.nodes, work.where)
    needed = {o.name for o in work.outputs}
    kept = []
    for node in reversed(work.nodes):
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(_node_reads(node))
    work.nodes = kept[::-1]
    work.consts = {n: a for n, a in work.consts.items() if n in needed}


def _topological_sort(nodes: list[onnx.NodeProto], where: str) -> list[onnx.NodeProto]:
    """Kahn's algorithm, keeping the original order wherever the dependencies allow it."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    deps = [{producer[r] for r in _node_reads(n) if r in producer} - {i} for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    waiting = [len(ds) for ds in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i, w in enumerate(waiting) if w)
        raise ModelError(f"{where}: the graph has a cycle through node {stuck.name or stuck.op_type!r}.")
    return order


# ------------------------------------------------------------------------------------------ building the IR


def _build_graph(work: _Work, types: dict[str, TensorType], path: str | Path) -> Graph:
    """Turn the folded model into the IR, checking that every tensor that matters has a static type."""
    used = _used_names(work)
    names = _node_names(work.nodes)
    producer = {out: name for node, name in zip(work.nodes, names, strict=True) for out in node.output if out}
    for tensor in sorted(used - types.keys()):
        made_by = f"output of node {producer[tensor]!r}" if tensor in producer else "not produced by any node"
        raise ModelError(
            f"{work.where}: tensor {tensor!r} ({made_by}) has no static shape and dtype after shape "
            "inference. "
            "Pass `--input-shape` for the dynamic inputs, or re-export the model with static shapes."
        )
    nodes = [
        Node(
            name,
            node.op_type,
            tuple(node.input),
            # An output no one reads with an unknown type (e.g. an optional mask) is dropped, as ONNX allows.
            tuple(o if o in types else "" for o in node.output),
            {a.name: _attr_value(a) for a in node.attribute},
            node.domain,
        )
        for node, name in zip(work.nodes, names, strict=True)
    ]
    inputs = {i.name: types[i.name] for i in work.inputs}
    tensors = used | set(inputs) | set(work.consts) | {o for n in nodes for o in n.outputs if o}
    return Graph(
        name=work.name or Path(path).stem,
        inputs=inputs,
        outputs=[o.name for o in work.outputs],
        nodes=nodes,
        initializers=dict(work.consts),
        types={t: types[t] for t in sorted(tensors)},
        opset=work.opsets.get("", MIN_OPSET),
        extra_opsets={d: v for d, v in work.opsets.items() if d},
        ir_version=work.ir_version,
        source=str(path),
    )


def _node_names(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    """Unique non-empty names: the first holder keeps a name; others get ``"{op_type}_{index}"``."""
    originals = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    names = []
    for i, node in enumerate(nodes):
        name = node.name
        if not name or name in seen:
            name = _unique(f"{node.op_type}_{i}", originals | seen)
        seen.add(name)
        names.append(name)
    return names


def _unique(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``… — the first not in ``taken`` (which it then joins)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _attr_value(attr: onnx.AttributeProto) -> Any:
    """An attribute as a Python value; strings decoded, tensors and graphs left as protos."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value

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

The steps live in modules of their own: reading the file (:mod:`~unity_eq.frontends.onnx_read`), the working
model with the checker and the upgrade (:mod:`~unity_eq.frontends.onnx_normalize`), the input shapes
(:mod:`~unity_eq.frontends.onnx_inputs`), folding and pruning (:mod:`~unity_eq.frontends.onnx_fold`); this one
runs them (:func:`load_onnx`) and builds the Graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from unity_eq.errors import ModelError, OptionError
from unity_eq.frontends.onnx_attention import attention_nodes
from unity_eq.frontends.onnx_fold import fold_to_fixpoint, unique_name, used_names
from unity_eq.frontends.onnx_inputs import fix_input_shapes, parse_input_shape
from unity_eq.frontends.onnx_normalize import MIN_OPSET, Work, run_checker, upgrade
from unity_eq.frontends.onnx_read import model_fingerprint, read_model, shape_only
from unity_eq.ir import Graph, Node, TensorType, default_origin

__all__ = ["MIN_OPSET", "load_onnx", "parse_input_shape"]


def load_onnx(
    path: str | Path | onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    weight_inputs: Sequence[str] = (),
) -> Graph:
    """Read an ONNX model into a :class:`Graph` in which every tensor has a static shape and a dtype.

    Args:
        path: the ``.onnx`` file, whose external data files are looked up next to it; or a ModelProto in
            memory (checked as a file is, and left unchanged), whose weights are those it holds.
        input_shapes: shapes for model inputs, overriding the declared ones; required for every input with a
            dynamic dimension.
        weight_inputs: model inputs that are weights (a model exported with its parameters as inputs): each
            becomes a shape-only weight, named in ``Graph.missing_weights`` (its values come at run time), so
            it is priced as a weight (optimizer state, gradient all-reduce), not as an activation.

    Returns:
        The graph. Nodes are in topological order and have unique names: a node without a name, or with one
        taken by an earlier node, is named ``"{op_type}_{index}"`` (its index in ``Graph.nodes``). Folded
        constants keep the name of the tensor they replace. ``Sum`` becomes a chain of ``Add`` nodes whose
        intermediate tensors are named ``"{output}_sum{k}"``. A weight whose external data is absent (no
        data file, a file cut short, a ModelProto without its data) is a shape-only array, named in
        ``Graph.missing_weights``: the model can be planned but not lowered.

    Raises:
        ModelError: the file is missing or not a valid ONNX model, or a tensor has no static shape.
        DynamicShapeError: a model input has a dynamic dimension and ``input_shapes`` has no entry for it.
        OptionError: ``input_shapes`` names an unknown input or gives a wrong rank or a non-positive dim.
    """
    in_memory = isinstance(path, onnx.ModelProto)
    if isinstance(path, onnx.ModelProto):
        where = f"model {path.graph.name or '(unnamed)'!r} (in memory)"
        read = read_model(path, where)
    else:
        where = str(path)
        read = read_model(Path(path), where)
    fingerprint = model_fingerprint(read.model)
    work = Work.from_model(read.model, where, read.external, read.missing, consume=not in_memory)
    del read  # the proto's weights are freed here (a file's; an in-memory model stays the caller's)
    work.origins = {name: default_origin(name, a.dtype.name, a.ndim) for name, a in work.consts.items()}
    run_checker(work, where)
    upgrade(work)
    work.inputs = fix_input_shapes(work.inputs, input_shapes or {}, where)
    _inputs_as_weights(work, weight_inputs)
    if input_shapes:
        work.value_info = []  # declared intermediate shapes may contradict the new input shapes
    types = fold_to_fixpoint(work)
    graph = _build_graph(work, types, "" if in_memory else path)
    graph.fingerprint = fingerprint
    graph.missing_weights = {name: why for name, why in work.missing.items() if name in graph.initializers}
    graph.origins = {name: work.origins[name] for name in graph.initializers if name in work.origins}
    return graph


def _inputs_as_weights(work: Work, names: Sequence[str]) -> None:
    """Turn the model inputs ``names`` (their shapes fixed already) into shape-only weights whose data is
    missing: the model reads them at run time, so there are no bytes to lower, but the plan is a weight's."""
    by_name = {i.name: i for i in work.inputs}
    for name in names:
        if name not in by_name:
            valid = ", ".join(repr(n) for n in by_name) or "none"
            raise OptionError(f"`--weight-input {name}`: the model has no input {name!r}; its inputs are {valid}.")
        tensor = by_name[name].type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        work.consts[name] = shape_only(np.dtype(dtype), tuple(d.dim_value for d in tensor.shape.dim))
        work.missing[name] = "a model input declared a weight by `--weight-input`: its values come at run time"
        work.origins[name] = default_origin(name, work.consts[name].dtype.name, work.consts[name].ndim)
    work.inputs = [i for i in work.inputs if i.name not in set(names)]


# ------------------------------------------------------------------------------------------ building the IR


def _build_graph(work: Work, types: dict[str, TensorType], path: str | Path) -> Graph:
    """Turn the folded model into the IR, checking that every tensor that matters has a static type; ``path``
    is "" for a model passed in memory (named after its graph)."""
    used = used_names(work)
    names = _node_names(work.nodes)
    producer = {out: name for node, name in zip(work.nodes, names, strict=True) for out in node.output if out}
    for tensor in sorted(used - types.keys()):
        made_by = f"output of node {producer[tensor]!r}" if tensor in producer else "not produced by any node"
        raise ModelError(
            f"{work.where}: tensor {tensor!r} ({made_by}) has no static shape and dtype after shape "
            "inference. "
            "Pass `--input-shape` for the dynamic inputs, or re-export the model with static shapes."
        )
    nodes: list[Node] = []
    for node, name in zip(work.nodes, names, strict=True):
        # An output no one reads with an unknown type (e.g. an optional mask) is dropped, as ONNX allows.
        outputs = tuple(o if o in types else "" for o in node.output)
        attrs = {a.name: _attr_value(a) for a in node.attribute}
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):  # ONNX's op, not the term of that name
            made = len(work.consts)
            nodes += attention_nodes(name, tuple(node.input), outputs, attrs, types, work.consts, work.where)
            for fill in list(work.consts)[made:]:  # a masked row's zero fill: a constant, never trained
                work.origins[fill] = default_origin(fill, work.consts[fill].dtype.name, 0)
            continue
        nodes.append(Node(name, node.op_type, tuple(node.input), outputs, attrs, node.domain))
    inputs = {i.name: types[i.name] for i in work.inputs}
    tensors = used | set(inputs) | set(work.consts) | {o for n in nodes for o in n.outputs if o}
    return Graph(
        name=work.name or (Path(path).stem if path else "model"),
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
            name = unique_name(f"{node.op_type}_{i}", originals | seen)
        seen.add(name)
        names.append(name)
    return names


def _attr_value(attr: onnx.AttributeProto) -> Any:
    """An attribute as a Python value; strings decoded, tensors and graphs left as protos."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value

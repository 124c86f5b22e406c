"""The source model's weights a plan's ranks start training from, and what may not be trained as the plan says.

A plan names the frontend's initializers; training starts from the source ONNX model's values of them
(:func:`source_weights`). A weight the frontend folded from parameters (``Wt = Transpose(W)``) is computed again on
the ranks from the parameters (:class:`Derivation`), so its gradient reaches them. A weight that may be several
source parameters the exporter merged is refused unless the user says it is one (:func:`refuse_merged`,
:func:`refuse_ambiguous`): training it as one would tie parameters the source model trains apart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unity_eq.errors import ModelError
from unity_eq.ir import WeightOrigin
from unity_eq.planfile import ExplainRecord, WeightStepRecord

__all__ = ["Derivation", "derivations", "refuse_ambiguous", "refuse_merged", "source_weights", "weight_origins"]


def refuse_merged(record: ExplainRecord, shared: Collection[str], model: str | Path) -> None:
    """One error line for a weight plan.json marks as maybe several source parameters merged into one by the
    exporter (``weights[].ambiguous``: ``Graph.ambiguous_weights``), unless ``shared`` says it is one
    parameter: training it as one would silently tie parameters the source model trains apart."""
    for name, weight in record.weights.items():
        if weight.merged:
            raise ModelError(
                f"{model}: weight {name!r} holds the source parameters {', '.join(weight.merged)} (the exporter "
                "merged them; `--parameters` says so): one weight cannot train them apart. Re-export the model "
                "with those parameters made distinct."
            )
    refuse_ambiguous({name: w.ambiguous for name, w in record.weights.items() if w.ambiguous}, shared, model)


def refuse_ambiguous(why: Mapping[str, str], shared: Collection[str], model: str | Path) -> None:
    """One error line for the weights of ``why`` (name -> why it may be merged parameters) that ``shared``
    does not name: plan.json's flags for one plan, or the whole model's (``Graph.ambiguous_weights``) for a
    pipeline, whose stages each see only their own reads of a weight."""
    flagged = sorted(name for name in why if name not in shared)
    if flagged:
        first = flagged[0]
        also = f" ({', '.join(repr(n) for n in flagged[1:])} likewise)" if flagged[1:] else ""
        flags = " ".join(f"--shared {n}" for n in flagged)
        raise ModelError(
            f"{model}: weight {first!r} is {why[first]}{also}: torch's dynamo exporter merges "
            "parameters with equal values into one initializer, and training it would tie them. Re-export the model "
            f"with those parameters made distinct, or pass `{flags}` if the source model shares them."
        )


def source_weights(
    model: str | Path,
    record: ExplainRecord,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    shared: Collection[str] = (),
) -> tuple[dict[str, Any], set[str], dict[str, Derivation]]:
    """The source model's weights as the plan names them (the frontend's initializers at the plan's input
    shapes, or at ``shapes``: a pipeline stage's plan has the stage's inputs, the model's are stage 0's), the
    source parameters (the frontend's ``Graph.origins``: the one definition of trainable that the cost and
    memory models price) and the weights the frontend folded from parameters (a ``Transpose(W)``
    it made an initializer ``Wt``): those the ranks compute again from the parameters (:class:`Derivation`),
    so their gradients reach the source weights. A weight that may be merged parameters
    (``Graph.ambiguous_weights``) is refused unless ``shared`` names it (the user says it is one)."""
    import onnx

    from unity_eq.frontends.onnx import load_onnx
    from unity_eq.weightfile import value_of

    if shapes is None:
        shapes = {name: tuple(spec.shape) for name, spec in record.model.inputs.items()}
    graph = load_onnx(model, dict(shapes))
    refuse_merged(record, shared, model)
    proto = onnx.load(str(model))
    origins = weight_origins(record, graph)
    trainable = {source for origin in origins.values() if origin.trainable for source in origin.sources}
    weights = {name: value_of(v) for name, v in graph.initializers.items()}
    loaded = {s.name for s in record.steps if isinstance(s, WeightStepRecord)}
    folded = {name for name in loaded if name in origins and origins[name].how == "folded"}
    derived = derivations(proto, folded, trainable, shapes)
    for d in derived.values():
        for name in d.sources:
            if name not in weights:  # pruned by the frontend: only the fold read it
                init = next(t for t in proto.graph.initializer if t.name == name)
                weights[name] = onnx.numpy_helper.to_array(init)
    return weights, trainable, derived


def weight_origins(record: ExplainRecord, graph: Any) -> dict[str, WeightOrigin]:
    """Every weight's origin as plan.json records it (``weights``: what the plan was priced with, the user's
    ``--parameters`` map included); a plan written before the section, the frontend's again."""
    if not record.weights:
        return dict(graph.weight_origins())
    return {
        name: WeightOrigin(w.how, w.sources, w.ops, w.merged) if w.trainable else WeightOrigin.constant(w.ops)
        for name, w in record.weights.items()
    }


@dataclass(frozen=True)
class Derivation:
    """How the source ONNX graph computes a tensor the frontend folded into an initializer: its nodes (op,
    domain, inputs, outputs, attrs) in order, from the trainable initializers ``sources``. ``placeholders``: the
    model inputs its nodes read, (name, shape, numpy dtype): only through their shapes (the frontend could fold
    the tensor only because its value does not depend on theirs; BERT's token-type embedding gathered at the
    ids' shape), so zeros of the planned shape stand in for them."""

    nodes: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], dict[str, Any]], ...]
    sources: tuple[str, ...]
    placeholders: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    #: the initializers its nodes read that are not trainable (an index, a shape), with their values
    constants: tuple[tuple[str, Any], ...] = ()


def derivations(
    model: Any, names: set[str], trainable: set[str], shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, Derivation]:
    """For each of ``names`` (folded initializers) that a trainable initializer flows into, its subgraph
    (``shapes``: the model inputs' planned shapes, for the placeholders of those it reads)."""
    import onnx

    from unity_eq.train.reference import node_attrs

    graph_inputs = {i.name: i for i in model.graph.input}
    initializers = {t.name: t for t in model.graph.initializer}

    producer = {out: node for node in model.graph.node for out in node.output}
    out: dict[str, Derivation] = {}
    for name in sorted(names):
        if name not in producer:
            continue
        needed: list[Any] = []
        sources: set[str] = set()
        stack, seen = [name], set()
        while stack:
            tensor = stack.pop()
            if tensor in seen or not tensor:
                continue
            seen.add(tensor)
            if tensor in trainable:
                sources.add(tensor)
            elif tensor in producer:
                node = producer[tensor]
                if node not in needed:
                    needed.append(node)
                stack.extend(node.input)
        if sources:
            order = [n for n in model.graph.node if n in needed]
            nodes = tuple((n.op_type, n.domain, tuple(n.input), tuple(n.output), node_attrs(n)) for n in order)
            read = sorted({i for n in order for i in n.input if i in graph_inputs and i not in trainable})
            placeholders = tuple(
                (i, tuple(int(d) for d in (shapes or {})[i]),
                 np.dtype(onnx.helper.tensor_dtype_to_np_dtype(graph_inputs[i].type.tensor_type.elem_type)).name)
                for i in read
            )  # fmt: skip
            fixed = sorted({i for n in order for i in n.input if i in initializers and i not in trainable})
            constants = tuple((i, onnx.numpy_helper.to_array(initializers[i])) for i in fixed)
            out[name] = Derivation(nodes, tuple(sorted(sources)), placeholders, constants)
    return out

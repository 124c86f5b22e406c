"""Splitting a model into pieces at bottleneck tensors, and the signatures that find identical pieces.

A cut is where a single activation is live; pieces with the same structure (ops, attributes, shapes, small
integer constants) share a signature, so they are optimized once (unity_eq.blocks) and reused.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unity_eq.ir import Graph, Node
from unity_eq.planfile import BlocksRecord

MIN_PIECE_NODES = 8


SMALL_CONSTANT = 64  # integer constants up to this many elements are part of a piece's signature


@dataclass(frozen=True)
class Piece:
    """A run of consecutive nodes between two cuts."""

    index: int
    nodes: tuple[Node, ...]
    stream_in: str | None  # the one tensor entering (None for the first piece, which reads the model inputs)
    stream_out: str | None  # the one tensor leaving (None for the last piece, which writes the model outputs)
    signature: str


@dataclass
class BlockSplit:
    """A model cut into pieces, with which pieces are copies of each other."""

    graph: Graph
    pieces: list[Piece]

    @property
    def distinct(self) -> dict[str, Piece]:
        """One representative (the first) per signature."""
        found: dict[str, Piece] = {}
        for piece in self.pieces:
            found.setdefault(piece.signature, piece)
        return found

    def summary(self) -> str:
        counts = Counter(p.signature for p in self.pieces)
        repeated = max(counts.values())
        return f"{len(self.pieces)} pieces, {len(counts)} distinct (the most repeated ×{repeated})"

    def to_record(self) -> BlocksRecord:
        """As plan.json's ``blocks`` holds it."""
        counts = Counter(p.signature for p in self.pieces)
        return BlocksRecord(
            pieces=len(self.pieces),
            distinct=len(counts),
            nodes_per_piece=tuple(len(p.nodes) for p in self.pieces),
            cuts=tuple(p.stream_out for p in self.pieces[:-1] if p.stream_out is not None),  # all but the last
            copies=tuple(sorted(counts.values(), reverse=True)),
        )


def _activations(graph: Graph) -> set[str]:
    """Tensors that depend on a model input. The other nodes compute constants (a folded-away shape
    computation the frontend left); they are not cut, but copied into each piece that reads them."""
    found = set(graph.inputs)
    for node in graph.nodes:
        if any(name in found for name in node.inputs if name):
            found.update(out for out in node.outputs if out)
    return found


def _cut_positions(nodes: Sequence[Node], graph: Graph, activations: set[str]) -> list[tuple[int, str]]:
    """(i, t): after ``nodes[i]`` exactly one activation, t, is still needed, and a node made it."""
    last_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.inputs:
            if name in activations:
                last_use[name] = i
    end = len(nodes)
    for name in graph.outputs:
        last_use[name] = end
    live = {name for name in graph.inputs if name in last_use}
    cuts = []
    for i, node in enumerate(nodes):
        for out in node.outputs:
            if out and out in last_use and last_use[out] > i:
                live.add(out)
        live = {name for name in live if last_use[name] > i}
        if len(live) == 1 and i < end - 1:
            (only,) = live
            if only not in graph.inputs:
                cuts.append((i, only))
    return cuts


def _with_constants(nodes: Sequence[Node], constant_nodes: dict[str, Node], order: dict[str, int]) -> tuple[Node, ...]:
    """``nodes`` preceded by the constant-computing nodes they read, transitively, in graph order."""
    needed: dict[str, Node] = {}
    stack = [name for node in nodes for name in node.inputs if name in constant_nodes]
    while stack:
        producer = constant_nodes[stack.pop()]
        if producer.name not in needed:
            needed[producer.name] = producer
            stack.extend(name for name in producer.inputs if name in constant_nodes)
    return (*sorted(needed.values(), key=lambda n: order[n.name]), *nodes)


def _attr_token(value: Any) -> Any:
    if hasattr(value, "SerializeToString"):
        return hashlib.sha1(value.SerializeToString()).hexdigest()
    if isinstance(value, list | tuple):
        return tuple(_attr_token(v) for v in value)
    return value


def _signature(graph: Graph, nodes: Sequence[Node], stream_in: str | None, stream_out: str | None) -> str:
    """What a piece's optimization depends on: ops, attributes, wiring, shapes, integer constants."""
    refs: dict[str, Any] = {}
    if stream_in is not None:
        refs[stream_in] = ("in", str(graph.types[stream_in]))
    tokens: list[Any] = []
    for j, node in enumerate(nodes):
        inputs: list[Any] = []
        for name in node.inputs:
            if not name:
                inputs.append(None)
            elif name in refs:
                inputs.append(refs[name])
            elif name in graph.initializers:
                array = graph.initializers[name]
                if array.dtype.kind in "iub" and array.size <= SMALL_CONSTANT:
                    inputs.append(("const", str(array.dtype), tuple(np.asarray(array).reshape(-1).tolist())))
                else:
                    inputs.append(("weight", str(array.dtype), tuple(array.shape)))
            else:
                inputs.append(("model-input", name, str(graph.types[name])))
        attrs = tuple(sorted((k, _attr_token(v)) for k, v in node.attrs.items()))
        outs = tuple(str(graph.types[o]) if o and o in graph.types else "" for o in node.outputs)
        tokens.append((node.op_type, node.domain, attrs, tuple(inputs), outs))
        for k, out in enumerate(node.outputs):
            if out:
                refs[out] = ("node", j, k)
    tokens.append(("out", refs.get(stream_out) if stream_out else tuple(refs.get(o) for o in graph.outputs)))
    return hashlib.sha1(repr(tokens).encode()).hexdigest()[:16]


def split_graph(graph: Graph, min_nodes: int = MIN_PIECE_NODES) -> BlockSplit | None:
    """Cut ``graph`` where a single activation is live; None when it has fewer than two pieces."""
    activations = _activations(graph)
    working = [n for n in graph.nodes if any(name in activations for name in n.inputs if name)]
    constant_nodes = {out: n for n in graph.nodes if n not in working for out in n.outputs if out}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    cuts = _cut_positions(working, graph, activations)
    chosen: list[tuple[int, str]] = []
    start = 0
    for i, tensor in cuts:
        if i + 1 - start >= min_nodes:
            chosen.append((i, tensor))
            start = i + 1
    if chosen and len(working) - (chosen[-1][0] + 1) < min_nodes:
        chosen.pop()  # fold a short tail into the last piece
    if not chosen:
        return None
    pieces: list[Piece] = []
    start = 0
    stream_in: str | None = None
    bounds: list[tuple[int, str | None]] = [*chosen, (len(working) - 1, None)]
    for index, (last, leaving) in enumerate(bounds):
        nodes = _with_constants(working[start : last + 1], constant_nodes, order)
        signature = _signature(graph, nodes, stream_in, leaving)
        pieces.append(Piece(index, nodes, stream_in, leaving, signature))
        start, stream_in = last + 1, leaving
    return BlockSplit(graph, pieces)


def piece_graph(graph: Graph, piece: Piece) -> Graph:
    """The piece as a model: its incoming tensor (or the model inputs) in, its outgoing tensor (or the model
    outputs) out, the weights it reads."""
    used = {name for node in piece.nodes for name in node.inputs if name}
    made = {out for node in piece.nodes for out in node.outputs if out}
    if piece.stream_in is not None:
        inputs = {piece.stream_in: graph.types[piece.stream_in]}
    else:
        inputs = {name: t for name, t in graph.inputs.items() if name in used}
    outputs = [piece.stream_out] if piece.stream_out is not None else list(graph.outputs)
    # in the model's own order, never a set's: the order of a plan's steps (and so its hash) must not depend
    # on Python's string hashing, which changes from run to run
    initializers = {name: value for name, value in graph.initializers.items() if name in used}
    names = used | made | set(inputs) | set(outputs)
    types = {name: t for name, t in graph.types.items() if name in names}
    return Graph(
        f"{graph.name}.piece{piece.index}",
        inputs,
        outputs,
        list(piece.nodes),
        initializers,
        types,
        graph.opset,
        graph.extra_opsets,
        graph.ir_version,
        graph.source,
    )

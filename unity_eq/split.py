"""Splitting a model into pieces at bottleneck tensors, and the signatures that find identical pieces.

A cut is where a single activation is live, besides *side tensors*: tensors such as an attention mask,
computed before the layers from some of the model inputs and read by every layer unchanged. Pieces with the
same structure (ops, attributes, shapes, small integer constants, the side tensors they read by position)
share a signature, so they are optimized once (unity_eq.blocks) and reused.
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
    side_in: tuple[str, ...] = ()  # side tensors the piece reads, made by the first piece, in order of first use
    side_out: tuple[str, ...] = ()  # the first piece only: the side tensors later pieces read

    def instance_names(self, copy: Piece) -> dict[str, str]:
        """Tensor (and weight) names of this piece, the representative → the same tensors of ``copy`` (same
        signature): how the block DP and a pipeline stage stitch a copy from its representative's plan."""
        mapping: dict[str, str] = {}
        if self.stream_in is not None and copy.stream_in is not None:
            mapping[self.stream_in] = copy.stream_in
        mapping.update(zip(self.side_in, copy.side_in, strict=True))
        for a, b in zip(self.nodes, copy.nodes, strict=True):
            for x, y in zip(a.inputs, b.inputs, strict=True):
                if x and y and x not in mapping:
                    mapping[x] = y
            for x, y in zip(a.outputs, b.outputs, strict=True):
                if x and y:
                    mapping[x] = y
        return mapping


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


def _input_sets(graph: Graph) -> dict[str, frozenset[str]]:
    """For every activation, the model inputs it is computed from."""
    deps = {name: frozenset({name}) for name in graph.inputs}
    for node in graph.nodes:
        found = frozenset().union(*(deps[name] for name in node.inputs if name in deps))
        if found:
            deps.update((out, found) for out in node.outputs if out)
    return deps


def _side_tensors(graph: Graph) -> set[str]:
    """Activations computed from only some of the model inputs the outputs need (the attention mask from
    ``attention_mask`` alone) and read directly by at least two nodes that mix every input (one per layer).
    They cannot be the stream the layers chain through, which mixes every input by the first layer, so a cut
    may leave them live and pass them to every later piece unchanged. (Layer 0's queries, read once, are not.)"""
    deps = _input_sets(graph)
    full = frozenset().union(*(deps.get(name, frozenset()) for name in graph.outputs))
    readers: Counter[str] = Counter()
    for node in graph.nodes:
        if any(deps.get(out) == full for out in node.outputs if out):
            readers.update(set(node.inputs))
    return {
        name
        for name, used in deps.items()
        if used < full and readers[name] >= 2 and name not in graph.outputs and name not in graph.inputs
    }


def _making(working: Sequence[Node], side: set[str]) -> list[Node]:
    """The nodes ``side`` is computed by, transitively, in graph order (they read no tensor that mixes every
    input, so moving them to the front keeps the order topological)."""
    producer = {out: n for n in working for out in n.outputs if out}
    needed: set[str] = set()
    stack = [name for name in side if name in producer]
    while stack:
        node = producer[stack.pop()]
        if node.name not in needed:
            needed.add(node.name)
            stack.extend(name for name in node.inputs if name in producer)
    return [n for n in working if n.name in needed]


def _cut_positions(
    nodes: Sequence[Node], graph: Graph, activations: set[str], side: frozenset[str] = frozenset(), first: int = 0
) -> list[tuple[int, str]]:
    """(i, t): after ``nodes[i]`` (i >= ``first``) exactly one activation but side tensors, t, is still needed,
    a node made it, and no model input is still needed."""
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
        stream = live - side
        if len(stream) == 1 and i < end - 1 and i >= first and not live & graph.inputs.keys():
            (only,) = stream
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


def _signature(
    graph: Graph,
    nodes: Sequence[Node],
    stream_in: str | None,
    stream_out: str | None,
    side_in: Sequence[str] = (),
    side_out: Sequence[str] = (),
) -> str:
    """What a piece's optimization depends on: ops, attributes, wiring, shapes, integer constants. Side
    tensors enter by position and type, not name, so every layer reading the one mask has one signature."""
    refs: dict[str, Any] = {}
    if stream_in is not None:
        refs[stream_in] = ("in", str(graph.types[stream_in]))
    for k, name in enumerate(side_in):
        refs[name] = ("side", k, str(graph.types[name]))
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
    if side_out:
        tokens.append(("side-out", tuple(refs.get(name) for name in side_out)))
    return hashlib.sha1(repr(tokens).encode()).hexdigest()[:16]


def _choose_cuts(cuts: list[tuple[int, str]], count: int, min_nodes: int) -> list[tuple[int, str]]:
    """The first cut after at least ``min_nodes`` nodes, again and again; a short tail joins the last piece."""
    chosen: list[tuple[int, str]] = []
    start = 0
    for i, tensor in cuts:
        if i + 1 - start >= min_nodes:
            chosen.append((i, tensor))
            start = i + 1
    if chosen and count - (chosen[-1][0] + 1) < min_nodes:
        chosen.pop()  # fold a short tail into the last piece
    return chosen


def _side_order(nodes: Sequence[Node], side: frozenset[str]) -> tuple[str, ...]:
    """The side tensors ``nodes`` read, in order of first use (the same order in every copy of a layer)."""
    return tuple(dict.fromkeys(name for node in nodes for name in node.inputs if name in side))


def _plain_cuts(working: list[Node], graph: Graph, activations: set[str], min_nodes: int) -> list[tuple[int, str]]:
    return _choose_cuts(_cut_positions(working, graph, activations), len(working), min_nodes)


def _side_cuts(
    working: list[Node], graph: Graph, activations: set[str], min_nodes: int
) -> tuple[list[Node], frozenset[str], list[tuple[int, str]]]:
    """Cuts that may leave side tensors live. The nodes computing them move to the front (they read no tensor
    that mixes every input, so the order stays topological) and every cut comes after them: the first piece
    makes them."""
    side = frozenset(_side_tensors(graph))
    making = _making(working, set(side))
    if not side or not making:
        return working, side, []
    moved = {n.name for n in making}
    ordered = [*making, *(n for n in working if n.name not in moved)]
    positions = _cut_positions(ordered, graph, activations, side, first=len(making) - 1)
    return ordered, side, _choose_cuts(positions, len(ordered), min_nodes)


def split_graph(graph: Graph, min_nodes: int = MIN_PIECE_NODES) -> BlockSplit | None:
    """Cut ``graph`` where a single activation (and side tensors) is live; None when it has fewer than two
    pieces. Side tensors are used only when they give more pieces, so a model without them splits as before."""
    activations = _activations(graph)
    working = [n for n in graph.nodes if any(name in activations for name in n.inputs if name)]
    constant_nodes = {out: n for n in graph.nodes if n not in working for out in n.outputs if out}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    chosen = _plain_cuts(working, graph, activations, min_nodes)
    side: frozenset[str] = frozenset()
    ordered, maybe_side, side_chosen = _side_cuts(working, graph, activations, min_nodes)
    if len(side_chosen) > len(chosen):
        working, side, chosen = ordered, maybe_side, side_chosen
    if not chosen:
        return None
    bounds: list[tuple[int, str | None]] = [*chosen, (len(working) - 1, None)]
    runs, start = [], 0
    for last, _ in bounds:
        runs.append(working[start : last + 1])
        start = last + 1
    later = {name for run in runs[1:] for name in _side_order(run, side)}
    pieces: list[Piece] = []
    stream_in: str | None = None
    for index, (run, (_, leaving)) in enumerate(zip(runs, bounds, strict=True)):
        nodes = _with_constants(run, constant_nodes, order)
        side_in = _side_order(run, side) if index else ()
        side_out = tuple(out for n in run for out in n.outputs if out in later) if index == 0 else ()
        signature = _signature(graph, nodes, stream_in, leaving, side_in, side_out)
        pieces.append(Piece(index, nodes, stream_in, leaving, signature, side_in, side_out))
        stream_in = leaving
    return BlockSplit(graph, pieces)


def piece_graph(graph: Graph, piece: Piece) -> Graph:
    """The piece as a model: its incoming tensor and side tensors (or the model inputs) in, its outgoing tensor
    and the side tensors later pieces read (or the model outputs) out, the weights it reads."""
    used = {name for node in piece.nodes for name in node.inputs if name}
    made = {out for node in piece.nodes for out in node.outputs if out}
    if piece.stream_in is not None:
        inputs = {name: graph.types[name] for name in (piece.stream_in, *piece.side_in)}
    else:
        inputs = {name: t for name, t in graph.inputs.items() if name in used}
    outputs = [piece.stream_out, *piece.side_out] if piece.stream_out is not None else list(graph.outputs)
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
        origins={name: graph.origin(name) for name in initializers},
    )

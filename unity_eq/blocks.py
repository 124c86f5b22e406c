"""Large models in pieces: split at bottleneck tensors, optimize each distinct piece once, join by DP.

A transformer is a chain of identical layers joined by one tensor (the residual stream). Saturating the whole
model costs time and memory in proportion to its depth; Unity instead splits the graph where a single tensor
is live, optimizes each piece for every placement of its boundary tensors, and joins the pieces by dynamic
programming over those placements. Pieces with the same structure (the same ops, attributes, shapes and
integer constants — weights differ only in their values, which plans never read) are optimized once and the
result is reused for every copy, so the work grows with the number of *distinct* pieces, not with depth.

How a piece is optimized for a boundary placement, on one mesh:

* the piece's incoming tensor is a model input of the piece graph; for each candidate placement ``q`` the
  encoding adds the term ``Partition(…Partition(Input(t), d, ax)…)`` that holds ``t`` in ``q``;
* extraction for ``q`` gives that term's e-class a free leaf (the tensor arrives that way) and prices the
  replicated ``Input(t)`` at the all-gathers that would make it whole;
* the outgoing tensor gets a root term per candidate placement ``p`` (``Partition…(out)``); one greedy
  extraction prices every ``p`` at once (the DAG cost of that root);
* DP over the chain: ``best[k][p] = min_q best[k-1][q] + cost_k(q → p)``; the last piece ends replicated.

The chosen fragments are stitched into one flat :class:`~unity_eq.plan.Plan` (tensors renamed per copy,
weights mapped to each copy's own), so lowering and the runtime see an ordinary plan.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from typing_extensions import assert_never

from unity_eq.cost import ZERO, Cost, CostModel
from unity_eq.egraph import (
    EGraphData,
    Encoding,
    ENode,
    Limits,
    SaturationResult,
    StopReason,
    encode,
    parse_serialized,
    saturate,
)
from unity_eq.errors import ExtractionError
from unity_eq.extract.baselines import Restriction
from unity_eq.extract.build import PlanBuilder
from unity_eq.extract.chooser import IlpChooser
from unity_eq.extract.extractor import Extraction, Extractor
from unity_eq.extract.greedy import dag_cost, greedy_dag, repair_choice
from unity_eq.extract.pricing import INF
from unity_eq.ir import Graph, Mesh, Node, Replicate, Shard
from unity_eq.plan import (
    AllGather,
    AllReduce,
    Compute,
    LoadInput,
    LoadWeight,
    Plan,
    PlanTensor,
    Replicated,
    Slice,
    Step,
)
from unity_eq.rulesets import RuleFile

__all__ = ["BlockExtractor", "BlockSplit", "Piece", "saturate_pieces", "split_graph"]

Key = tuple[str, ...]  # a placement per mesh axis, short forms: ("S(0)", "R")
Say = Callable[[str], None]

MIN_PIECE_NODES = 8
SMALL_CONSTANT = 64  # integer constants up to this many elements are part of a piece's signature


# ----------------------------------------------------------------------------------------------------------
# Splitting


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

    def to_json(self) -> dict[str, Any]:
        counts = Counter(p.signature for p in self.pieces)
        return {
            "pieces": len(self.pieces),
            "distinct": len(counts),
            "nodes_per_piece": [len(p.nodes) for p in self.pieces],
            "cuts": [p.stream_out for p in self.pieces[:-1]],
            "copies": sorted(counts.values(), reverse=True),
        }


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
    initializers = {name: graph.initializers[name] for name in used if name in graph.initializers}
    names = used | made | set(inputs) | set(outputs)
    types = {name: graph.types[name] for name in names if name in graph.types}
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


def _instance_names(graph: Graph, rep: Piece, copy: Piece) -> dict[str, str]:
    """Tensor names of the representative → the same tensors of a copy (same signature)."""
    mapping: dict[str, str] = {}
    if rep.stream_in is not None and copy.stream_in is not None:
        mapping[rep.stream_in] = copy.stream_in
    for a, b in zip(rep.nodes, copy.nodes, strict=True):
        for x, y in zip(a.inputs, b.inputs, strict=True):
            if x and y and x not in mapping:
                mapping[x] = y
        for x, y in zip(a.outputs, b.outputs, strict=True):
            if x and y:
                mapping[x] = y
    return mapping


# ----------------------------------------------------------------------------------------------------------
# Boundary placements


def boundary_keys(shape: Sequence[int], mesh: Mesh) -> list[Key]:
    """Placements a boundary tensor may take: each axis replicated or sharding a distinct dimension it
    divides. Partial sums do not cross pieces (the piece reduces first)."""
    options = []
    for size in mesh.sizes:
        axis_options = ["R"] + [f"S({d})" for d, n in enumerate(shape) if size > 1 and n % size == 0 and n >= size]
        options.append(axis_options)
    keys = []
    for combo in itertools.product(*options):
        dims = [state for state in combo if state != "R"]
        if len(dims) == len(set(dims)):
            keys.append(tuple(combo))
    return keys


def _chain(term: str, key: Key, mesh: Mesh) -> str:
    for state, axis in zip(key, mesh.axes, strict=True):
        if state != "R":
            term = f'(Partition {term} {state[2:-1]} "{axis}")'
    return term


def _replicated(mesh: Mesh) -> Key:
    return ("R",) * len(mesh.axes)


def _allowed_key(key: Key, restriction: Restriction) -> bool:
    """Boundary placements an extraction under ``restriction`` may use."""
    if key == ("R",) * len(key):
        return True
    if not restriction.parallel or not restriction.shard_activations:
        return False
    return restriction.axes is None or all(state == "R" for state in key)  # single-axis TP keeps R boundaries


# ----------------------------------------------------------------------------------------------------------
# Saturation of the distinct pieces


@dataclass
class PieceSolution:
    """One distinct piece, saturated on one mesh, with its boundary variant tensors."""

    piece: Piece
    graph: Graph
    encoding: Encoding
    saturation: SaturationResult
    data: EGraphData
    in_keys: list[Key]
    out_keys: list[Key]


@dataclass
class BlockSaturation:
    split: BlockSplit
    mesh: Mesh
    solutions: dict[str, PieceSolution]
    total: SaturationResult  # the pieces' saturations added up (stats for plan.json)


IN, OUT = "@in", "@out"


def _variant_name(prefix: str, key: Key) -> str:
    return f"{prefix}:{','.join(key)}"


def _encode_piece(graph: Graph, piece: Piece, mesh: Mesh) -> tuple[Encoding, list[Key], list[Key]]:
    encoding = encode(graph, mesh)
    lines = []
    in_keys = [_replicated(mesh)]
    out_keys = [_replicated(mesh)]
    if piece.stream_in is not None:
        in_keys = boundary_keys(graph.types[piece.stream_in].shape, mesh)
        base = f"(Tensor {encoding.tensor_ids[piece.stream_in]})"
        for key in in_keys[1:]:
            ident = len(encoding.tensor_ids)
            encoding.tensor_ids[_variant_name(IN, key)] = ident
            lines.append(f"(union (Tensor {ident}) {_chain(base, key, mesh)})")
    if piece.stream_out is not None:
        out_keys = boundary_keys(graph.types[piece.stream_out].shape, mesh)
        base = f"(Tensor {encoding.tensor_ids[piece.stream_out]})"
        for key in out_keys[1:]:
            ident = len(encoding.tensor_ids)
            encoding.tensor_ids[_variant_name(OUT, key)] = ident
            lines.append(f"(union (Tensor {ident}) {_chain(base, key, mesh)})")
    encoding.program += "\n".join(lines) + "\n"
    return encoding, in_keys, out_keys


def saturate_pieces(
    split: BlockSplit, mesh: Mesh, rules: list[RuleFile], limits: Limits, say: Say | None = None
) -> BlockSaturation:
    """Saturate every distinct piece once for ``mesh``."""
    say = say or (lambda _m: None)
    solutions: dict[str, PieceSolution] = {}
    results = []
    for signature, rep in split.distinct.items():
        graph = piece_graph(split.graph, rep)
        encoding, in_keys, out_keys = _encode_piece(graph, rep, mesh)
        result = saturate(rules, encoding, limits)
        say(f"piece {rep.index} ({len(rep.nodes)} nodes): {result.enodes} e-nodes, {result.seconds:.1f} s")
        data = parse_serialized(result.serialized)
        result.serialized = {}  # parsed: keep one copy, not two
        solutions[signature] = PieceSolution(rep, graph, encoding, result, data, in_keys, out_keys)
        results.append(result)
    worst = next((r.stop_reason for r in results if r.stop_reason is not StopReason.SATURATED), StopReason.SATURATED)
    total = SaturationResult(
        {},
        worst,
        max(r.iterations for r in results),
        sum(r.enodes for r in results),
        sum(r.seconds for r in results),
        [],
        max(r.worker_peak_mib for r in results),
    )
    return BlockSaturation(split, mesh, solutions, total)


# ----------------------------------------------------------------------------------------------------------
# Extraction: per piece and incoming placement, then DP over the chain, then stitching


@dataclass
class _Option:
    """A piece extracted for one incoming placement: every outgoing placement's root and DAG cost."""

    choice: dict[str, ENode]
    costs: dict[str, Cost]  # step costs (the arrival priced in)
    out_cost: dict[Key, float]  # objective (penalized) seconds per outgoing placement
    totals: dict[str, float]  # the objective per e-node this option was extracted with


@dataclass
class BlockExtractor:
    """Extracts plans for a split model on one mesh, with the interface of :class:`Extractor`."""

    saturation: BlockSaturation
    graph: Graph
    model: CostModel
    extractors: dict[str, Extractor] = field(default_factory=dict)
    arrivals: dict[str, dict[Key, ENode]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for signature, sol in self.saturation.solutions.items():
            inputs = frozenset({sol.piece.stream_in}) if sol.piece.stream_in is not None else frozenset()
            extractor = Extractor(sol.data, sol.encoding, sol.graph, self.model, inputs)
            self.extractors[signature] = extractor
            self.arrivals[signature] = self._arrival_leaves(sol, extractor)

    @property
    def encoding(self) -> Encoding:  # what the search reads from an extractor
        return next(iter(self.saturation.solutions.values())).encoding

    def reprice(self, model: CostModel) -> BlockExtractor:
        return BlockExtractor(self.saturation, self.graph, model)

    def _arrival_leaves(self, sol: PieceSolution, extractor: Extractor) -> dict[Key, ENode]:
        """A free leaf in each incoming variant's e-class: the tensor arrives already placed so."""
        leaves: dict[Key, ENode] = {}
        if sol.piece.stream_in is None:
            return leaves
        for key in sol.in_keys[1:]:
            cid = sol.data.tensor_class[sol.encoding.tensor_ids[_variant_name(IN, key)]]
            leaf_id = f"arrive:{','.join(key)}"
            nodes = sol.data.classes[cid].nodes
            leaf = next((n for n in nodes if n.id == leaf_id), None)
            if leaf is None:  # once per e-graph: repriced extractors share it
                leaf = ENode(leaf_id, "Input", cid, (sol.piece.stream_in,))
                nodes.append(leaf)
            extractor.costs[leaf.id] = ZERO
            leaves[key] = leaf
        return leaves

    def _gather_cost(self, shape: Sequence[int], dtype: str, key: Key) -> Cost:
        """All-gathers that make a tensor placed ``key`` whole (last axis first)."""
        local = list(shape)
        for state, size in zip(key, self.model.mesh.sizes, strict=True):
            if state != "R":
                local[int(state[2:-1])] //= size
        itemsize = np.dtype(dtype).itemsize
        cost = ZERO
        for state, axis, size in reversed(list(zip(key, self.model.mesh.axes, self.model.mesh.sizes, strict=True))):
            if state == "R":
                continue
            local[int(state[2:-1])] *= size
            cost = cost + self.model.combine(axis, math.prod(local) * itemsize)
        return cost

    def _option(self, signature: str, key: Key | None, totals: dict[str, float]) -> _Option:
        sol = self.saturation.solutions[signature]
        extractor = self.extractors[signature]
        costs = dict(extractor.costs)
        totals = dict(totals)
        if sol.piece.stream_in is not None and key is not None:
            stream_cls = sol.data.tensor_class[sol.encoding.tensor_ids[sol.piece.stream_in]]
            stream_type = sol.graph.types[sol.piece.stream_in]
            gather = self._gather_cost(stream_type.shape, stream_type.dtype, key)
            for node in sol.data.classes[stream_cls].nodes:
                if node.op == "Input":
                    costs[node.id] = gather
                    totals[node.id] = gather.total
            for leaf_key, leaf in self.arrivals[signature].items():
                totals[leaf.id] = 0.0 if leaf_key == key else INF
        choice = greedy_dag(sol.data, totals, extractor.parents)
        out_cost: dict[Key, float] = {}
        for out_key, root in self._roots(sol).items():
            if root in choice:
                out_cost[out_key] = dag_cost(choice, [root], totals)
        if sol.piece.stream_out is None and out_cost:
            roots = extractor.roots
            out_cost = {_replicated(self.model.mesh): dag_cost(choice, roots, totals)}
        return _Option(choice, costs, out_cost, totals)

    def _roots(self, sol: PieceSolution) -> dict[Key, str]:
        if sol.piece.stream_out is None:
            return {_replicated(self.model.mesh): self.extractors[sol.piece.signature].roots[0]}
        ids = sol.encoding.tensor_ids
        roots = {sol.out_keys[0]: sol.data.tensor_class[ids[sol.piece.stream_out]]}
        for key in sol.out_keys[1:]:
            roots[key] = sol.data.tensor_class[ids[_variant_name(OUT, key)]]
        return roots

    def extract(
        self,
        restriction: Restriction | None = None,
        penalty: float = 0.0,
        method: str = "greedy",
        time_limit_s: float = 60.0,
    ) -> Extraction:
        """The cheapest stitched plan: each piece extracted per incoming placement, DP over the cuts.

        ``method="ilp"`` then re-extracts every distinct (piece, incoming, outgoing placement) of the chosen
        chain exactly (unity_eq.extract.ilp), sharing ``time_limit_s`` between them.
        """
        if method not in ("greedy", "ilp"):
            raise ExtractionError(f"`--extractor`: expected greedy or ilp, got {method!r}")
        restriction = restriction or Restriction()
        options: dict[tuple[str, Key | None], _Option] = {}
        for signature, sol in self.saturation.solutions.items():
            totals = self.extractors[signature].totals(restriction, penalty)
            keys: list[Key | None] = [None] if sol.piece.stream_in is None else list(sol.in_keys)
            for key in keys:
                if key is None or _allowed_key(key, restriction):
                    options[(signature, key)] = self._option(signature, key, totals)
        chosen = self._dynamic_program(options, restriction)
        reports: list[Any] = []
        exact: dict[tuple[str, Key | None, Key], dict[str, ENode]] = {}
        if method == "ilp":
            exact, reports = self._exact(chosen, options, time_limit_s)
        plan = self._stitch(chosen, options, exact)
        return Extraction(plan, restriction, penalty, reports)

    def _exact(
        self,
        chain: list[tuple[Key | None, Key]],
        options: dict[tuple[str, Key | None], _Option],
        time_limit_s: float,
    ) -> tuple[dict[tuple[str, Key | None, Key], dict[str, ENode]], list[Any]]:
        """Exact extraction of each distinct fragment of the chain, seeded with its greedy choice."""
        wanted = list(
            dict.fromkeys((p.signature, q, o) for p, (q, o) in zip(self.saturation.split.pieces, chain, strict=True))
        )
        budget = time_limit_s / max(len(wanted), 1)
        exact, reports = {}, []
        for signature, in_key, out_key in wanted:
            sol = self.saturation.solutions[signature]
            option = options[(signature, in_key)]
            roots = self._fragment_roots(sol, out_key)
            seed = repair_choice(sol.data, option.choice, option.totals, roots)
            chosen = IlpChooser(budget).choose(sol.data, option.totals, roots, seed)
            exact[(signature, in_key, out_key)] = chosen.choice
            reports.extend(chosen.reports)
        return exact, reports

    def _fragment_roots(self, sol: PieceSolution, out_key: Key) -> list[str]:
        if sol.piece.stream_out is None:
            return self.extractors[sol.piece.signature].roots
        return [self._roots(sol)[out_key]]

    def _dynamic_program(
        self, options: dict[tuple[str, Key | None], _Option], restriction: Restriction
    ) -> list[tuple[Key | None, Key]]:
        """For every piece, the (incoming, outgoing) placements of the cheapest chain."""
        pieces = self.saturation.split.pieces
        best: list[dict[Key, tuple[float, Key | None]]] = []
        previous: dict[Key | None, float] = {None: 0.0}
        for piece in pieces:
            layer: dict[Key, tuple[float, Key | None]] = {}
            for in_key, before in previous.items():
                option = options.get((piece.signature, in_key))
                if option is None:
                    continue
                for out_key, cost in option.out_cost.items():
                    if not _allowed_key(out_key, restriction) or cost == INF:
                        continue
                    total = before + cost
                    if out_key not in layer or total < layer[out_key][0]:
                        layer[out_key] = (total, in_key)
            if not layer:
                raise ExtractionError(
                    f"no plan for piece {piece.index} of {len(pieces)} under the {restriction.name} extraction"
                )
            best.append(layer)
            previous = {key: cost for key, (cost, _) in layer.items()}
        final = _replicated(self.model.mesh)
        if final not in best[-1]:
            raise ExtractionError("no plan ends with the model's outputs replicated")
        chain: list[tuple[Key | None, Key]] = []
        leaving: Key | None = final
        for layer in reversed(best):
            assert leaving is not None
            _, arriving = layer[leaving]
            chain.append((arriving, leaving))
            leaving = arriving
        return list(reversed(chain))

    def _stitch(
        self,
        chain: list[tuple[Key | None, Key]],
        options: dict[tuple[str, Key | None], _Option],
        exact: dict[tuple[str, Key | None, Key], dict[str, ENode]],
    ) -> Plan:
        stitcher = _Stitcher(self)
        for piece, (in_key, out_key) in zip(self.saturation.split.pieces, chain, strict=True):
            option = options[(piece.signature, in_key)]
            choice = exact.get((piece.signature, in_key, out_key), option.choice)
            stitcher.add(piece, in_key, out_key, option, choice)
        return stitcher.plan()


class _Stitcher:
    """Joins the chosen fragments into one plan, renaming every copy's tensors and weights."""

    def __init__(self, owner: BlockExtractor) -> None:
        self.owner = owner
        self.mesh = owner.model.mesh
        self.graph = owner.graph
        self.tensors: dict[str, PlanTensor] = {}
        self.steps: list[Step] = []
        self.step_costs: list[Cost] = []
        self.stream: str | None = None  # the tensor leaving the previous piece, as placed
        self.outputs: dict[str, str] = {}

    def add(self, piece: Piece, in_key: Key | None, out_key: Key, option: _Option, choice: dict[str, ENode]) -> None:
        owner = self.owner
        sol = owner.saturation.solutions[piece.signature]
        extractor = owner.extractors[piece.signature]
        root = owner._roots(sol)[out_key]
        out_roots = owner._fragment_roots(sol, out_key)
        choice = repair_choice(sol.data, choice, option.totals, out_roots)
        builder = PlanBuilder(sol.data, choice, sol.encoding, sol.graph, option.costs)
        builder.build(out_roots)
        names = _instance_names(self.graph, sol.piece, piece)
        rename: dict[str, str] = {}

        def name_of(tid: str) -> str:
            if tid in rename:
                return rename[tid]
            tensor = builder.tensors[tid]
            new = names.get(tid) if tid == tensor.source else None
            new = new or f"b{piece.index}.{tid}"
            rename[tid] = new
            placement = tensor.placement
            source = names.get(tensor.source, tensor.source) if tensor.source else None
            self.tensors[new] = PlanTensor(new, tensor.shape, tensor.dtype, placement, source)
            return new

        for step, cost in zip(builder.steps, builder.step_costs, strict=True):
            if isinstance(step, LoadInput) and piece.stream_in is not None and step.name == sol.piece.stream_in:
                self._arrive(step, cost, in_key, rename)
                continue
            self.steps.append(_renamed(step, name_of, names))
            self.step_costs.append(cost)
        if piece.stream_out is None:
            for name, cid in zip(self.graph.outputs, extractor.roots, strict=True):
                self.outputs[name] = name_of(builder.names[cid])
        else:
            self.stream = name_of(builder.names[root])

    def _arrive(self, step: LoadInput, cost: Cost, in_key: Key | None, rename: dict[str, str]) -> None:
        """The incoming tensor: the previous piece's output as placed, or gathered whole from it."""
        assert self.stream is not None
        if step.out.startswith(IN) or in_key is None or all(state == "R" for state in in_key):
            rename[step.out] = self.stream
            return
        # The piece reads the whole tensor while it arrives sharded: gather it, last axis first; the
        # gathers' price is the cost the extraction gave this input.
        current, states, first = self.stream, list(in_key), True
        for i in reversed(range(len(states))):
            if states[i] == "R":
                continue
            dim = int(states[i][2:-1])
            states[i] = "R"
            new = f"{current}.gathered.{self.mesh.axes[i]}"
            source = self.tensors[current]
            placement = tuple(Shard(int(st[2:-1])) if st != "R" else Replicate() for st in states)
            self.tensors[new] = PlanTensor(new, source.shape, source.dtype, placement, source.source)
            self.steps.append(AllGather(new, current, dim, self.mesh.axes[i]))
            self.step_costs.append(cost if first else ZERO)
            first = False
            current = new
        rename[step.out] = current

    def plan(self) -> Plan:
        total = ZERO
        for cost in self.step_costs:
            total = total + cost
        return Plan(
            model=self.graph.name,
            mesh=self.mesh,
            machine=self.owner.model.machine,
            objective=self.owner.model.objective,
            tensors=self.tensors,
            steps=self.steps,
            inputs=list(self.graph.inputs),
            outputs=self.outputs,
            cost=total,
            step_costs=self.step_costs,
        )


def _renamed(step: Step, name_of: Callable[[str], str], weights: dict[str, str]) -> Step:
    match step:
        case LoadInput(out=out, name=name):
            return LoadInput(name_of(out), name)
        case LoadWeight(out=out, name=name):
            return LoadWeight(name_of(out), weights.get(name, name))
        case Compute(outputs=outputs, op_type=op, inputs=inputs, attrs=attrs, domain=domain, node=node):
            return Compute(
                tuple(name_of(o) if o else "" for o in outputs),
                op,
                tuple(name_of(i) if isinstance(i, str) else i for i in inputs),
                attrs,
                domain,
                node,
            )
        case Slice(out=out, src=src, dim=dim, axis=axis):
            return Slice(name_of(out), name_of(src), dim, axis)
        case AllGather(out=out, src=src, dim=dim, axis=axis):
            return AllGather(name_of(out), name_of(src), dim, axis)
        case AllReduce(out=out, src=src, axis=axis):
            return AllReduce(name_of(out), name_of(src), axis)
        case Replicated(out=out, src=src, axis=axis):
            return Replicated(name_of(out), name_of(src), axis)
        case _:
            assert_never(step)

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
* side tensors (an attention mask every layer reads: unity_eq.split) are plain inputs of the piece graphs
  that read them and extra outputs of the first piece, which makes them: they cross cuts replicated, as a
  model input would arrive, so they add no placement variants and no DP state.

The chosen fragments are stitched into one flat :class:`~unity_eq.plan.Plan` (tensors renamed per copy,
weights mapped to each copy's own), so lowering and the runtime see an ordinary plan.

Three modules share the job: ``unity_eq.split`` cuts the graph and finds identical pieces, this module
encodes and saturates each distinct piece per boundary placement, and ``unity_eq.extract.blocks`` runs the
DP and stitches the plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unity_eq.egraph import (
    EGraphData,
    Encoding,
    Limits,
    SaturationResult,
    StopReason,
    encode,
    parse_serialized,
    saturate,
)
from unity_eq.ir import Graph, Mesh
from unity_eq.rulefile.manifest import RuleFile
from unity_eq.split import BlockSplit, Piece, piece_graph

Key = tuple[str, ...]  # a placement per mesh axis, short forms: ("S(0)", "R")


Say = Callable[[str], None]


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


def replicated_key(mesh: Mesh) -> Key:
    return ("R",) * len(mesh.axes)


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


def variant_name(prefix: str, key: Key) -> str:
    return f"{prefix}:{','.join(key)}"


def _encode_piece(graph: Graph, piece: Piece, mesh: Mesh) -> tuple[Encoding, list[Key], list[Key]]:
    encoding = encode(graph, mesh)
    lines: list[str] = []
    in_keys = _boundary_variants(graph, encoding, mesh, piece.stream_in, IN, lines)
    out_keys = _boundary_variants(graph, encoding, mesh, piece.stream_out, OUT, lines)
    encoding.program += "\n".join(lines) + "\n"
    return encoding, in_keys, out_keys


def _boundary_variants(
    graph: Graph, encoding: Encoding, mesh: Mesh, tensor: str | None, prefix: str, lines: list[str]
) -> list[Key]:
    """The placements a piece's boundary ``tensor`` may take (replicated only when there is none): each but the
    first becomes a tensor of its own (``prefix``), unioned with the chain of collectives that makes it."""
    if tensor is None:
        return [replicated_key(mesh)]
    keys = boundary_keys(graph.types[tensor].shape, mesh)
    base = f"(Tensor {encoding.tensor_ids[tensor]})"
    for key in keys[1:]:
        ident = len(encoding.tensor_ids)
        encoding.tensor_ids[variant_name(prefix, key)] = ident
        lines.append(f"(union (Tensor {ident}) {_chain(base, key, mesh)})")
    return keys


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

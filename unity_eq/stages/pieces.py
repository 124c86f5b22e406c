"""What one piece of a model costs on one tensor group at one microbatch size, from the e-graph.

The stage search composes pipeline stages out of pieces (``unity_eq.split``: a transformer's layers). Each
distinct piece is saturated once per (tensor-group size, microbatch size) on a one-axis mesh over the first
devices of a node, and extracted several ways (unrestricted, data parallel, tensor parallel): every
extraction is an intra-op plan of the piece, and :class:`PieceCost` keeps what the stage search needs of it —
per-microbatch compute and collectives, the once-per-iteration gradient traffic inside the group, and the
bytes each device holds. The piece enters and leaves replicated on its group (as Megatron-LM's layers do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from unity_eq.blocks import saturate_pieces
from unity_eq.cost import CostModel, Objective, cheaper
from unity_eq.dtypes import is_float
from unity_eq.egraph import Limits
from unity_eq.errors import OptionError
from unity_eq.extract import Extractor, Restriction, candidate_restrictions, extract_variants
from unity_eq.ir import Graph, Mesh
from unity_eq.machine import Machine
from unity_eq.memory import kept_names, plan_memory
from unity_eq.plan import Plan
from unity_eq.report import cost_breakdown
from unity_eq.rulefile.manifest import RuleFile
from unity_eq.split import BlockSplit, Piece, split_graph

__all__ = ["GraphAt", "PieceCost", "PieceTable", "price_pieces"]

#: The model at a given batch size (the microbatch): the stage search asks for each size it tries.
GraphAt = Callable[[int], Graph]
Say = Callable[[str], None]


@dataclass(frozen=True)
class PieceCost:
    """One intra-op plan of one piece on a group of ``group`` devices, for one microbatch.

    Seconds are per microbatch except ``gradient_s`` (the group's own gradient all-reduces: replicated weights
    such as layer-norm scales, once per iteration). Bytes are per device.
    """

    extraction: str  # which extraction made it (greedy, data_parallel, tensor_parallel(x))
    compute_s: float  # forward (and backward, in training) compute
    comm_s: float  # activation collectives inside the group (forward and backward)
    gradient_s: float
    forward_s: float  # the forward pass alone (compute + its collectives): what recomputation repeats
    weight_bytes: float
    state_bytes: float  # gradients and optimizer state (training)
    trainable_bytes: float  # of weight_bytes, the trainable weights' (the rest are constants: no gradient)
    activation_bytes: float  # kept for the backward pass (training; side tensors apart) or the peak alive (inference)
    input_bytes: float  # the incoming activation, whole: what full recomputation keeps per microbatch
    output_bytes: float  # the outgoing activation, whole: what a stage boundary sends
    weight_itemsize: int  # bytes per weight element (mixed precision: 16-bit weights, fp32 master copy)
    #: training: the piece's side tensors (positions in ``side_in`` then ``side_out``) its backward keeps. Its stage
    #: holds each once per microbatch in flight (``stages.evaluate``), so ``activation_bytes`` leaves them out
    side_kept: tuple[int, ...] = ()
    #: the intra-op plan these figures price (of the piece's representative: ``split.BlockSplit.distinct``),
    #: which lowering stitches into the stage's plan (``stages.stitch``), so what is written is what was priced
    plan: Plan | None = field(default=None, compare=False, repr=False)

    @property
    def step_s(self) -> float:
        """Forward (+ backward) of one microbatch: compute and the group's collectives."""
        return self.compute_s + self.comm_s


@dataclass
class PieceTable:
    """Every piece's intra-op options, per (group size, microbatch size)."""

    pieces: list[Piece]  # in model order (from the split at the smallest microbatch)
    #: (tensor-group size, microbatch, device group) → per piece, its options
    options: dict[tuple[int, int, int], list[list[PieceCost]]]
    signatures: dict[tuple[int, int], int]  # distinct pieces saturated per (tensor-group size, microbatch)
    enodes: int = 0
    saturate_s: float = 0.0
    #: microbatch → the whole bytes of each side tensor (an attention mask every layer reads, made by the first
    #: piece: ``split``), which the first stage sends to every later stage that reads it, once per microbatch
    side_bytes: dict[int, dict[str, float]] = field(default_factory=dict)

    def costs(self, tensor: int, micro: int, group: int = 0) -> list[list[PieceCost]]:
        return self.options[(tensor, micro, group)]


def _group_mesh(size: int, devices: Sequence[int] | None = None) -> Mesh:
    return Mesh(("x",), (size,), tuple(devices[:size]) if devices is not None else tuple(range(size)))


def _extractions(extractor: Extractor, method: str = "greedy") -> list[tuple[str, Plan]]:
    """A piece's candidate plans on its tensor group (a one-axis mesh ``x``): the mesh search's variants
    without the strict data-parallel one; with ``method`` differentiable (or ilp: the stage search prices many
    pieces, so it runs the relaxed search only), also the relaxed search's plan when it is cheaper than
    greedy's and fits."""
    restrictions = candidate_restrictions(("x",), strict_data_parallel=False)
    found = [(e.restriction.name, e.plan) for e in extract_variants(extractor, restrictions)]
    if method != "greedy":
        plan = extractor.extract(Restriction(), method="differentiable").plan
        if cheaper(plan.cost.total, found[0][1].cost.total) and plan_memory(plan).fits:
            found.append(("differentiable", plan))
    return found


def _weight_itemsize(graph: Graph, piece: Piece) -> int:
    """Bytes per element of the piece's floating-point weights (the widest, when they differ)."""
    sizes = [
        graph.initializers[name].dtype.itemsize
        for node in piece.nodes
        for name in node.inputs
        if name in graph.initializers and is_float(graph.initializers[name].dtype)
    ]
    return max(sizes, default=4)


def _piece_cost(name: str, plan: Plan, graph: Graph, piece: Piece, objective: Objective) -> PieceCost:
    breakdown = cost_breakdown(plan)
    assert breakdown.communication_by_axis is not None  # a one-axis mesh has one
    traffic = next(iter(breakdown.communication_by_axis.values()))
    side = (*piece.side_in, *piece.side_out)
    # the next piece keeps what it needs; the stage holds the side tensors once, for all its pieces
    memory = plan_memory(plan, keep_outputs=piece.stream_out is None, held_apart=side)
    kept = kept_names(plan, side) if objective.training else frozenset()
    itemsize = _weight_itemsize(graph, piece)
    # the forward's compute (compute is forward + backward in training) and its collectives, which the cost model
    # prices once (unscaled) in training: what a recomputed forward repeats
    forward = plan.cost.compute / objective.compute_factor + traffic.forward_s
    return PieceCost(
        extraction=name,
        compute_s=plan.cost.compute,
        comm_s=traffic.forward_s + traffic.backward_s,
        gradient_s=traffic.gradient_s,
        forward_s=forward,
        weight_bytes=memory.weights,
        state_bytes=memory.weight_state,
        trainable_bytes=memory.trainable,
        activation_bytes=memory.activations,
        input_bytes=float(graph.types[piece.stream_in].nbytes) if piece.stream_in else 0.0,
        output_bytes=float(graph.types[piece.stream_out].nbytes) if piece.stream_out else 0.0,
        weight_itemsize=itemsize,
        side_kept=tuple(k for k, name in enumerate(side) if name in kept),
        plan=plan,
    )


def _price_split(
    split: BlockSplit,
    size: int,
    groups: Sequence[Sequence[int]],
    machine: Machine,
    objective: Objective,
    rules: list[RuleFile],
    limits: Limits,
    method: str = "greedy",
) -> tuple[list[dict[str, list[PieceCost]]], int, float]:
    """Each distinct piece of ``split`` saturated once on a tensor group of ``size`` devices (the e-graph
    does not depend on the devices), then extracted on each device group's first ``size`` devices."""
    saturation = saturate_pieces(split, _group_mesh(size), rules, limits)
    found: list[dict[str, list[PieceCost]]] = []
    for devices in groups:
        model = CostModel(machine, _group_mesh(size, devices), objective)
        costs: dict[str, list[PieceCost]] = {}
        for signature, sol in saturation.solutions.items():
            inputs = frozenset({sol.piece.stream_in}) if sol.piece.stream_in is not None else frozenset()
            extractor = Extractor(sol.data, sol.encoding, sol.graph, model, inputs)
            costs[signature] = [
                _piece_cost(name, plan, split.graph, sol.piece, objective)
                for name, plan in _extractions(extractor, method)
            ]
        found.append(costs)
    return found, saturation.total.enodes, saturation.total.seconds


def price_pieces(
    graph_at: GraphAt,
    micro_sizes: Sequence[int],
    group_sizes: Sequence[int],
    machine: Machine,
    objective: Objective,
    rules: list[RuleFile],
    limits: Limits | None = None,
    *,
    workers: int = 2,
    say: Say | None = None,
    groups: Sequence[Sequence[int]] | None = None,
    pairs: Sequence[tuple[int, int]] | None = None,
    extractor: str = "greedy",
) -> PieceTable:
    """Saturate and extract every distinct piece for each microbatch and group size (``workers`` at a time),
    priced on each of the machine's device ``groups`` (one kind each; default: all devices as one group).
    ``pairs``: only these (group size, microbatch) pairs (``search.priced_pairs``), not every combination.
    ``extractor``: ``differentiable`` or ``ilp`` adds each piece's differentiable extraction as an option.

    Raises OptionError when the model does not split into pieces, or splits differently at two microbatch
    sizes (a cut that depends on the batch: the stages could not be the same pieces)."""
    say = say or (lambda _m: None)
    limits = limits or Limits()
    jobs = list(pairs) if pairs is not None else [(g, m) for m in micro_sizes for g in group_sizes]
    micro_sizes = sorted({m for _, m in jobs})
    splits: dict[int, BlockSplit] = {}
    for micro in micro_sizes:
        split = split_graph(graph_at(micro))
        if split is None:
            raise OptionError(
                "the model does not split into pieces (no tensor is alone live between its layers), so it "
                "cannot be cut into pipeline stages; plan it without `--pipeline`."
            )
        splits[micro] = split
    first = splits[min(micro_sizes)]
    for micro, split in splits.items():
        cuts = [(p.stream_in, p.stream_out, p.side_in) for p in split.pieces]
        if cuts != [(p.stream_in, p.stream_out, p.side_in) for p in first.pieces]:
            raise OptionError(
                f"the model splits into {len(first.pieces)} pieces at microbatch {min(micro_sizes)} and "
                f"{len(split.pieces)} at {micro}: its cuts depend on the batch size, so it cannot be staged."
            )
    table = PieceTable(list(first.pieces), {}, {})
    for micro, split in splits.items():
        side = split.pieces[0].side_out
        table.side_bytes[micro] = {name: float(split.graph.types[name].nbytes) for name in side}

    device_sets = [tuple(g) for g in groups] if groups is not None else [tuple(range(machine.device_count))]

    def run(job: tuple[int, int]) -> tuple[tuple[int, int], list[dict[str, list[PieceCost]]], int, float]:
        size, micro = job
        found, enodes, seconds = _price_split(
            splits[micro], size, device_sets, machine, objective, rules, limits, extractor
        )
        return job, found, enodes, seconds

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (size, micro), found, enodes, seconds in pool.map(run, jobs):
            split = splits[micro]
            for index, costs in enumerate(found):
                table.options[(size, micro, index)] = [costs[p.signature] for p in split.pieces]
            table.signatures[(size, micro)] = len(found[0])
            table.enodes += enodes
            table.saturate_s += seconds
            say(f"pieces on {size} device(s) at microbatch {micro}: {len(found[0])} distinct, {enodes} e-nodes")
    return table

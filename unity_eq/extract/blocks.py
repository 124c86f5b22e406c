"""The block DP: extraction of a split model, piece by piece, joined by dynamic programming over the placements
of the tensors between pieces, and the chosen fragments stitched into one flat Plan.

:class:`BlockExtractor` has the interface of :class:`~unity_eq.extract.Extractor` (``extract``, ``reprice``),
so the search uses either; each fragment is chosen by the same choosers and built by the same builder.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from unity_eq.blocks import IN, OUT, BlockSaturation, Key, PieceSolution, replicated_key, variant_name
from unity_eq.collectives import ALL_GATHER
from unity_eq.cost import ZERO, Cost, CostModel
from unity_eq.egraph import (
    Encoding,
    ENode,
)
from unity_eq.errors import ExtractionError
from unity_eq.extract.baselines import Restriction
from unity_eq.extract.build import PlanBuilder
from unity_eq.extract.chooser import Chooser, ExtractionMethod, IlpChooser
from unity_eq.extract.differentiable import DifferentiableChooser
from unity_eq.extract.extractor import Extraction, Extractor, PlanExtractor
from unity_eq.extract.greedy import dag_cost, greedy_dag, repair_choice
from unity_eq.extract.pricing import INF
from unity_eq.ir import Graph, Replicate, Shard
from unity_eq.plan import (
    AllGather,
    LoadInput,
    Plan,
    PlanTensor,
    Step,
    renamed_step,
)
from unity_eq.split import Piece


def _allowed_key(key: Key, restriction: Restriction) -> bool:
    """Boundary placements an extraction under ``restriction`` may use."""
    if key == ("R",) * len(key):
        return True
    if not restriction.parallel or not restriction.shard_activations:
        return False
    return restriction.axes is None or all(state == "R" for state in key)  # single-axis TP keeps R boundaries


@dataclass
class _Option:
    """A piece extracted for one incoming placement: every outgoing placement's root and DAG cost."""

    choice: dict[str, ENode]
    costs: dict[str, Cost]  # step costs (the arrival priced in)
    out_cost: dict[Key, float]  # objective (penalized) seconds per outgoing placement
    totals: dict[str, float]  # the objective per e-node this option was extracted with


@dataclass
class BlockExtractor(PlanExtractor):
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
            cid = sol.data.tensor_class[sol.encoding.tensor_ids[variant_name(IN, key)]]
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
            gathered = math.prod(local) * itemsize
            cost = cost + ALL_GATHER.price(self.model, axis, gathered / size, gathered, "activation")
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
        side = self._side_roots(sol)
        for out_key, root in self._roots(sol).items():
            if root in choice and all(r in choice for r in side):
                out_cost[out_key] = dag_cost(choice, [root, *side], totals)
        if sol.piece.stream_out is None and out_cost:
            roots = extractor.roots
            out_cost = {replicated_key(self.model.mesh): dag_cost(choice, roots, totals)}
        return _Option(choice, costs, out_cost, totals)

    def _roots(self, sol: PieceSolution) -> dict[Key, str]:
        if sol.piece.stream_out is None:
            return {replicated_key(self.model.mesh): self.extractors[sol.piece.signature].roots[0]}
        ids = sol.encoding.tensor_ids
        roots = {sol.out_keys[0]: sol.data.tensor_class[ids[sol.piece.stream_out]]}
        for key in sol.out_keys[1:]:
            roots[key] = sol.data.tensor_class[ids[variant_name(OUT, key)]]
        return roots

    def extract_with(
        self, restriction: Restriction, penalty: float, method: ExtractionMethod, time_limit_s: float
    ) -> Extraction:
        """The cheapest stitched plan: each piece extracted per incoming placement, DP over the cuts.

        ``method="differentiable"`` then re-extracts every distinct (piece, incoming, outgoing placement) of the
        chosen chain with the relaxed search (unity_eq.extract.differentiable) from its greedy choice;
        ``method="ilp"`` does that and then solves each exactly (unity_eq.extract.ilp) from the cheaper choice,
        sharing ``time_limit_s`` between them. ``stages`` holds the stitched plan after each.
        """
        options: dict[tuple[str, Key | None], _Option] = {}
        for signature, sol in self.saturation.solutions.items():
            totals = self.extractors[signature].totals(restriction, penalty)
            keys: list[Key | None] = [None] if sol.piece.stream_in is None else list(sol.in_keys)
            for key in keys:
                if key is None or _allowed_key(key, restriction):
                    options[(signature, key)] = self._option(signature, key, totals)
        chosen = self._dynamic_program(options, restriction)
        if method == ExtractionMethod.GREEDY:
            return Extraction(self._stitch(chosen, options, {}), restriction, penalty)
        pieces = self.saturation.split.pieces
        wanted = list(dict.fromkeys((p.signature, q, o) for p, (q, o) in zip(pieces, chosen, strict=True)))
        seeds = {fragment: self._seed(fragment, options) for fragment in wanted}
        result = Extraction(self._stitch(chosen, options, seeds), restriction, penalty)
        result.stages["greedy"] = result.plan
        for stage in ["differentiable"] + (["ilp"] if method == ExtractionMethod.ILP else []):
            self._refine(stage, seeds, options, time_limit_s / max(len(wanted), 1), result)
            result.stages[stage] = result.plan = self._stitch(chosen, options, seeds)
        return result

    def _refine(
        self,
        stage: str,
        seeds: dict[tuple[str, Key | None, Key], dict[str, ENode]],
        options: dict[tuple[str, Key | None], _Option],
        time_limit_s: float,
        result: Extraction,
    ) -> None:
        """Re-extract each fragment of ``seeds`` with the ``stage`` chooser from its current choice, in place;
        the choosers' reports go to ``result``. The differentiable searches together are sized to the DP's
        greedy extractions (one per option): each fragment gets options / fragments times its own greedy time."""
        effort = len(options) / max(len(seeds), 1)
        for fragment, seed in seeds.items():
            signature, in_key, out_key = fragment
            sol = self.saturation.solutions[signature]
            option = options[(signature, in_key)]
            chooser: Chooser = (
                IlpChooser(time_limit_s)
                if stage == "ilp"
                else DifferentiableChooser(
                    memory=self.extractors[signature].node_memory(),
                    effort=effort,
                    layout=self.extractors[signature].relax_layout(),
                )
            )
            found = chooser.choose(sol.data, option.totals, self._fragment_roots(sol, out_key), seed)
            seeds[fragment] = found.choice
            result.ilp.extend(found.reports)
            result.relaxed.extend(found.relaxed)

    def _seed(
        self, key: tuple[str, Key | None, Key], options: dict[tuple[str, Key | None], _Option]
    ) -> dict[str, ENode]:
        """The greedy choice of one fragment of the chain, repaired (acyclic, multi-output nodes adopted)."""
        signature, in_key, out_key = key
        sol = self.saturation.solutions[signature]
        option = options[(signature, in_key)]
        return repair_choice(sol.data, option.choice, option.totals, self._fragment_roots(sol, out_key))

    def _side_roots(self, sol: PieceSolution) -> list[str]:
        """The e-classes of the side tensors the piece makes for later pieces (whole, replicated)."""
        return [sol.data.tensor_class[sol.encoding.tensor_ids[name]] for name in sol.piece.side_out]

    def _fragment_roots(self, sol: PieceSolution, out_key: Key) -> list[str]:
        if sol.piece.stream_out is None:
            return self.extractors[sol.piece.signature].roots
        return [self._roots(sol)[out_key], *self._side_roots(sol)]

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
        final = replicated_key(self.model.mesh)
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
        self.side: dict[str, str] = {}  # a side tensor of the model → its replicated tensor in the plan
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
        names = sol.piece.instance_names(piece)
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
            if isinstance(step, LoadInput) and step.name in sol.piece.side_in:
                rename[step.out] = self.side[names[step.name]]  # made replicated by the first piece
                continue
            self.steps.append(renamed_step(step, name_of, names, {}))
            self.step_costs.append(cost)
        if piece.stream_out is None:
            for name, cid in zip(self.graph.outputs, extractor.roots, strict=True):
                self.outputs[name] = name_of(builder.names[cid])
        else:
            self.stream = name_of(builder.names[root])
        for name, cid in zip(piece.side_out, owner._side_roots(sol), strict=True):
            self.side[name] = name_of(builder.names[cid])
            if not all(isinstance(state, Replicate) for state in self.tensors[self.side[name]].placement):
                raise ExtractionError(f"side tensor {name!r} was not made whole by the first piece")

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
            weight_origins=self.graph.weight_origins(),
        )

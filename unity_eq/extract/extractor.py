"""The façade the search uses: one saturated e-graph priced once under one cost model, extracted under
restrictions and memory penalties by a chain of choosers: greedy; ``differentiable`` adds the relaxed search
(unity_eq.extract.differentiable) seeded with greedy's plan; ``ilp`` adds both it and the exact program, which
starts from the cheaper of the two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from unity_eq.cost import CostModel
from unity_eq.egraph import EGraphData, Encoding
from unity_eq.errors import ExtractionError
from unity_eq.extract.baselines import Restriction
from unity_eq.extract.build import PlanBuilder, build_plan, check_invariants, output_classes
from unity_eq.extract.chooser import Choice, Chooser, ExtractionMethod, Unreachable, chooser_chain
from unity_eq.extract.differentiable import DifferentiableChooser, RelaxReport
from unity_eq.extract.greedy import parents_of
from unity_eq.extract.pricing import (
    INF,
    LEAVES,
    PARALLEL_OPS,
    WEIGHT_KINDS,
    class_bytes,
    derives_from,
    floating_dtype,
    itemsize,
    local_shapes,
    node_costs,
    source_kinds,
)
from unity_eq.extract.relax import Layout, layout_of
from unity_eq.ir import Graph
from unity_eq.plan import (
    Plan,
)


@dataclass
class Extraction:
    """One extracted plan with the knobs that produced it."""

    plan: Plan
    restriction: Restriction
    penalty: float  # seconds per byte of per-device memory added to every node's cost
    ilp: list[Any] = field(default_factory=list)  # IlpReport of each exact extraction behind the plan
    relaxed: list[RelaxReport] = field(default_factory=list)  # each differentiable extraction behind the plan
    #: the plan after each chooser of the chain (greedy, differentiable, ilp), for the report's comparison
    stages: dict[str, Plan] = field(default_factory=dict)


class PlanExtractor(ABC):
    """What the search extracts plans with: :class:`Extractor` (one e-graph) or the block DP (pieces,
    unity_eq.extract.blocks.BlockExtractor). :meth:`extract` states the options and their defaults once, for
    both; each implements :meth:`extract_with`."""

    def extract(
        self,
        restriction: Restriction | None = None,
        penalty: float = 0.0,
        method: str = "greedy",
        time_limit_s: float = 60.0,
    ) -> Extraction:
        """The cheapest plan using only nodes ``restriction`` allows (by default, any); ``penalty`` adds seconds
        per byte of the node memory proxy to steer towards plans that fit. ``method`` names the chain of
        choosers (unity_eq.extract.chooser.chooser_chain): the ILP gets ``time_limit_s``. ``stages`` holds the
        plan after each chooser."""
        return self.extract_with(restriction or Restriction(), penalty, ExtractionMethod.checked(method), time_limit_s)

    @abstractmethod
    def extract_with(
        self, restriction: Restriction, penalty: float, method: ExtractionMethod, time_limit_s: float
    ) -> Extraction:
        """:meth:`extract` with its options filled in and checked."""


class Extractor(PlanExtractor):
    """Extracts plans from one saturated e-graph under one cost model, sharing the pricing between runs."""

    def __init__(
        self,
        data: EGraphData,
        encoding: Encoding,
        graph: Graph,
        model: CostModel,
        activation_inputs: frozenset[str] = frozenset(),
    ) -> None:
        """``activation_inputs``: model inputs that are really activations (a block's incoming tensor): they
        are priced like activations (their slices copy, their gradients count) rather than free inputs."""
        check_invariants(data)
        self.data = data
        self.encoding = encoding
        self.graph = graph
        self.model = model
        self.activation_inputs = activation_inputs
        self.locals = local_shapes(data, model)
        self.kinds = source_kinds(data, graph.constants())
        for name in activation_inputs:
            stream = data.tensor_class.get(encoding.tensor_ids[name])
            for cid, kind in list(self.kinds.items()):
                if kind == "input" and (cid == stream or derives_from(data, cid, stream)):
                    floating = floating_dtype(data.classes[cid].dtype)
                    self.kinds[cid] = "activation" if floating else "nograd"
        self.costs = node_costs(data, model, self.locals, self.kinds)
        self.roots = output_classes(data, encoding, graph)
        self._memory: dict[str, float] | None = None
        self._layout: Layout | None = None
        self.parents = parents_of(data)

    def node_memory(self) -> dict[str, float]:
        """A per-node proxy of the memory a choice costs on each device: the bytes of the activation it
        makes, and for an op, the (training: with gradient and optimizer state) weight pieces it reads."""
        if self._memory is not None:
            return self._memory
        from unity_eq.memory import weight_state_factor

        training = self.model.objective.training
        memory: dict[str, float] = {}
        pieces: dict[str, float] = {}  # weight class -> its bytes on a device, with its state when training
        for cls in self.data.classes.values():
            if cls.sort != "T":
                continue
            out = class_bytes(cls.id, self.data, self.locals)
            for node in cls.nodes:
                if node.op in LEAVES or node.op == "Replicate":
                    memory[node.id] = 0.0
                    continue
                kind = self.kinds.get(node.children[0], "activation") if node.children else "activation"
                if node.op in PARALLEL_OPS:
                    memory[node.id] = 0.0 if kind in WEIGHT_KINDS else out
                    continue
                total = out
                for child in node.children:
                    if self.kinds.get(child) in WEIGHT_KINDS:
                        piece = pieces.get(child)
                        if piece is None:  # a weight is read by many nodes: its bytes are found once
                            factor = 1.0
                            if training and self.kinds.get(child) == "weight":  # a constant has no state
                                factor += weight_state_factor(max(1, itemsize(self.data.classes[child].dtype)))
                            piece = pieces[child] = class_bytes(child, self.data, self.locals) * factor
                        total += piece
                memory[node.id] = total
        self._memory = memory
        return memory

    def relax_layout(self) -> Layout:
        """The e-graph's structure as the differentiable search reads it (relax.layout_of), built at its first
        search and shared by the later ones (every restriction, every memory penalty)."""
        if self._layout is None:
            self._layout = layout_of(self.data)
        return self._layout

    def reprice(self, model: CostModel) -> Extractor:
        """The same e-graph priced by another cost model (e.g. one device, for the baseline)."""
        return Extractor(self.data, self.encoding, self.graph, model, self.activation_inputs)

    def totals(self, restriction: Restriction, penalty: float = 0.0) -> dict[str, float]:
        """Every e-node's cost in seconds as an extraction under ``restriction`` and ``penalty`` sees it."""
        totals: dict[str, float] = {}
        memory = self.node_memory() if penalty > 0 else None
        for cls in self.data.classes.values():
            for node in cls.nodes:
                cost = self.costs[node.id].total
                if not restriction.allows(node, cls, self.kinds):
                    cost = INF
                elif memory is not None:
                    cost += penalty * memory.get(node.id, 0.0)
                totals[node.id] = cost
        return totals

    def choosers(self, method: str, time_limit_s: float) -> list[Chooser]:
        """``greedy``; ``differentiable``: greedy's choice, then the relaxed search from it; ``ilp``: both, then
        the exact program from the cheaper choice, within ``time_limit_s``."""
        relaxed = None
        if ExtractionMethod.checked(method) != ExtractionMethod.GREEDY:
            capacity = min(self.model.machine.usable_memory(d) for d in self.model.mesh.devices)
            relaxed = DifferentiableChooser(memory=self.node_memory(), budget=capacity, layout=self.relax_layout())
        return chooser_chain(method, self.parents, time_limit_s, relaxed)

    def extract_with(
        self, restriction: Restriction, penalty: float, method: ExtractionMethod, time_limit_s: float
    ) -> Extraction:
        """The chain of choosers of ``method`` (:meth:`choosers`) on the e-graph, each from the previous one's
        choice; a chooser that keeps its start keeps its plan."""
        totals = self.totals(restriction, penalty)
        choice: Choice | None = None
        reports = []
        relaxed: list[RelaxReport] = []
        stages: dict[str, Plan] = {}
        plan: Plan | None = None
        for chooser in self.choosers(method, time_limit_s):
            try:
                chosen = chooser.choose(self.data, totals, self.roots, choice)
            except Unreachable as exc:
                builder = PlanBuilder(self.data, {}, self.encoding, self.graph, self.costs)
                raise ExtractionError(builder.no_choice_message(exc.root)) from None
            if plan is None or chosen.choice is not choice:  # a chooser that kept its start keeps its plan
                plan = build_plan(self.data, chosen.choice, self.costs, self.encoding, self.graph, self.model)
            choice = chosen.choice
            reports.extend(chosen.reports)
            relaxed.extend(chosen.relaxed)
            if method != "greedy":
                stages[chooser.name] = plan
        assert plan is not None
        return Extraction(plan, restriction, penalty, reports, relaxed, stages)


def extract_greedy(data: EGraphData, encoding: Encoding, graph: Graph, model: CostModel) -> Plan:
    """Extract the cheapest plan (greedy, DAG-aware) whose outputs are the model's outputs, replicated."""
    return Extractor(data, encoding, graph, model).extract().plan


class Extracts(Protocol):
    """What extracts a plan under a restriction: ``Extractor`` (one e-graph) or ``BlockExtractor`` (pieces)."""

    def extract(self, restriction: Restriction | None = None) -> Extraction: ...


def extract_variants(
    extractor: Extracts, restrictions: Sequence[Restriction], before: Callable[[Restriction], None] | None = None
) -> Iterator[Extraction]:
    """Each restriction's extraction (``before`` hears each one first). One that leaves an output unreachable is
    skipped, except the unrestricted one: every plan must have it."""
    for restriction in restrictions:
        if before is not None:
            before(restriction)
        try:
            yield extractor.extract(restriction)
        except ExtractionError:
            if restriction.name == "greedy":
                raise

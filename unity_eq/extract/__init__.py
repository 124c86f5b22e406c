"""Extraction: choose one e-node per needed e-class, minimizing the plan's cost, and build the Plan.

The extractor reads :class:`~unity_eq.egraph.EGraphData` (the serialized e-graph with shapes and placements)
and prices every e-node with the :class:`~unity_eq.cost.CostModel` on its *local* shapes. It is DAG-aware: a
subterm shared by several consumers is paid once, so the cost of choosing a node is the sum over the set of
distinct e-classes its choice pulls in (the "greedy DAG" extractor of extraction-gym). E-graphs here have
cycles (``x = Partition(Combine(x))``); a choice whose cost set contains its own e-class is a cycle and is
skipped.

==============  ==========================================================================================
module          what it does
==============  ==========================================================================================
pricing         every e-node's cost on its local shapes; source kinds and value names of e-classes
chooser         the ``Chooser`` protocol and its greedy and ILP implementations
greedy          the greedy DAG algorithm, cycle breaking, multi-output adoption
ilp             the exact 0-1 program (HiGHS) with lazily added cycle constraints
differentiable  ``DifferentiableChooser``: a softmax per e-class, annealed gradient descent (torch), rounded
relax           the acyclic cut of the e-graph the differentiable search explores, as index arrays
relaxed_cost    the expected plan's cost, memory excess and gradient; rounded plans' exact prices, batched
build           one function from a choice to a Plan, used by every chooser and by the block DP
baselines       ``Restriction``: which e-nodes the one-device, data- and tensor-parallel baselines may use
extractor       ``Extractor``: one e-graph priced once, extracted under restrictions and memory penalties
==============  ==========================================================================================

The block DP over a split model (``unity_eq.extract.blocks.BlockExtractor``) has the same ``extract``/``reprice``
interface as :class:`Extractor`, and the search uses either.
"""

from __future__ import annotations

from unity_eq.extract.baselines import Restriction, candidate_restrictions
from unity_eq.extract.build import build_plan, output_classes
from unity_eq.extract.chooser import Choice, Chooser, Chosen, ExtractionMethod, GreedyChooser, IlpChooser
from unity_eq.extract.differentiable import DifferentiableChooser, RelaxReport
from unity_eq.extract.extractor import Extraction, Extractor, extract_greedy, extract_variants
from unity_eq.extract.greedy import greedy_dag
from unity_eq.extract.ilp import IlpReport, extract_ilp
from unity_eq.extract.pricing import node_costs

__all__ = [
    "Choice",
    "Chooser",
    "Chosen",
    "DifferentiableChooser",
    "Extraction",
    "ExtractionMethod",
    "Extractor",
    "GreedyChooser",
    "IlpChooser",
    "IlpReport",
    "RelaxReport",
    "Restriction",
    "build_plan",
    "candidate_restrictions",
    "extract_greedy",
    "extract_ilp",
    "extract_variants",
    "greedy_dag",
    "node_costs",
    "output_classes",
]

"""Choosers: the one small interface every extraction algorithm implements.

A chooser picks one e-node per e-class needed by the roots, from the e-nodes' prices (``totals``, seconds;
``inf`` marks a node a restriction forbids). It may start from an earlier chooser's choice: the exact ILP
refines the greedy one. Building the :class:`~unity_eq.plan.Plan` from a choice is one function for all of
them (:func:`unity_eq.extract.build.build_plan`), so a new algorithm is one class here and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from unity_eq.egraph import EGraphData, ENode
from unity_eq.errors import ExtractionError, InternalError, OptionError
from unity_eq.extract.greedy import greedy_dag, parents_of, repair_choice
from unity_eq.extract.ilp import IlpReport, ilp_choice
from unity_eq.extract.pricing import as_costs

__all__ = ["Choice", "Chooser", "Chosen", "GreedyChooser", "IlpChooser", "RelaxReport", "Unreachable"]

#: One chosen e-node per e-class, by e-class id.
Choice = dict[str, ENode]


@dataclass(frozen=True)
class RelaxReport:
    """One differentiable extraction: the start's (greedy's) cost, the best rounded plan's, which was kept."""

    start_objective: float
    objective: float  # the returned choice's (never above start_objective)
    relaxed_best: float  # the best rounded plan's, kept or not (INF when no start rounded to a fitting plan)
    kept: bool  # the rounded plan replaced the start
    starts: int
    steps: int
    seconds: float
    device: str
    classes: int
    nodes: int
    dropped_nodes: int  # finite nodes cut to make the e-graph acyclic

    @property
    def improvement(self) -> float:
        """Relative saving over the start, (start − kept) / start."""
        return (self.start_objective - self.objective) / self.start_objective if self.start_objective > 0 else 0.0


@dataclass(frozen=True)
class Chosen:
    """A chooser's answer: the choice, what an exact chooser proved about it, and what a differentiable one
    found (unity_eq.extract.differentiable)."""

    choice: Choice
    reports: list[IlpReport] = field(default_factory=list)
    relaxed: list[RelaxReport] = field(default_factory=list)


class Unreachable(ExtractionError):
    """No allowed e-node reaches this root: the restriction (or the rules) leave it without a choice."""

    def __init__(self, root: str) -> None:
        super().__init__(f"e-class {root} has no allowed choice")
        self.root = root


class Chooser(Protocol):
    """Picks one e-node per needed e-class of ``data`` for ``roots`` under the prices ``totals``."""

    name: str

    def choose(
        self, data: EGraphData, totals: Mapping[str, float], roots: list[str], start: Choice | None
    ) -> Chosen: ...


@dataclass
class GreedyChooser:
    """DAG-aware greedy (a shared subterm paid once), then cycles broken and multi-output nodes adopted."""

    parents: dict[str, list[ENode]] | None = None
    name: str = "greedy"

    def choose(
        self, data: EGraphData, totals: Mapping[str, float], roots: list[str], start: Choice | None = None
    ) -> Chosen:
        parents = self.parents if self.parents is not None else parents_of(data)
        choice = greedy_dag(data, totals, parents)
        missing = [root for root in roots if root not in choice]
        if missing:
            raise Unreachable(missing[0])
        return Chosen(repair_choice(data, choice, totals, roots))


@dataclass
class IlpChooser:
    """The exact 0-1 program (HiGHS) seeded with ``start`` as its incumbent, within ``time_limit_s``."""

    time_limit_s: float
    name: str = "ilp"

    def choose(self, data: EGraphData, totals: Mapping[str, float], roots: list[str], start: Choice | None) -> Chosen:
        if start is None:
            raise InternalError("the ILP chooser refines a choice: run a greedy chooser before it")
        choice, report = ilp_choice(data, as_costs(totals), roots, start, self.time_limit_s)
        return Chosen(choice, [report])


class ExtractionMethod(StrEnum):
    """``--extractor``: which chain of choosers extracts a plan (:func:`chooser_chain`). A new extractor is a
    member here and its chain there; the option's check and message follow from the members."""

    GREEDY = "greedy"
    DIFFERENTIABLE = "differentiable"
    ILP = "ilp"

    @classmethod
    def parse(cls, text: str) -> ExtractionMethod:
        """The user's ``--extractor`` value; OptionError naming the choices when it is none of them."""
        try:
            return cls(text)
        except ValueError:
            names = [m.value for m in cls]
            choices = ", ".join(names[:-1]) + f" or {names[-1]}"
            raise OptionError(f"`--extractor`: expected {choices}, got {text!r}.") from None

    @classmethod
    def checked(cls, value: str) -> ExtractionMethod:
        """A value our own code passes (already parsed from the user's): another is our bug."""
        try:
            return cls(value)
        except ValueError:
            raise InternalError(f"unknown extraction method {value!r}: parse it with ExtractionMethod.parse") from None


def chooser_chain(
    method: str, parents: dict[str, list[ENode]] | None, time_limit_s: float, relaxed: Chooser | None = None
) -> list[Chooser]:
    """The choosers of ``method`` in order, each refining the previous one's choice: greedy; greedy then the
    relaxed (differentiable) search from it; both, then the exact program from the cheaper choice.
    ``relaxed``: the differentiable chooser with the extractor's memory budget (extract.differentiable; given
    by the caller, which knows the budget); the methods that use it need it."""
    greedy = GreedyChooser(parents)
    method = ExtractionMethod.checked(method)
    if relaxed is None and method != ExtractionMethod.GREEDY:
        raise InternalError(f"extraction method {method.value!r} needs the differentiable chooser")
    match method:
        case ExtractionMethod.GREEDY:
            return [greedy]
        case ExtractionMethod.DIFFERENTIABLE:
            assert relaxed is not None
            return [greedy, relaxed]
        case ExtractionMethod.ILP:
            assert relaxed is not None
            return [greedy, relaxed, IlpChooser(time_limit_s)]

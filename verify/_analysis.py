"""Analysis facts checked against what they mean (issue 21): a ``(rule ...)`` that derives a relation the
guards rely on must derive it only where it holds.

The guards of every rule read relations such as ``can-split``, ``perm-map``, ``bc-dim`` or ``mm-row``; the
verifier evaluates them with the Python mirrors of :mod:`unity_eq.verify._guards` (their meaning), while
the engine evaluates them with whatever ``(rule ...)`` commands derive them. A rule file that adds
``(rule ((= e (Relu x)) (mesh-axis ax n) (dim-range d) ...) ((can-split e d ax)))`` without the
divisibility test, or a wrong ``perm-map``, therefore made every rewrite guarded by them unsound in the
engine while ``verify`` passed. Each such declaration is now checked like a rewrite's bounded proof: over
every case of the ranges where its query holds (the query's root pattern enumerated by the instance
generators, its facts solved by the guard evaluator), each fact of a checked relation it derives must hold
by the mirror. A case where it does not is a counterexample; a query the checker cannot enumerate (several
unrelated tensors) leaves the declaration *unknown*.

How a query becomes cases: ``(= e (Op ...))`` roots it at that pattern; a first fact of a relation that
other declarations derive by matching (``(bcast-operand e x)``) is joined with each of those declarations
(``e`` their pattern, ``x`` their argument), ops that share instances checked once; a query over one tensor
variable ranges over every free tensor; a query without tensors over the mesh and the integers alone.

A placement derived for the query's root op, ``(placed e ax ST)`` with ``(= e (Op ...))``, is checked by what
it means, as a rewrite's pieces are (:func:`verify._semantics.placement_equations`): in every case, for every
placement of the op's operands on the axis that the query allows (a ``placed`` fact fixes an operand's; an
operand the query says nothing of may be ``R``, ``P`` or ``S(d)`` for any dim that splits), the op applied to
its operands' pieces must give pieces consistent with ``ST`` (copies, chunks, or pieces summing to its value),
proven with z3 on symbolic inputs like a bounded case. Deriving ``R`` from operands all ``R`` on that axis is
the verifier's own rule (a regular op applied to copies), not re-checked.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unity_eq.ir import Mesh
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.checks import Checker
from unity_eq.rulefile.env import Env
from unity_eq.rulefile.terms import AnalysisDecl, App, Rule, Term, Var
from unity_eq.verify._analysis_dtype import dtype_claims, dtype_problem
from unity_eq.verify._analysis_query import (
    CHECKED_RELATIONS,
    ENCODER_FACTS,
    CannotEnumerate,
    is_root,
    rooted_cases,
)
from unity_eq.verify._bounded import Case, rule_meshes, solve_equations
from unity_eq.verify._gen import GenConfig, generate_lhs, rank_facts
from unity_eq.verify._guards import DerivedFacts, GuardContext, GuardError, guard_value, solve_guards
from unity_eq.verify._semantics import (
    EvalFailure,
    Placements,
    State,
    VarSpec,
    instantiate,
    list_elements,
    parse_state,
    placement_equations,
    state_str,
)
from unity_eq.verify._tensor import Z3Backend

# How a query becomes cases (and the checked relations) is in _analysis_query.
__all__ = ["CHECKED_RELATIONS", "AnalysisOutcome", "check_analysis_decl", "checked_claims"]


@dataclass
class AnalysisOutcome:
    """The verdict on one declaration: ``proven`` (every case checked holds), ``refuted`` (``case`` and
    ``message`` say where a derived fact is false) or ``unknown`` (``message`` says why)."""

    status: str
    checked: int
    message: str = ""
    case: str = ""
    seconds: float = 0.0


def checked_claims(decl: AnalysisDecl) -> list[App]:
    """The facts of checked relations ``decl`` derives, and the shapes it sets (``(set (shape e) s)``, as the
    fact ``(= (shape e) s)``): the guards read ``(shape t)``, and the engine takes it from whatever declaration
    sets it, so a wrong shape (a Transpose's operand's shape, a mean's kept axis) made rewrites guarded by it
    unsound while ``verify`` passed (issue 21's adversary corpus). A fact only the encoder states
    (``ENCODER_FACTS``) is a claim too, which :func:`check_analysis_decl` refuses outright; so is a dtype it
    sets (``(= (dtype e) t)``), checked against ONNX's types (verify/_analysis_dtype.py)."""
    out = [a for a in decl.actions if isinstance(a, App) and a.head in CHECKED_RELATIONS | ENCODER_FACTS]
    out += [_shape_fact(a) for a in decl.actions if _is_shape_set(a)]
    return out + placement_claims(decl) + dtype_claims(decl)


def placement_claims(decl: AnalysisDecl) -> list[App]:
    """The ``(placed e ax ST)`` facts ``decl`` derives for its query's root op ``(= e (Op ...))``, except
    ``R`` from operands all ``R`` on the same axis (the verifier's own rule: an op applied to copies). The
    engine reads every rewrite's ``placed`` guard, and the one-placement-per-e-class check, from these: a
    wrong one (Relu of a pending sum kept pending) made rewrites guarded by it unsound while ``verify``
    passed (issue 21's adversary corpus). Placements of leaves and parallel ops are their definitions,
    mirrored by :func:`verify._semantics.propagate`."""
    root = _root(decl)
    if root is None:
        return []
    name, pattern = root
    return [
        a
        for a in decl.actions
        if isinstance(a, App)
        and a.head == "placed"
        and len(a.args) == 3
        and a.args[0] == Var(name)
        and not _by_contract(decl, pattern, a)
    ]


def _root(decl: AnalysisDecl) -> tuple[str, App] | None:
    """The query's root ``(= e (Op ...))`` when it is a regular op (the one :func:`rooted_cases` enumerates)."""
    for fact in decl.query:
        if is_root(fact):
            assert isinstance(fact, App)
            name, pattern = fact.args
            assert isinstance(name, Var) and isinstance(pattern, App)
            return (name.name, pattern) if pattern.head in OPS else None
    return None


def _operands(pattern: App) -> list[Term] | None:
    """The tensor operands of a regular op's pattern (list elements flattened); None for a list variable."""
    spec = OPS[pattern.head]
    out: list[Term] = []
    for i in spec.tensor_args:
        if i >= len(pattern.args):
            continue
        arg = pattern.args[i]
        items = list_elements(arg) if spec.args[i].sort == "TList" else [arg]
        if items is None:
            return None
        out.extend(items)
    return out


def _by_contract(decl: AnalysisDecl, pattern: App, claim: App) -> bool:
    """``R`` derived from a query that makes every operand ``R`` on the claim's axis."""
    if claim.args[2] != App("R"):
        return False
    replicated = {
        (f.args[0], f.args[1])
        for f in decl.query
        if isinstance(f, App) and f.head == "placed" and len(f.args) == 3 and f.args[2] == App("R")
    }
    operands = _operands(pattern)
    return operands is not None and all((x, claim.args[1]) in replicated for x in operands)


def _is_dtype_fact(claim: App) -> bool:
    """``(= (dtype x) t)``, a claim of :func:`dtype_claims`."""
    return claim.head == "=" and isinstance(claim.args[0], App) and claim.args[0].head == "dtype"


def _is_shape_set(action: Term) -> bool:
    """``(set (shape x) s)``."""
    return (
        isinstance(action, App)
        and action.head == "set"
        and len(action.args) == 2
        and isinstance(action.args[0], App)
        and action.args[0].head == "shape"
    )


def _shape_fact(action: Term) -> App:
    """``(set (shape x) s)`` as the fact it claims, ``(= (shape x) s)``, checked by the guard evaluator (which
    computes ``(shape x)`` of an op term by the op's shape inference)."""
    assert isinstance(action, App)
    return App("=", action.args)


def check_analysis_decl(
    decl: AnalysisDecl, env: Env, facts: DerivedFacts, sizes: Sequence[int] = (1, 2, 3, 4)
) -> AnalysisOutcome:
    """Every case where ``decl``'s query holds, checked against each checked fact it derives."""
    start = time.perf_counter()
    stated = [a.head for a in decl.actions if isinstance(a, App) and a.head in ENCODER_FACTS]
    if stated:
        return AnalysisOutcome(
            "refuted",
            0,
            f"it derives `{stated[0]}`, a fact only the encoder states (from the model and the mesh); a rule "
            "that derives it can make rewrites guarded by it fire where it does not hold. Remove that action.",
            case="every match of its query",
        )
    wrong_type = dtype_problem(decl)  # structural: no cases (verify/_analysis_dtype.py)
    if wrong_type is not None:
        return AnalysisOutcome(wrong_type.status, 0, wrong_type.message, case="every match of its query")
    claims = [c for c in checked_claims(decl) if not _is_dtype_fact(c)]
    if not claims:  # only dtypes, each given by the op's types
        return AnalysisOutcome("proven", len(dtype_claims(decl)), seconds=time.perf_counter() - start)
    outcome = AnalysisOutcome("proven", 0)
    try:
        for lhs, guards, actions in rooted_cases(decl, claims, facts):
            if _check_one(decl, env, facts, sizes, lhs, guards, actions, outcome):
                break
    except CannotEnumerate as exc:
        outcome = AnalysisOutcome("unknown", outcome.checked, str(exc))
    except GuardError as exc:
        outcome = AnalysisOutcome("unknown", outcome.checked, f"a fact cannot be evaluated: {exc}")
    if outcome.status == "unknown_pending":  # a z3 timeout, and no counterexample
        outcome.status = "unknown"
    if outcome.status == "proven" and not outcome.checked:
        outcome = AnalysisOutcome("unknown", 0, "no case of the ranges satisfies the query")
    outcome.seconds = time.perf_counter() - start
    return outcome


def _check_one(
    decl: AnalysisDecl,
    env: Env,
    facts: DerivedFacts,
    sizes: Sequence[int],
    lhs: Term,
    guards: tuple[Term, ...],
    actions: list[Term],
    outcome: AnalysisOutcome,
) -> bool:
    """Checks one rooted form of the query; True when it found a counterexample (``outcome`` says it)."""
    rule = Checker(env, Rule("analysis", decl.pos, lhs, lhs, guards, decl.ruleset)).check()
    sorts = rule.var_sorts
    cfg = GenConfig()
    placing = any(_is_placement_claim(a, lhs) for a in actions)
    only_placing = all(_is_placement_claim(a, lhs) for a in actions)
    rank = rank_facts(guards, lhs, sorts)
    for mesh in rule_meshes(rule, sizes):
        axes = mesh.axes
        if only_placing and mesh.size == 1:
            continue  # on one device every placement's pieces are the value itself: nothing to check
        if placing and len(axes) != 1:
            raise CannotEnumerate(
                f"a placement derived on a query over {len(axes)} mesh axes is not checked (one axis only)"
            )
        for inst in generate_lhs(lhs, sorts, axes, cfg, rank):
            specs = {v: inst[v] for v, s in sorts.items() if s == "T" and v in inst}
            lists = {v: inst[v] for v, s in sorts.items() if s == "TList" and v in inst}
            attrs = {k: v for k, v in inst.items() if k not in specs and k not in lists}
            elements = _elements(specs, lists)
            layouts = _layouts(elements, guards, axes[0], mesh.sizes[0]) if placing else [{}]
            for placed in layouts:
                ctx = GuardContext(
                    axes,
                    dict(zip(axes, mesh.sizes, strict=True)),
                    sorts,
                    specs,
                    lists,
                    Placements(axes),
                    facts,
                    placed=dict(placed),
                    fixed_placements=placing,
                )
                for solution in solve_guards(guards, attrs, ctx):
                    outcome.checked += 1
                    case = Case(mesh, {**solution, **specs, **lists}, dict(ctx.placed))
                    for action in actions:
                        if _is_placement_claim(action, lhs):
                            assert isinstance(action, App)
                            why = _placement_fails(lhs, action, solution, ctx, mesh, sorts, elements, outcome)
                            if why is None:
                                continue
                            where, message = why
                            outcome.status, outcome.message = "refuted", message
                            outcome.case = f"{case.describe(sorts)}; {where}"
                            return True
                        if not any(True for _ in solve_guards([action], solution, ctx)):
                            outcome.status = "refuted"
                            outcome.case = case.describe(sorts)
                            outcome.message = (
                                f"derives {action} where it does not hold (by its meaning in unity_eq.verify's "
                                "mirror of rules/analysis.egg): a rewrite guarded by it would apply where it is unsound"
                            )
                            return True
    return False


def _is_placement_claim(action: Term, root: Term) -> bool:
    return isinstance(action, App) and action.head == "placed" and action.args[:1] == (root,)


def _elements(specs: dict[str, VarSpec | None], lists: dict[str, list[VarSpec]]) -> dict[str, VarSpec]:
    """The case's tensor variables, list elements named ``l#i`` (as :func:`instantiate` names them)."""
    out = {v: s for v, s in specs.items() if s is not None}
    for v, items in lists.items():
        out.update({f"{v}#{i}": s for i, s in enumerate(items)})
    return out


def _layouts(elements: dict[str, VarSpec], guards: tuple[Term, ...], axis: str, n: int) -> list[dict[Any, State]]:
    """Every placement of the operands on ``axis`` the query may match: a ``placed`` fact with a literal
    state fixes the operand's (the guards then check it); any other operand may be ``R``, ``P`` or ``S(d)``
    for every dim that splits into ``n`` (``D`` has ``R``'s pieces)."""
    fixed: dict[str, set[State]] = {}
    for g in guards:
        if isinstance(g, App) and g.head == "placed" and len(g.args) == 3 and isinstance(g.args[0], Var):
            state = parse_state(g.args[2])
            if state is not None:
                fixed.setdefault(g.args[0].name, set()).add(state)
    choices: list[list[State]] = []
    for name, spec in elements.items():
        if name in fixed:
            choices.append(sorted(fixed[name]))
            continue
        shards = [("S", d) for d, size in enumerate(spec.shape) if size % n == 0]
        choices.append([("R", -1), ("P", -1), *shards])
    return [
        {(name, axis): st for name, st in zip(elements, combo, strict=True)} for combo in itertools.product(*choices)
    ]


def _placement_fails(
    lhs: Term,
    claim: App,
    solution: dict[str, Any],
    ctx: GuardContext,
    mesh: Mesh,
    sorts: dict[str, str],
    elements: dict[str, VarSpec],
    outcome: AnalysisOutcome,
) -> tuple[str, str] | None:
    """(where, why) when the op's pieces under its operands' placements are not what ``claim`` says; None
    when they are (or the case cannot occur). A z3 timeout leaves ``outcome`` unknown."""
    if mesh.size == 1:
        return None  # one piece, the value itself, whatever the placement
    axis = guard_value(claim.args[1], solution, ctx)
    state = guard_value(claim.args[2], solution, ctx)
    if axis not in mesh.axes or not (isinstance(state, tuple) and len(state) == 2):
        raise GuardError(f"{claim}: no axis and placement of this mesh")
    term = instantiate(lhs, {**solution, **ctx.specs, **ctx.lists}, sorts)
    pl = Placements((axis,))
    for name in elements:
        pl.add(Var(name), axis, ctx.placed.get((name, axis), ("R", -1)))
    pl.add(term, axis, state)
    states = [f"{v}: {state_str(next(iter(pl.get(Var(v), axis))))}" for v in elements]
    where = f"placements on {axis}: {', '.join(states)}, {term} (derived): {state_str(state)}"
    sub = Mesh((axis,), (mesh.sizes[mesh.axes.index(axis)],))
    try:
        got = placement_equations(term, sub, pl, elements, Z3Backend())
    except EvalFailure as exc:
        return where, f"derives {claim} where it does not hold: {exc.message}"
    if got is None:
        return None
    equations, values = got
    result = solve_equations(equations, values, where, 2000)
    if result.status == "unknown" and outcome.status == "proven":
        outcome.status, outcome.message = "unknown_pending", result.reason
    if result.status != "refuted" or result.counterexample is None:
        return None
    cex = result.counterexample
    inputs = "; ".join(f"{k} = {v}" for k, v in cex.inputs.items())
    return where, (
        f"derives {claim} where it does not hold: {cex.message} (inputs: {inputs}; got {cex.got}, want {cex.want})"
        + (f"; functions: {cex.functions}" if cex.functions else "")
    )

"""Shape-generic proofs, TASO's way: tensors are values of an uninterpreted sort, operators uninterpreted
functions, and a small set of operator axioms (first-order, with E-matching patterns) says how they commute
with slicing. A rule proven here holds for every shape, every axis size and every value of its attributes.

The vocabulary (all uninterpreted): ``chunk(x, d, i, n)`` is piece ``i`` of ``n`` along dim ``d``;
``part(x, i, n)`` a piece of a pending sum; ``IsPartial(p, x, i, n)`` says the pieces ``p`` (as ``i`` ranges
over the axis) sum to ``x``; ``Div(x, d, n)`` says dim ``d`` of ``x`` splits into ``n``; ``shape``, ``vget``,
``vlen`` read shapes; one function per operator (elementwise ops are ``ew1/ew2/ew3`` of a function symbol, so
one axiom covers all of them); one predicate per guard relation (``BcDim``, ``MmRow``, ``ReshapeMap``…).

A rule is proven generically when, for every way its axis variables can coincide:

1. placements are consistent (one per term and axis), as in the bounded proof;
2. every Partition in the right-hand side slices an R (or D) value along a dim that provably splits, and no
   other axis shards that dim (nor the dim of a Combine);
3. every operator in the right-hand side maps pieces consistent with its operands' placements to pieces
   consistent with its own (``op(chunk(a, da, i, n), b) = chunk(op(a, b), d, i, n)``, or ``IsPartial`` for a
   pending sum): z3 proves it from the axioms and the guards' facts;
4. the two sides' global values are equal (z3, with algebraic axioms: MatMul associativity and
   distributivity, Add/Mul commutativity, Concat/Split identities);
5. every variable gets its gradient in the same placement from both sides (training: a Replicate is the
   gradient all-reduce; :func:`unity_eq.verify._semantics.gradient_problem`).

The encoding is checked so that no proof is vacuous: axis guards (``=``/``!=`` of axes) are decided by the
assignment being proven, never passed to z3; every other guard must become a z3 formula, or the rule is
*unsupported* here; and the premises (the guards' facts, and with the axioms) must be shown satisfiable, by
z3 or by a bounded case that satisfies the guards, or the proof is *vacuous* and does not count.

Parallel ops need no axioms: Partition, Combine, Reduce and Replicate are typed by placements (a Combine of
an S(d) value is its gathered value, and so on); the axioms cover regular operators only. Each axiom is an
identity that the bounded prover checks on the shipped rules that use it. Anything not covered leaves the
rule to the bounded proof.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Lit, Rule, Term, Var, walk
from unity_eq.verify._bounded import rule_axes, unsupported_constructors
from unity_eq.verify._generic_rule import GenericRule, Infeasible, Unproven, Unsupported, Vacuous, axis_classes
from unity_eq.verify._guards import DerivedFacts, unsupported_relations
from unity_eq.verify._semantics import (
    LISTS,
    Placements,
    gradient_problem,
    propagate,
    state_str,
    tensor_nodes,
)

__all__ = ["GenericResult", "prove_generic"]


@dataclass
class GenericResult:
    """``status``: ``proven``; ``unsupported`` (a guard, constructor or placement the encoding cannot state
    faithfully: no generic proof is attempted); ``unproven`` (z3 did not prove a goal from the axioms); or
    ``vacuous`` (the premises, guards and axioms together, are not shown satisfiable: a proof from them would
    prove anything, so it does not count). ``assignments``: the ways the axis variables can coincide that were
    proven, each from premises z3 showed satisfiable."""

    proven: bool
    reason: str = ""
    goals: int = 0
    seconds: float = 0.0
    status: str = "unproven"
    assignments: int = 0
    premises: str = ""  # how the premises were shown satisfiable: "z3" or "bounded case"


def prove_generic(
    rule: Rule, facts: DerivedFacts, timeout_ms: int = 1000, witnessed: bool = False, integer: bool = False
) -> GenericResult:
    """Try a shape-generic proof (see the module docstring). Never raises for unsupported rules.

    Premises must be satisfiable, or the proof is vacuous: for every assignment of axis variables the
    guards' facts alone must be satisfiable (quantifier-free: z3 decides it quickly), and the guards' facts
    together with the axioms too. ``witnessed`` says a bounded case satisfies the guards: the axioms hold for
    real tensors (each is an identity of the tensor semantics), so that case is a model of the premises and
    z3 need not find one (with quantified axioms it rarely can within the time limit). ``integer``: prove it
    for integer tensors: the axioms that hold on the reals only (group names ending in ``.reals``: the mean of
    equal groups' means is the mean) are left out; elementwise ops are uninterpreted functions here, so
    integer division is covered."""
    start = time.perf_counter()
    result = GenericResult(False)
    if unsupported_relations(rule.guards, facts) or unsupported_constructors(rule):
        result.status, result.reason = "unsupported", "unsupported: a guard relation or constructor has no axiom"
        result.seconds = time.perf_counter() - start
        return result
    axis_vars, literals = rule_axes(rule)
    try:
        for assignment in axis_classes(rule, axis_vars, literals):
            try:
                _prove_one(rule, assignment, facts, timeout_ms, result, witnessed, integer)
            except Infeasible:
                continue  # an axis guard excludes this way of naming axes: no such case
            result.assignments += 1
        if result.assignments == 0:
            raise Vacuous("no assignment of the axis variables satisfies the axis guards")
        result.proven, result.status = True, "proven"
        result.premises = "bounded case" if witnessed else "z3"
    except Unsupported as exc:
        result.status, result.reason = "unsupported", f"unsupported: {exc}"
    except Unproven as exc:
        result.status, result.reason = "unproven", str(exc)
    except Vacuous as exc:
        result.status, result.reason = "vacuous", f"vacuous: {exc}"
    result.seconds = time.perf_counter() - start
    return result


def _prove_one(
    rule: Rule,
    assignment: dict[str, str],
    facts_db: DerivedFacts,
    timeout_ms: int,
    result: GenericResult,
    witnessed: bool,
    integer: bool = False,
) -> None:
    r = GenericRule(rule, assignment, facts_db)
    z = r.z
    for g in rule.guards:
        r.guard(g)
    axes = r.axes or ("ax0",)
    if not r.axes:
        r.axes = axes
        r.n["ax0"], r.i["ax0"] = z3.Int("n@ax0"), z3.Int("i@ax0")
    sorts = r.sorts

    def is_tensor(t: Term) -> bool:
        return isinstance(t, Var) and sorts.get(t.name) == "T"

    def dim_of(t: Term) -> str:
        return r.dim_key(t)

    def axis_of(t: Term) -> str:
        return r.axis(t)

    lhs, rhs = rule.lhs, rule.rhs
    pl = Placements(axes)
    for (var, ax), (kind, key) in r.placed.items():
        pl.add(Var(var), ax, (kind, key if kind == "S" else -1))
    propagate(pl, [lhs], dim_of, axis_of, is_tensor)
    tensor_vars = [v for v, s in sorts.items() if s == "T"]
    for v in tensor_vars:
        for ax in axes:
            if not pl.get(Var(v), ax):
                pl.add(Var(v), ax, ("R", -1))
    propagate(pl, [lhs], dim_of, axis_of, is_tensor)
    lhs_nodes = tensor_nodes(lhs, is_tensor)
    if any(len(pl.get(t, ax)) > 1 for t in lhs_nodes for ax in axes):
        raise Unsupported("the left-hand side has conflicting placements")
    roots = _root_pairs(lhs, rhs)
    for _ in range(3):
        for left, right in roots:
            for ax in axes:
                for st in list(pl.get(left, ax)):
                    pl.add(right, ax, st)
                for st in list(pl.get(right, ax)):
                    pl.add(left, ax, st)
        propagate(pl, [lhs, rhs], dim_of, axis_of, is_tensor)
    rhs_nodes = tensor_nodes(rhs, is_tensor)
    check_nodes = [*rhs_nodes, *(Var(v) for v in tensor_vars), *(left for left, _ in roots)]
    for t in check_nodes:
        for ax in axes:
            got = pl.get(t, ax)
            if len(got) != 1:
                states = " and ".join(state_str(s) for s in sorted(got, key=str)) or "no state"
                raise Unsupported(f"{t} has {states} on axis {ax}")

    # training: every variable gets its gradient in one placement from both sides (Replicate = all-reduce)
    problem = gradient_problem(lhs, rhs, pl, dim_of, axis_of, is_tensor)
    if problem:
        raise Unsupported(problem)

    def state(t: Term, ax: str) -> tuple[str, Any]:
        got = pl.get(t, ax)
        if not got:  # a subterm with no derived placement: no generic proof (the bounded one decides)
            raise Unsupported(f"{t} has no placement on axis {ax}")
        kind, key = next(iter(got))
        return kind, (r.dims[key] if kind == "S" else None)

    # facts the left-hand side implies: its slices split, its sharded variables split
    for t in walk(lhs):
        if isinstance(t, App) and t.head == "Partition":
            r.facts.append(z.div(r.value(t.args[0]), r.value(t.args[1]), r.n[r.axis(t.args[2])]))
        elif isinstance(t, App) and t.head == "PList":
            r.facts.append(z.list_div(r.value(t.args[0]), r.value(t.args[1]), r.n[r.axis(t.args[2])]))
    for v in tensor_vars:
        for ax in axes:
            kind, dim = state(Var(v), ax)
            if kind == "S":
                r.facts.append(z.div(r.var(v), dim, r.n[ax]))

    def expected(t: Term, value: Any) -> Any:
        out = value
        for ax in axes:
            kind, dim = state(t, ax)
            if kind == "S":
                out = z.chunk(out, dim, r.i[ax], r.n[ax])
        return out

    def piece(t: Term) -> Any:
        """The device's piece of an operand, from its placement (pieces of a P value are a free part)."""
        if isinstance(t, Var) and sorts.get(t.name) != "T":
            return r.value(t)
        if isinstance(t, Lit) or (isinstance(t, App) and t.head in ("vec-of", "vec-empty")):
            return r.value(t)
        if isinstance(t, App) and t.head == "PList":
            ax = r.axis(t.args[2])
            return z.chunkl(piece(t.args[0]), r.value(t.args[1]), r.i[ax], r.n[ax])
        if isinstance(t, App) and t.head in ("TCons", "TNil"):
            return r.value(t) if t.head == "TNil" else z.cons(piece(t.args[0]), piece(t.args[1]))
        if isinstance(t, Var) and sorts.get(t.name) == "TList":
            return r.value(t)
        if isinstance(t, App) and t.head == "NoneT":
            return z.none
        out = expected(t, r.value(t))
        for ax in axes:
            if state(t, ax)[0] == "P":
                out = z.part(out, r.i[ax], r.n[ax])
        return out

    goals: list[tuple[str, Any]] = []
    for t in dict.fromkeys(walk(rhs)):
        if not isinstance(t, App):
            continue
        if t.head == "Partition":
            x, ax = t.args[0], r.axis(t.args[2])
            dim = r.value(t.args[1])
            if state(x, ax)[0] not in ("R", "D"):
                raise Unsupported(f"{t} slices a value that is not replicated")
            xv = r.value(x)
            goals.append((f"{t} splits evenly", z3.Or(xv == z.none, z.div(xv, dim, r.n[ax]))))
            for other in axes:
                if other != ax and state(x, other)[0] == "S":
                    goals.append((f"{t}: no other axis shards dim", state(x, other)[1] != dim))
        elif t.head == "Combine":
            x, ax = t.args[0], r.axis(t.args[2])
            dim = r.value(t.args[1])
            for other in axes:
                if other != ax and state(x, other)[0] == "S":
                    goals.append((f"{t}: no other axis shards dim", state(x, other)[1] != dim))
        elif t.head in OPS:
            goals.append(_op_goal(r, t, state, piece, expected, axes))
    for left, _right in roots:
        if isinstance(left, App) and left.head in OPS:
            goals.append(_op_goal(r, left, state, piece, expected, axes))
    goals.append(("global values", r.value(lhs) == r.value(rhs)))
    for what, goal in [*goals, *(("a premise", f) for f in r.facts)]:
        if not (isinstance(goal, z3.ExprRef) and z3.is_bool(goal)):
            raise Unsupported(f"{what} does not encode as a z3 formula (got {goal!r})")
    ground = z3.Solver()
    ground.set("timeout", timeout_ms)
    ground.add(*r.facts)
    _check_premises(ground, assignment, "the guards")
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    groups = r.groups | {"algebra"}
    groups |= {g + ".reals" for g in groups} if not integer else set()
    for group in sorted(groups):
        for axiom in z.axioms.get(group, []):
            solver.add(axiom)
    solver.add(*r.facts)
    if not witnessed:
        _check_premises(solver, assignment, "the guards and axioms")
    for what, goal in goals:
        if z3.is_true(z3.simplify(goal)):
            result.goals += 1
            continue
        solver.push()
        solver.add(z3.Not(goal))
        answer = solver.check()
        solver.pop()
        if answer != z3.unsat:
            raise Unproven(f"the axioms do not prove {what}")
        result.goals += 1


def _check_premises(solver: z3.Solver, assignment: dict[str, str], what: str) -> None:
    """A proof counts only from premises that z3 shows satisfiable: from contradictory premises every goal
    would follow. ``unknown`` does not count either."""
    answer = solver.check()
    if answer == z3.sat:
        return
    axes = ", ".join(f"{k}={v}" for k, v in sorted(assignment.items())) or "no axes"
    if answer == z3.unsat:
        raise Vacuous(f"{what} contradict each other ({axes}): a proof from them proves anything")
    raise Vacuous(f"z3 cannot show {what} satisfiable ({axes}: {solver.reason_unknown()})")


def _root_pairs(lhs: Term, rhs: Term) -> list[tuple[Term, Term]]:
    """The (left, right) pairs that are one e-class: the two roots, or every root of a multi-pattern rule
    (both sides explicit lists); none for a rewrite of tensor lists (PList), whose elements pair implicitly."""
    if not (isinstance(lhs, App) and lhs.head in LISTS):
        return [(lhs, rhs)]
    left, right = _explicit_list(lhs), _explicit_list(rhs)
    if left is not None and right is not None and len(left) == len(right):
        return list(zip(left, right, strict=True))
    return []


def _explicit_list(term: Term) -> list[Term] | None:
    items: list[Term] = []
    while isinstance(term, App) and term.head == "TCons":
        items.append(term.args[0])
        term = term.args[1]
    return items if isinstance(term, App) and term.head == "TNil" else None


def _op_goal(r: GenericRule, t: App, state: Any, piece: Any, expected: Any, axes: Sequence[str]) -> tuple[str, Any]:
    z = r.z
    partial = [ax for ax in axes if state(t, ax)[0] == "P"]
    sharded = [ax for ax in axes if state(t, ax)[0] == "S"]
    if len(partial) + len(sharded) > 1 and partial:
        raise Unsupported(f"{t} is a pending sum sharded on another axis")
    args = [piece(a) for a in t.args]
    if t.head in ("Reshape", "Expand"):
        if len(sharded) > 1:
            raise Unsupported(f"{t} is sharded on two axes")
        out = r.value(t)
        if sharded:
            ax = sharded[0]
            args[1] = z.lshape(out, state(t, ax)[1], r.n[ax])
        else:
            args[1] = z.shape(out)
    got = r.apply(t.head, args)
    if partial:
        ax = partial[0]
        return f"{t} holds partial sums", z.is_partial(got, expected(t, r.value(t)), r.i[ax], r.n[ax])
    return f"{t} holds its pieces", got == expected(t, r.value(t))

"""Training: the placement of the gradient the backward pass delivers to every term of a rule.

The contract is stated in :mod:`unity_eq.verify._semantics`; a rule that changes these placements changes what
training synchronizes and is refuted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unity_eq.ir import Mesh
from unity_eq.ops.registry import OPS
from unity_eq.rulefile.terms import App, Term, Var
from unity_eq.verify._placement import (
    LEAVES,
    PARALLEL,
    TENSOR_ARGS,
    P,
    Placements,
    R,
    State,
    every_var_is_tensor,
    list_elements,
    lit_axis,
    lit_dim,
)

# ----------------------------------------------------------------------------------------------------------
# Training: the placement of the gradient the backward pass delivers to every term
#
# A rule must keep what training synchronizes, not only the forward values. The backward pass delivers to
# every term a gradient with a placement of its own (DESIGN.md, the parallel ops' backward column):
#
# * the root's gradient is the dual of its forward placement (``R`` -> ``R``, ``S(d)`` -> ``S(d)``, ``D`` ->
#   ``P``: sharded consumers each hold a part, ``P`` -> ``R``: every piece gets the whole gradient);
# * ``Replicate`` all-reduces a ``P`` gradient to ``R`` (the data-parallel gradient all-reduce);
#   ``Partition`` all-gathers an ``S(d)`` gradient to ``R``; ``Combine`` slices an ``R`` gradient to
#   ``S(d)``; ``Reduce`` passes an ``R`` gradient to every partial piece; on their other axes they pass the
#   gradient through;
# * a regular op that is ``R`` on an axis (replicated work) passes its gradient to its operands unchanged
#   (the backward of an op is linear in its gradient); a regular op doing sharded work (``S``, ``P`` or
#   ``D``) whose gradient is the dual of its placement gives an ``S(d)`` operand an ``S(d)`` gradient, a
#   ``P`` operand an ``R`` one, and a replicated (``R`` or ``D``) operand a ``P`` one: each device's part
#   of the operand's gradient is a partial sum, which only a ``Replicate`` above the operand all-reduces;
# * anything else (an all-reduce of a complete gradient, a sum of gradients of two layouts) is ``X``: no
#   valid layout.
#
# A rewrite keeps training's synchronization iff every pattern variable and leaf gets, on every axis, the
# same gradient placement from both sides (where it occurs on both). Dropping a ``Replicate`` under sharded
# work turns an all-reduced ``R`` gradient into an unreduced ``P``: the plan would train on a partial
# gradient, and the rule is refuted.

X: State = ("X", -1)
_DUAL = {"R": R, "D": P, "P": R}


def _dual(state: State) -> State:
    return state if state[0] == "S" else _DUAL.get(state[0], X)


def _grad_str(state: State) -> str:
    if state == R:
        return "R (complete on every device)"
    if state == P:
        return "P (a pending sum: each device holds a part, and no Replicate all-reduces it)"
    if state[0] == "S":
        return f"S({state[1]}) (sharded along dim {state[1]})"
    return "X (no valid layout: an all-reduce of a complete gradient, or parts of two layouts summed)"


def _backward_parallel(head: str, mine: bool, dim: Any, grad: State) -> State:
    """The gradient a parallel op hands its operand, on its own axis (``mine``) or another one."""
    if not mine:
        return grad
    if head == "Replicate":
        return R if grad == P else X
    if head == "Partition":
        return R if grad == ("S", dim) else X
    if head == "Combine":
        return ("S", dim) if grad == R else X
    return R if grad == R else X  # Reduce: every partial piece gets the whole gradient


def _backward_op(node: Term, operand: Term, axis: str, grad: State, pl: Placements) -> State:
    """The gradient a regular op hands one tensor operand on ``axis``."""
    mine, theirs = pl.get(node, axis), pl.get(operand, axis)
    if len(mine) != 1 or len(theirs) != 1:
        return X
    state, operand_state = next(iter(mine)), next(iter(theirs))
    if state == R and operand_state == R:
        return grad  # replicated work: the backward is linear in the gradient
    if grad != _dual(state):
        return X
    if operand_state[0] == "S":
        return operand_state
    return R if operand_state == P else P


def gradient_placements(
    roots: Sequence[Term],
    pl: Placements,
    dim_of: Any = lit_dim,
    axis_of: Any = lit_axis,
    is_tensor_var: Any = every_var_is_tensor,
) -> dict[tuple[Term, str], State]:
    """The gradient placement the backward pass delivers to every tensor term below ``roots`` (see above),
    per axis; a term reached by several consumers sums their gradients (one layout, or ``X``)."""
    pl = Placements(pl.axes, {key: set(states) for key, states in pl.states.items()})
    list_vars = _list_placements(roots, pl, dim_of, axis_of)

    def is_node(v: Var) -> bool:
        return v in list_vars or bool(is_tensor_var(v))

    order: list[Term] = []
    seen: set[Term] = set()
    children: dict[Term, list[Term]] = {}

    def visit(t: Term) -> None:  # post-order: every consumer comes before its operands once reversed
        if t in seen:
            return
        seen.add(t)
        kids = _grad_children(t, is_node)
        children[t] = kids
        for k in kids:
            visit(k)
        order.append(t)

    for root in roots:
        visit(root)
    parts: dict[tuple[Term, str], set[State]] = {}
    for root in roots:
        for axis in pl.axes:
            got = pl.get(root, axis)
            parts.setdefault((root, axis), set()).add(_dual(next(iter(got))) if len(got) == 1 else X)
    out: dict[tuple[Term, str], State] = {}
    for node in reversed(order):
        for axis in pl.axes:
            handed_in = parts.get((node, axis))
            if not handed_in:
                continue
            grad = next(iter(handed_in)) if len(handed_in) == 1 else X
            out[(node, axis)] = grad
            for kid in children[node]:
                if isinstance(node, App) and node.head == "TCons":
                    handed = grad  # a list's gradient is its elements' gradients
                elif isinstance(node, App) and node.head == "PList":
                    mine = axis_of(node.args[2]) == axis
                    handed = _backward_parallel("Partition", mine, dim_of(node.args[1]) if mine else None, grad)
                elif isinstance(node, App) and node.head in PARALLEL:
                    mine = axis_of(node.args[-1]) == axis
                    dim = dim_of(node.args[1]) if node.head in ("Partition", "Combine") and mine else None
                    handed = _backward_parallel(node.head, mine, dim, grad)
                else:
                    handed = _backward_op(node, kid, axis, grad, pl)
                parts.setdefault((kid, axis), set()).add(handed)
    return out


def _grad_children(term: Term, is_node: Any) -> list[Term]:
    """The operands a term's backward pass hands gradients to: tensors, explicit lists flattened; a list
    that is not explicit (a list variable, ``PList``, a ``TCons`` ending in one) is one node whose elements
    all get its gradient placement (bounded cases have none: lists are expanded there)."""
    if not isinstance(term, App):
        return []
    kids: list[Term] = []
    if term.head in PARALLEL or term.head == "PList":
        kids = [term.args[0]]
    elif term.head == "TCons":
        kids = list(term.args)
    elif term.head in OPS:
        spec = OPS[term.head]
        for i in TENSOR_ARGS[term.head]:
            if i >= len(term.args):
                continue
            arg = term.args[i]
            items = list_elements(arg) if spec.args[i].sort == "TList" else [arg]
            kids.extend(items if items is not None else [arg])
    return [
        k
        for k in kids
        if (isinstance(k, Var) and is_node(k)) or (isinstance(k, App) and k.head not in ("NoneT", "TNil"))
    ]


def _list_placements(terms: Sequence[Term], pl: Placements, dim_of: Any, axis_of: Any) -> set[Term]:
    """Give the list nodes of ``terms`` that are not explicit lists a placement (the one all their elements
    share): a list variable's elements are ``R`` unless ``pl`` says otherwise, ``PList(l, d, ax)`` is
    ``S(d)`` on ``ax``, ``TCons(x, r)`` what ``x`` and ``r`` share. Returns the list variables seen."""
    list_vars: set[Term] = set()

    def visit(t: Term, in_list: bool) -> None:
        if isinstance(t, Var):
            if in_list:
                list_vars.add(t)
                for axis in pl.axes:
                    if not pl.get(t, axis):
                        pl.add(t, axis, R)
            return
        if not isinstance(t, App):
            return
        spec = OPS.get(t.head)
        for i, arg in enumerate(t.args):
            listy = (t.head, i) in (("PList", 0), ("TCons", 1)) or (
                spec is not None and i < len(spec.args) and spec.args[i].sort == "TList"
            )
            visit(arg, listy)
        if t.head == "PList":
            axis = axis_of(t.args[2])
            for other in pl.axes:
                st = ("S", dim_of(t.args[1])) if other == axis else _shared(pl.get(t.args[0], other))
                if st is not None and not pl.get(t, other):
                    pl.add(t, other, st)
        elif t.head == "TCons":
            for other in pl.axes:
                tail = t.args[1]
                states = pl.get(t.args[0], other) | (
                    set() if isinstance(tail, App) and tail.head == "TNil" else pl.get(tail, other)
                )
                st = _shared(states)
                if st is not None and not pl.get(t, other):
                    pl.add(t, other, st)

    for term in terms:
        visit(term, isinstance(term, Var))
    return list_vars


def _shared(states: set[State]) -> State | None:
    return next(iter(states)) if len(states) == 1 else (X if states else None)


def gradient_problem(
    lhs: Term,
    rhs: Term,
    pl: Placements,
    dim_of: Any = lit_dim,
    axis_of: Any = lit_axis,
    is_tensor_var: Any = every_var_is_tensor,
    mesh: Mesh | None = None,
) -> str | None:
    """Why the rule changes what training synchronizes (a variable or leaf gets its gradient in another
    placement on one side than on the other), or None. With a concrete ``mesh``, axes of size 1 are left
    out: their all-reduce is the identity."""
    lhs_items, rhs_items = list_elements(lhs), list_elements(rhs)
    left_roots = lhs_items if lhs_items is not None and rhs_items is not None else [lhs]
    right_roots = rhs_items if lhs_items is not None and rhs_items is not None else [rhs]
    left = gradient_placements(left_roots, pl, dim_of, axis_of, is_tensor_var)
    right = gradient_placements(right_roots, pl, dim_of, axis_of, is_tensor_var)
    trivial = {a for a, n in zip(mesh.axes, mesh.sizes, strict=True) if n == 1} if mesh is not None else set()
    for (term, axis), want in left.items():
        if axis in trivial or not (isinstance(term, Var) or (isinstance(term, App) and term.head in LEAVES)):
            continue
        got = right.get((term, axis))
        if got is None or got == want:
            continue
        return (
            f"gradient of {term} on axis {axis}: in training the left-hand side delivers it as {_grad_str(want)}, "
            f"the right-hand side as {_grad_str(got)}: the rule changes what training synchronizes "
            "(a Replicate's backward is the gradient all-reduce)"
        )
    return None

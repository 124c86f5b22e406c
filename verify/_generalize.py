"""From an equation between two concrete terms to guarded egglog rules (the generator's writer).

An equation found by the enumeration holds at the concrete shapes of the inputs; a rule must hold wherever its
guards let egglog apply it. A :class:`Draft` turns the concrete left-hand side into a pattern and the
right-hand side into a template, and writes the guards that make the rule apply only where it can hold:

* inputs become pattern variables (``a``, ``b``… in order of appearance), the mesh axis the variable ``ax``;
* shape-valued attributes of the left-hand side become variables (``Split`` sizes ``s1``…, ``Reshape`` targets
  ``sh1``…); on the right-hand side they are those variables, or are computed from the left-hand side's
  shapes: a ``Split`` at a concatenation's boundary gets ``(vec-of n1 n2)`` with ``(= n1 (vec-get (shape a)
  1))``, a ``Reshape`` the shape of the left-hand side term it equals, ``(= sh (shape ...))``;
* every ``Partition`` of the right-hand side gets ``(can-split u d ax)`` on its operand (which must be bound by
  the left-hand side), every ``Replicate`` ``(placed u ax (R))``, and a sharded or partial input whose
  placement the left-hand side does not pin gets ``(placed u ax (S d))`` / ``(placed u ax (P))``;
* optionally (``level``): 1 adds the rank of every input, ``(= (vec-length (shape a)) 2)``; 2 adds the
  equalities between dims that hold in the concrete case but not by the left-hand side's typing;
* ``mode``: ``dims`` makes the one dim every ``Partition``/``Combine`` of the rule uses the variable ``d``
  (bound by the pattern or by ``can-split``, different from every Split/Concat axis of the rule); ``indices``
  also makes the left-hand side's Split indices variables, and ``general`` its Split and Concat axes too.

The generator tries the most general draft first and keeps the first one the prover accepts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from unity_eq.rulefile.terms import App, Term
from unity_eq.verify._draft_writer import DraftWriter, Reject, render_term, subterms
from unity_eq.verify._enumerate import Evaluator, InputSpec, is_variant

__all__ = ["Draft", "RuleCandidate", "draft", "render_term"]


@dataclass
class Draft:
    """One egglog rule for a candidate, at one level of generality."""

    text: str  # the rule, with the placeholder NAME for its name
    key: str  # ``text`` without the name: equal keys are renamings of one rule
    ruleset: str
    level: int
    mode: str  # general | dims | literal

    def with_name(self, name: str) -> str:
        return self.text.replace('"NAME"', f'"{name}"')


@dataclass
class RuleCandidate:
    """A directed equation: concrete left-hand side roots → right-hand side roots."""

    lhs: tuple[Term, ...]
    rhs: tuple[Term, ...]
    kind: str  # algebra | strategy | redistribution | multi
    size: int  # operators of both sides' DAGs
    drafts: list[Draft] = field(default_factory=list)
    lhs_size: int = 0
    rhs_size: int = 0

    @property
    def growing(self) -> bool:
        """More operators on the right (or the left-hand side inside the right): an expansion."""
        inside = any(t == root for root in self.lhs for r in self.rhs for t in subterms(r))
        return self.rhs_size > self.lhs_size or inside

    @property
    def ops(self) -> list[str]:
        found: dict[str, None] = {}
        for root in (*self.lhs, *self.rhs):
            for t in subterms(root):
                if isinstance(t, App) and t.head[:1].isupper() and t.head not in ("TCons", "TNil", "NoneT"):
                    found.setdefault(t.head, None)
        return list(found)


def _parallel_dims(roots: Sequence[Term]) -> set[int]:
    out = set()
    for root in roots:
        for t in subterms(root):
            if isinstance(t, App) and t.head in ("Partition", "Combine"):
                out.add(int(t.args[1].value))
    return out


def _axis_literals(roots: Sequence[Term]) -> set[int]:
    out = set()
    for root in roots:
        for t in subterms(root):
            if isinstance(t, App) and t.head == "Split":
                out.add(int(t.args[2].value))
            elif isinstance(t, App) and t.head == "Concat":
                out.add(int(t.args[1].value))
    return out


#: the drafts tried for every candidate, most general first: (mode, level)
ATTEMPTS = (
    ("general", 0),
    ("indices", 0),
    ("indices", 1),
    ("dims", 0),
    ("literal", 0),
    ("literal", 1),
    ("literal", 2),
)


def draft(
    lhs: Sequence[Term],
    rhs: Sequence[Term],
    ev: Evaluator,
    inputs: dict[str, InputSpec],
    level: int,
    mode: str,
) -> Draft | None:
    """Write the rule ``lhs → rhs`` (one or two roots) at a level of generality, or None when it cannot be
    written (see the module docstring). ``mode``: ``general`` (the parallel dim, Split/Concat axes and Split
    indices become variables), ``dims`` (only the parallel dim) or ``literal``."""
    dims = _parallel_dims([*lhs, *rhs])
    dim_var = mode in ("general", "indices", "dims") and len(dims) == 1
    if mode == "dims" and not dim_var:
        return None
    w = DraftWriter(lhs, rhs, ev, inputs, level, next(iter(dims)) if dim_var else None, mode)
    try:
        lhs_text = [w.pattern(root) for root in lhs]
        w.placement_guards()
        if level >= 1:
            w.rank_guards()
        if level >= 2:
            w.dim_equality_guards()
        rhs_text = [w.template(root) for root in rhs]
        if len(lhs) > 1:
            w.merge_order_guards()
    except Reject:
        return None
    if dim_var:
        if not w.d_bound:
            return None
        for axis in sorted(_axis_literals([*lhs, *rhs])):
            w.guard(f"(!= d {w.axis_vars.get(axis, axis)})")
    if (mode == "general" and not w.axis_vars) or (mode == "indices" and not w.index_vars):
        return None  # nothing more general than the next draft
    parallel = w.has_axis
    ruleset = "parallel" if parallel else "algebra"
    guards = " ".join(w.guards)
    if len(lhs) == 1:
        when = f"\n         :when ({guards})" if guards else ""
        text = f'(rewrite {lhs_text[0]}\n         {rhs_text[0]}{when}\n         :ruleset {ruleset} :name "NAME")'
    else:
        query = " ".join(f"(= r{i} {t})" for i, t in enumerate(lhs_text))
        actions = "\n       ".join(f"(union r{i} {t})" for i, t in enumerate(rhs_text))
        when = " " + guards if guards else ""
        text = f'(rule ({query}{when})\n      ({actions})\n      :ruleset {ruleset} :name "NAME")'
    key = re.sub(r"\s+", " ", text)
    return Draft(text, key, ruleset, level, mode)


def rule_name(candidate: RuleCandidate, key: str) -> str:
    """``gen-<left-hand side ops>-<hash>``: readable and unique."""
    ops = []
    for t in subterms(candidate.lhs[0]):
        if (
            isinstance(t, App)
            and t.head[:1].isupper()
            and t.head not in ("TCons", "TNil", "NoneT")
            and not is_variant(t)
        ):
            ops.append(re.sub(r"(?<!^)(?=[A-Z])", "-", t.head).lower())
    prefix = "gen-" + ("merge-" if len(candidate.lhs) > 1 else "") + "-".join(ops[:3])
    return f"{prefix}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"

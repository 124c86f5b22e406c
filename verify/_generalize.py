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
from typing import Any

from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._enumerate import AXIS, PARALLEL_OPS, Evaluator, InputSpec, is_variant, list_items, tlist
from unity_eq.verify._semantics import lhs_placements

__all__ = ["Draft", "RuleCandidate", "draft", "render_term"]

_TENSOR_NAMES = "abcdefghjkmnopqrtuvwz"


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
        inside = any(t == root for root in self.lhs for r in self.rhs for t in _walk(r))
        return self.rhs_size > self.lhs_size or inside

    @property
    def ops(self) -> list[str]:
        found: dict[str, None] = {}
        for root in (*self.lhs, *self.rhs):
            for t in _walk(root):
                if isinstance(t, App) and t.head[:1].isupper() and t.head not in ("TCons", "TNil", "NoneT"):
                    found.setdefault(t.head, None)
        return list(found)


def _walk(term: Term) -> Any:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from _walk(a)


# ----------------------------------------------------------------------------------------------------------
# Rendering


def render_term(term: Term) -> str:
    if isinstance(term, Var):
        return term.name
    if isinstance(term, Lit):
        if term.sort == "String":
            return '"' + str(term.value) + '"'
        if term.sort == "f64":
            text = repr(float(term.value))
            return text if "." in text or "e" in text else text + ".0"
        if term.sort == "IVec":
            values = tuple(term.value)
            return f"(vec-of {' '.join(map(str, values))})" if values else "(vec-empty)"
        return str(term.value)
    if not term.args:
        return f"({term.head})"
    return f"({term.head} {' '.join(render_term(a) for a in term.args)})"


# ----------------------------------------------------------------------------------------------------------
# Drafting


class _Reject(Exception):
    """This draft cannot be written (a right-hand side term the left-hand side does not bind)."""


class _Writer:
    def __init__(
        self,
        lhs: Sequence[Term],
        rhs: Sequence[Term],
        ev: Evaluator,
        inputs: dict[str, InputSpec],
        level: int,
        dim_var: int | None,
        mode: str = "literal",
    ) -> None:
        self.lhs, self.rhs, self.ev, self.inputs = lhs, rhs, ev, inputs
        self.level = level
        self.dim_var = dim_var
        self.general = mode == "general"  # axes of Split/Concat become variables
        self.indices = mode in ("general", "indices")  # indices of Split become variables
        self.axis_vars: dict[int, str] = {}  # an axis literal of the left-hand side's Split/Concat -> variable
        self.index_vars: dict[tuple[tuple[int, ...], int], str] = {}  # (Split sizes, index) -> variable
        self.ivec_vars: dict[tuple[int, ...], str] = {}  # a literal IVec of the left-hand side -> variable
        self.names: dict[str, str] = {}
        self.guards: list[str] = []
        self.guard_set: set[str] = set()
        self.fresh: dict[str, int] = {}
        self.lhs_sizes: dict[tuple[int, ...], str] = {}
        self.lhs_targets: dict[tuple[int, ...], str] = {}
        self.bound_shapes: dict[str, str] = {}  # pattern text of a term -> var holding its shape
        self.dim_vars: dict[tuple[str, int], str] = {}
        self.lhs_subterms: dict[Term, str] = {}  # concrete lhs subterm -> its pattern text
        self.has_axis = any(isinstance(t, App) and t.head in PARALLEL_OPS for root in (*lhs, *rhs) for t in _walk(root))
        self.d_bound = False

    # --- names
    def var_name(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = (
                _TENSOR_NAMES[len(self.names)] if len(self.names) < len(_TENSOR_NAMES) else f"t{len(self.names)}"
            )
        return self.names[name]

    def new(self, prefix: str) -> str:
        self.fresh[prefix] = self.fresh.get(prefix, 0) + 1
        return f"{prefix}{self.fresh[prefix]}"

    def guard(self, text: str) -> None:
        if text not in self.guard_set:
            self.guard_set.add(text)
            self.guards.append(text)

    # --- patterns
    def pattern(self, term: Term) -> str:
        """The left-hand side pattern of a concrete term (and every subterm's pattern, for the guards)."""
        text = self._pattern(term)
        if isinstance(term, Var) or (isinstance(term, App) and term.head not in ("TCons", "TNil", "NoneT")):
            self.lhs_subterms.setdefault(term, text)
        return text

    def _pattern(self, term: Term) -> str:
        if isinstance(term, Var):
            return self.var_name(term.name)
        if isinstance(term, Lit):
            return self.lit(term)
        head, args = term.head, term.args
        if head == "Split":
            sizes = tuple(args[1].value)
            var = self.lhs_sizes.get(sizes) or self.new("s")
            self.lhs_sizes.setdefault(sizes, var)
            if self.level >= 1:
                self.guard(f"(= (vec-length {var}) {len(sizes)})")
            axis, index = self.lhs_axis(args[2]), self.lit(args[3])
            if self.indices:
                key = (sizes, int(args[3].value))
                index = self.index_vars.get(key) or self.new("i")
                self.index_vars.setdefault(key, index)
            return f"(Split {self.pattern(args[0])} {var} {axis} {index})"
        if head == "Concat":
            return f"(Concat {self.pattern(args[0])} {self.lhs_axis(args[1])})"
        if head == "Transpose":
            perm = tuple(args[1].value)
            var = self.ivec_vars.get(perm) or self.new("p")
            if perm not in self.ivec_vars:
                self.ivec_vars[perm] = var
                self.guard(f"(= {var} {render_term(args[1])})")
            return f"(Transpose {self.pattern(args[0])} {var})"
        if head == "Reshape":
            target = tuple(args[1].value)
            var = self.lhs_targets.get(target) or self.new("sh")
            self.lhs_targets.setdefault(target, var)
            return f"(Reshape {self.pattern(args[0])} {var} {self.lit(args[2])})"
        if head in ("Partition", "Combine"):
            dim = self.dim(args[1])
            if dim == "d":
                self.d_bound = True
            return f"({head} {self.pattern(args[0])} {dim} {self.lit(args[2])})"
        if not args:
            return f"({head})"
        return f"({head} {' '.join(self.pattern(a) for a in args)})"

    def lhs_axis(self, term: Term) -> str:
        if not self.general:
            return self.lit(term)
        value = int(term.value)
        if value not in self.axis_vars:
            self.axis_vars[value] = self.new("k")
        return self.axis_vars[value]

    def rhs_axis(self, term: Term) -> str:
        value = int(term.value)
        return self.axis_vars.get(value, str(value))

    def lit(self, term: Term) -> str:
        if isinstance(term, Lit) and term.sort == "String" and term.value == AXIS:
            return "ax"
        return render_term(term)

    def dim(self, term: Term) -> str:
        value = int(term.value)
        return "d" if self.dim_var is not None and value == self.dim_var else str(value)

    # --- the right-hand side
    def template(self, term: Term) -> str:
        if term in self.lhs_subterms and not isinstance(term, Lit):
            return self.lhs_subterms[term]
        if isinstance(term, Var):
            if term.name not in self.names:
                raise _Reject(f"right-hand side input {term.name} is not bound by the left-hand side")
            return self.names[term.name]
        if isinstance(term, Lit):
            return self.lit(term)
        head, args = term.head, term.args
        if head == "Split":
            sizes = tuple(args[1].value)
            index = self.index_vars.get((sizes, int(args[3].value)), self.lit(args[3]))
            return f"(Split {self.template(args[0])} {self.sizes(args[1])} {self.rhs_axis(args[2])} {index})"
        if head == "Concat":
            return f"(Concat {self.template(args[0])} {self.rhs_axis(args[1])})"
        if head == "Transpose":
            perm = tuple(args[1].value)
            return f"(Transpose {self.template(args[0])} {self.ivec_vars.get(perm, render_term(args[1]))})"
        if head == "Reshape":
            return f"(Reshape {self.template(args[0])} {self.target(term)} {self.lit(args[2])})"
        if head == "Partition":
            operand = args[0]
            dim = self.dim(args[1])
            for part in self.parallel_operands(operand, "Partition"):
                self.guard(f"(can-split {part} {dim} ax)")
            if dim == "d":
                self.d_bound = True
            return f"(Partition {self.template(operand)} {dim} ax)"
        if head == "Replicate":
            operand = args[0]
            for part in self.parallel_operands(operand, "Replicate"):
                self.guard(f"(placed {part} ax (R))")
            return f"(Replicate {self.template(operand)} ax)"
        if head == "Combine":
            return f"(Combine {self.template(args[0])} {self.dim(args[1])} ax)"
        if not args:
            return f"({head})"
        return f"({head} {' '.join(self.template(a) for a in args)})"

    def parallel_operands(self, operand: Term, op: str) -> list[str]:
        """The left-hand side terms a right-hand side parallel op's guards are about: its operand, or the
        items of a Concat of bound terms (the merged weights of a merge's parallel forms: every item
        replicated, or split along the dim, makes the Concat so). A guard cannot name a term the rule
        creates, since egglog matches only what the e-graph holds."""
        if operand in self.lhs_subterms:
            return [self.lhs_subterms[operand]]
        if isinstance(operand, App) and operand.head == "Concat":
            items = list_items(operand.args[0])
            if items and all(item in self.lhs_subterms for item in items):
                return [self.lhs_subterms[item] for item in items]
        raise _Reject(f"right-hand side {op} of {operand}, which the left-hand side does not bind")

    def dim_source(self, value: int) -> str:
        """A variable bound to a dim of a left-hand side term that has this size (inputs first)."""
        for term, text in sorted(self.lhs_subterms.items(), key=lambda kv: (not isinstance(kv[0], Var), len(kv[1]))):
            info = self.ev.info(term)
            if info is None:
                continue
            for k, n in enumerate(info.shape):
                if n == value:
                    key = (text, k)
                    if key not in self.dim_vars:
                        var = self.new("n")
                        self.dim_vars[key] = var
                        self.guard(f"(= {var} (vec-get (shape {text}) {k}))")
                    return self.dim_vars[key]
        raise _Reject(f"no left-hand side dim of size {value}")

    def sizes(self, lit: Term) -> str:
        sizes = tuple(lit.value)
        if sizes in self.lhs_sizes:
            return self.lhs_sizes[sizes]
        return f"(vec-of {' '.join(self.dim_source(n) for n in sizes)})"

    def target(self, term: App) -> str:
        target = tuple(term.args[1].value)
        if target in self.lhs_targets:
            return self.lhs_targets[target]
        for sub, text in sorted(self.lhs_subterms.items(), key=lambda kv: len(kv[1])):
            info = self.ev.info(sub)
            if info is not None and info.shape == target and isinstance(sub, App):
                if text not in self.bound_shapes:
                    var = self.new("sh")
                    self.bound_shapes[text] = var
                    self.guard(f"(= {var} (shape {text}))")
                return self.bound_shapes[text]
        return f"(vec-of {' '.join(self.dim_source(n) for n in target)})"

    # --- guards on the left-hand side
    def placement_guards(self) -> None:
        pl = lhs_placements(tlist(list(self.lhs)), (AXIS,), {}, [], defaults=False)
        for name, var in self.names.items():
            spec = self.inputs[name]
            if spec.kind == "R":
                continue
            if pl.get(Var(name), AXIS) != {spec.state}:
                state = f"(S {self.dim(Lit(spec.dim, 'i64'))})" if spec.kind == "S" else "(P)"
                if "(S d)" in state:
                    self.d_bound = True
                self.guard(f"(placed {var} ax {state})")

    def rank_guards(self) -> None:
        for name, var in self.names.items():
            self.guard(f"(= (vec-length (shape {var})) {len(self.inputs[name].shape)})")

    def merge_order_guards(self) -> None:
        """A multi-output rule concatenates its operands; it applies only to model-weight spans in initializer
        order (``merge-operand``, rules/analysis.egg), so its merged MatMul never merges with its own parts
        again and saturation terminates."""
        for root in self.rhs:
            for t in _walk(root):
                if not (isinstance(t, App) and t.head == "Concat"):
                    continue
                items = list_items(t.args[0])
                if len(items) != 2 or not all(isinstance(x, Var) for x in items):
                    continue
                (a, b) = (self.var_name(x.name) for x in items if isinstance(x, Var))
                self.guard(f"(merge-operand {a} {a}-lo {a}-hi)")
                self.guard(f"(merge-operand {b} {b}-lo {b}-hi)")
                self.guard(f"(< {a}-hi {b}-lo)")

    def dim_equality_guards(self) -> None:
        """Equal concrete dims of left-hand side terms that the left-hand side's typing does not equate."""
        uf = _DimClasses()
        for term in self.lhs_subterms:
            _typing(term, self.ev, uf)
        groups: dict[int, list[tuple[Term, int]]] = {}
        for term in sorted(self.lhs_subterms, key=lambda t: (not isinstance(t, Var), len(self.lhs_subterms[t]))):
            info = self.ev.info(term)
            if info is None:
                continue
            for k, n in enumerate(info.shape):
                groups.setdefault(n, []).append((term, k))
        for sizes, var in self.lhs_sizes.items():
            for j, n in enumerate(sizes):
                for term, k in groups.get(n, [])[:1]:
                    self.guard(f"(= (vec-get {var} {j}) (vec-get (shape {self.lhs_subterms[term]}) {k}))")
        for members in groups.values():
            first = members[0]
            for other in members[1:]:
                if uf.find((first[0], first[1])) != uf.find((other[0], other[1])):
                    uf.union((first[0], first[1]), (other[0], other[1]))
                    a, b = self.lhs_subterms[first[0]], self.lhs_subterms[other[0]]
                    self.guard(f"(= (vec-get (shape {a}) {first[1]}) (vec-get (shape {b}) {other[1]}))")


class _DimClasses:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        self.parent[self.find(a)] = self.find(b)


def _typing(term: Term, ev: Evaluator, uf: _DimClasses) -> None:
    """Dim equalities that the op of ``term`` implies between its operands and its output."""
    if not isinstance(term, App):
        return
    info = ev.info(term)
    if info is None:
        return
    head, args = term.head, term.args
    out = info.shape

    def same(a: Term, ka: int, b: Term, kb: int) -> None:
        uf.union((a, ka), (b, kb))

    def shape(t: Term) -> tuple[int, ...]:
        got = ev.info(t)
        return got.shape if got is not None else ()

    if head in PARALLEL_OPS or head == "Relu":
        for k in range(len(out)):
            same(term, k, args[0], k)
    elif head == "Add":
        for operand in args:
            s = shape(operand)
            for k in range(len(s)):
                if s[k] != 1:
                    same(term, len(out) - len(s) + k, operand, k)
    elif head == "MatMul":
        a, b = args
        sa, sb = shape(a), shape(b)
        same(a, len(sa) - 1, b, len(sb) - 2)
        same(term, len(out) - 2, a, len(sa) - 2)
        same(term, len(out) - 1, b, len(sb) - 1)
    elif head == "Gemm":
        a, b = args[0], args[1]
        same(a, 1, b, 0)
        same(term, 0, a, 0)
        same(term, 1, b, 1)
    elif head == "Concat":
        axis = int(args[1].value)
        for item in list_items(args[0]):
            for k in range(len(out)):
                if k != axis:
                    same(term, k, item, k)
    elif head == "Split":
        axis = int(args[2].value)
        for k in range(len(out)):
            if k != axis:
                same(term, k, args[0], k)
    elif head == "Transpose":
        perm = tuple(args[1].value)
        for j, k in enumerate(perm):
            same(term, j, args[0], k)


def _parallel_dims(roots: Sequence[Term]) -> set[int]:
    out = set()
    for root in roots:
        for t in _walk(root):
            if isinstance(t, App) and t.head in ("Partition", "Combine"):
                out.add(int(t.args[1].value))
    return out


def _axis_literals(roots: Sequence[Term]) -> set[int]:
    out = set()
    for root in roots:
        for t in _walk(root):
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
    w = _Writer(lhs, rhs, ev, inputs, level, next(iter(dims)) if dim_var else None, mode)
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
    except _Reject:
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
    for t in _walk(candidate.lhs[0]):
        if (
            isinstance(t, App)
            and t.head[:1].isupper()
            and t.head not in ("TCons", "TNil", "NoneT")
            and not is_variant(t)
        ):
            ops.append(re.sub(r"(?<!^)(?=[A-Z])", "-", t.head).lower())
    prefix = "gen-" + ("merge-" if len(candidate.lhs) > 1 else "") + "-".join(ops[:3])
    return f"{prefix}-{hashlib.sha1(key.encode()).hexdigest()[:6]}"

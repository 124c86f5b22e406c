"""Writing one draft of a rule: the pattern, the template and the guards (see :mod:`unity_eq.verify._generalize`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._dim_typing import DimClasses, dim_typing
from unity_eq.verify._enumerate import AXIS, PARALLEL_OPS, Evaluator, InputSpec, list_items, tlist
from unity_eq.verify._semantics import lhs_placements

_TENSOR_NAMES = "abcdefghjkmnopqrtuvwz"


def subterms(term: Term) -> Any:
    yield term
    if isinstance(term, App):
        for a in term.args:
            yield from subterms(a)


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


class Reject(Exception):
    """This draft cannot be written (a right-hand side term the left-hand side does not bind)."""


class DraftWriter:
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
        self.has_axis = any(
            isinstance(t, App) and t.head in PARALLEL_OPS for root in (*lhs, *rhs) for t in subterms(root)
        )
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
                raise Reject(f"right-hand side input {term.name} is not bound by the left-hand side")
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
        raise Reject(f"right-hand side {op} of {operand}, which the left-hand side does not bind")

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
        raise Reject(f"no left-hand side dim of size {value}")

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
            for t in subterms(root):
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
        uf = DimClasses()
        for term in self.lhs_subterms:
            dim_typing(term, self.ev, uf)
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

"""TASO's pruning, with egglog: a candidate rule is redundant when rules already accepted connect its two sides.

The candidate's concrete left-hand side (the case it was found in: the enumeration's inputs as ``(Tensor k)``
leaves with their shapes, dtypes and placements, one mesh axis of size 2) is added to an e-graph that holds
the schema, the analyses and the accepted rules; the rulesets run a few rounds, and ``(check (= lhs rhs))``
asks whether the right-hand side is now in the left-hand side's e-class. Each candidate runs between
``(push)`` and ``(pop)``, so candidates do not see each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import egglog.bindings as bindings

from unity_eq.rulefile.terms import App, Lit, Term, Var
from unity_eq.verify._enumerate import AXIS, AXIS_SIZE, InputSpec
from unity_eq.verify._generalize import render_term

__all__ = ["Pruner"]

_ANALYSIS = "(run-schedule (saturate (run analysis) (run expand)))"
#: rounds of each ruleset, as the engine runs them (bounded algebra, then parallel), and an e-node bound that
#: keeps a rule set which grows terms forever from taking the generator down
ROUNDS = (("algebra", 3), ("parallel", 6))
MAX_NODES = 5000


class Pruner:
    """An e-graph with the accepted rules, asked whether each new candidate follows from them."""

    def __init__(self, base_texts: Sequence[tuple[str, str]], inputs: Sequence[InputSpec]) -> None:
        self.egraph = bindings.EGraph()
        for text, name in base_texts:
            self._run(text, name)
        self.ids = {spec.name: i for i, spec in enumerate(inputs)}
        self.inputs = {spec.name: spec for spec in inputs}
        self.accepted = 0

    def _run(self, text: str, name: str = "<generator>") -> None:
        self.egraph.run_program(*self.egraph.parse_program(text, filename=name))

    def accept(self, rule_text: str) -> None:
        """Add a proven rule (at the base level: every later candidate sees it)."""
        self._run(rule_text, "<accepted rule>")
        self.accepted += 1

    def term(self, term: Term) -> str:
        if isinstance(term, Var):
            return f"(Tensor {self.ids[term.name]})"
        if isinstance(term, Lit):
            return render_term(term)
        if not term.args:
            return f"({term.head})"
        return f"({term.head} {' '.join(self.term(a) for a in term.args)})"

    def _leaves(self, roots: Sequence[Term]) -> list[str]:
        names: dict[str, None] = {}
        for root in roots:
            stack = [root]
            while stack:
                t = stack.pop()
                if isinstance(t, Var):
                    names.setdefault(t.name, None)
                elif isinstance(t, App):
                    stack.extend(t.args)
        lines = []
        for name in names:
            spec = self.inputs[name]
            leaf = f"(Tensor {self.ids[name]})"
            state = {"R": "(R)", "P": "(P)"}.get(spec.kind, f"(S {spec.dim})")
            lines.append(f"(set (shape {leaf}) (vec-of {' '.join(map(str, spec.shape))}))")
            lines.append(f'(set (dtype {leaf}) "float32")')
            lines.append(f'(placed {leaf} "{AXIS}" {state})')
        return lines

    def _saturate(self) -> None:
        for ruleset, rounds in ROUNDS:
            for _ in range(rounds):
                (out,) = self.egraph.run_program(*self.egraph.parse_program(f"(run-schedule (run {ruleset}))"))
                self._run(_ANALYSIS)
                assert isinstance(out, bindings.RunScheduleOutput)
                if not out.report.updated or self._nodes() > MAX_NODES:
                    break

    def _nodes(self) -> int:
        (out,) = self.egraph.run_program(*self.egraph.parse_program("(print-size)"))
        assert isinstance(out, bindings.PrintAllFunctionsSize)
        return sum(int(n) for name, n in out.sizes if name[:1].isupper())

    def derivable(self, lhs: Sequence[Term], rhs: Sequence[Term]) -> bool:
        """True when the accepted rules rewrite the concrete ``lhs`` roots into e-classes holding ``rhs``."""
        if not self.accepted:
            return False
        lines = ["(push)", f'(mesh-axis "{AXIS}" {AXIS_SIZE})', f'(axes-1 "{AXIS}")']
        lines += [f"(dim-range {d})" for d in range(4)]
        lines += self._leaves([*lhs, *rhs])
        lines += [f"(let $gen_l{i} {self.term(t)})" for i, t in enumerate(lhs)]
        lines.append(_ANALYSIS)
        try:
            self._run("\n".join(lines))
            self._saturate()
            for i, t in enumerate(rhs):
                self._run(f"(check (= $gen_l{i} {self.term(t)}))")
            return True
        except bindings.EggSmolError:
            return False
        finally:
            self._run("(pop)")

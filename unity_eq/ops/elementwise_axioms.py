"""The elementwise family's axioms for the shape-generic prover (verify/_generic.py's vocabulary): its ops
commute with slicing, and Add and Sub map pieces of pending sums to a pending sum. Only the prover calls
:func:`axioms` (through ``ELEMENTWISE.axioms``); the engine never imports z3.
"""

from __future__ import annotations

from typing import Any

__all__ = ["axioms"]


def axioms(v: Any) -> None:
    """Elementwise ops commute with slicing: every split mask, operands broadcast or full (``ew``); pending
    sums are linear: Add and Sub of partial pieces (``linear``)."""
    _axioms_elementwise(v)
    _axioms_linear(v)


def _axioms_elementwise(v: Any) -> None:
    """Elementwise ops commute with slicing: every split mask, operands broadcast or full."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, a, b, c, d, da, db, dc, i, n, f, ch, ew, rel, FA, P = v.symbols("x a b c d da db dc i n f ch ew rel FA P")
    v.add(
        "ew",
        FA(
            [f, x, d, i, n],
            ew[1](f, ch(x, d, i, n)) == ch(ew[1](f, x), d, i, n),
            patterns=[ew[1](f, ch(x, d, i, n))],
        ),
    )
    ops3 = (a, b, c)
    dims3 = (da, db, dc)
    for arity in (2, 3):
        args = ops3[:arity]
        for mask in range(1, 2**arity):
            e_ = ew[arity](f, *args)
            sliced = [ch(args[j], dims3[j], i, n) if mask >> j & 1 else args[j] for j in range(arity)]
            premises = [
                rel["bc-dim"](args[j], e_, d, dims3[j]) if mask >> j & 1 else rel["bc-bcast"](args[j], e_, d)
                for j in range(arity)
            ]
            bound = [f, *args, d, i, n, *[dims3[j] for j in range(arity) if mask >> j & 1]]
            first = next(j for j in range(arity) if mask >> j & 1)
            v.add(
                "ew",
                FA(
                    bound,
                    z3.Implies(z3.And(premises), ew[arity](f, *sliced) == ch(e_, d, i, n)),
                    patterns=[P(ew[arity](f, *sliced), rel["bc-dim"](args[first], e_, d, dims3[first]))],
                ),
            )


def _axioms_linear(v: Any) -> None:
    """Pending sums are linear: Add and Sub of partial pieces."""
    import z3  # the verifier's vocabulary is z3's; the engine never calls this

    x, y, p, q, i, n, ew, FA, P = v.symbols("x y p q i n ew FA P")
    for op in ("Add", "Sub"):
        fo = v.fn(op, ())
        v.add(
            "linear",
            FA(
                [p, q, x, y, i, n],
                z3.Implies(
                    z3.And(v.is_partial(p, x, i, n), v.is_partial(q, y, i, n)),
                    v.is_partial(ew[2](fo, p, q), ew[2](fo, x, y), i, n),
                ),
                patterns=[P(ew[2](fo, p, q), v.is_partial(p, x, i, n), v.is_partial(q, y, i, n))],
            ),
        )
